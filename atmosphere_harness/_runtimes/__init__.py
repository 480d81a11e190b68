"""Model runtimes: the `AgentRuntime` protocol and its implementations."""

from .._errors import ModelError
from .base import (
    AgentRuntime,
    AiCapability,
    ContextWindowRuntime,
    Message,
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
