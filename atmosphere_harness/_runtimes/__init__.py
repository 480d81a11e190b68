"""Model runtimes: the `AgentRuntime` protocol and its implementations."""

from .base import (
    AgentRuntime,
    AiCapability,
    ContextWindowRuntime,
    Message,
    ModelError,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)
from .scripted import ScriptedRuntime

__all__ = [
    "AgentRuntime",
    "AiCapability",
    "ContextWindowRuntime",
    "Message",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ScriptedRuntime",
    "ToolCall",
    "ToolSpec",
    "Usage",
]
