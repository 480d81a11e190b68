"""Tools: the record, the decorator, validation and the executor every call goes through."""

from .base import Tool, ToolContext, ToolKind, tool

__all__ = ["Tool", "ToolContext", "ToolKind", "tool"]
