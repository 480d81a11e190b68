"""The virtual-filesystem primitive: a bounded, conversation-scoped workspace and its tools."""

from .base import AgentFileSystem, FileInfo, FileSystemError, FileSystemLimits, GrepHit

__all__ = ["AgentFileSystem", "FileInfo", "FileSystemError", "FileSystemLimits", "GrepHit"]
