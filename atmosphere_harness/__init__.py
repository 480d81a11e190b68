"""atmosphere-harness: host deep agents in any FastAPI app.

```python
from fastapi import FastAPI
from atmosphere_harness import agent, prompt, StreamingSession, harness_router

@agent(name="assistant")
class Assistant:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)

app = FastAPI()
app.include_router(harness_router)
```
"""

from typing import TYPE_CHECKING, Any

from ._cache import CacheHint, PromptCache
from ._delegation import DelegationError
from ._errors import HarnessError
from ._events import Event
from ._filesystem import (
    AgentFileSystem,
    CompositeAgentFileSystem,
    FileNotFoundInWorkspace,
    FileSystemError,
    FileSystemLimits,
    WorkspaceAgentFileSystem,
)
from ._governance import (
    Admit,
    Deny,
    GovernancePolicy,
    PolicyContext,
    PolicyRequest,
    Prefer,
    ToolApprovalPolicy,
    Transform,
)
from ._harness import Harness
from ._kernel.session import StreamingSession
from ._mcp.servers import MCPServerHTTP, MCPServerStdio
from ._memory import (
    ConversationMemory,
    InMemoryLongTermMemory,
    LongTermMemory,
    LongTermMemoryInterceptor,
    SqliteLongTermMemory,
)
from ._planning import AgentPlan, PlanStatus, PlanStep, PlanStore, PlanStoreError
from ._registry import agent, ai_endpoint, coordinator, prompt, skill
from ._runtimes.base import (
    AgentRuntime,
    AiCapability,
    Message,
    ModelError,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)
from ._runtimes.scripted import ScriptedRuntime
from ._settings import HarnessSettings
from ._tools.base import Tool, ToolArgumentError, ToolContext, ToolKind, tool
from ._version import __version__
from ._web.admin import get_admin_principal
from ._web.deps import HarnessDep, get_harness, get_user_id
from ._web.files import AgentFileSystemDep, get_file_system
from ._web.memory import LongTermMemoryDep, get_long_term_memory
from ._web.planning import PlanStoreDep, get_plan_store
from ._web.router import create_harness_router, harness_router

if TYPE_CHECKING:
    from ._runtimes.anthropic import AnthropicRuntime
    from ._runtimes.openai import OpenAIRuntime

_PROVIDER_RUNTIMES = {
    "OpenAIRuntime": ("openai", "atmosphere_harness._runtimes.openai"),
    "AnthropicRuntime": ("anthropic", "atmosphere_harness._runtimes.anthropic"),
}


def __getattr__(name: str) -> Any:
    """The provider runtimes load on first use: their SDKs are optional extras."""
    if name not in _PROVIDER_RUNTIMES:
        raise AttributeError(f"module 'atmosphere_harness' has no attribute {name!r}")
    extra, module = _PROVIDER_RUNTIMES[name]
    import importlib

    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != extra:
            raise
        raise ImportError(
            f"{name} needs the {extra} SDK: pip install 'atmosphere-harness[{extra}]'"
        ) from exc
    return getattr(loaded, name)


__all__ = [
    "Admit",
    "AgentFileSystem",
    "AgentFileSystemDep",
    "AgentPlan",
    "AgentRuntime",
    "AiCapability",
    "AnthropicRuntime",
    "CacheHint",
    "CompositeAgentFileSystem",
    "ConversationMemory",
    "DelegationError",
    "Deny",
    "Event",
    "FileNotFoundInWorkspace",
    "FileSystemError",
    "FileSystemLimits",
    "GovernancePolicy",
    "Harness",
    "HarnessDep",
    "HarnessError",
    "HarnessSettings",
    "InMemoryLongTermMemory",
    "LongTermMemory",
    "LongTermMemoryDep",
    "LongTermMemoryInterceptor",
    "MCPServerHTTP",
    "MCPServerStdio",
    "Message",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "OpenAIRuntime",
    "PlanStatus",
    "PlanStep",
    "PlanStore",
    "PlanStoreDep",
    "PlanStoreError",
    "PolicyContext",
    "PolicyRequest",
    "Prefer",
    "PromptCache",
    "ScriptedRuntime",
    "SqliteLongTermMemory",
    "StreamingSession",
    "Tool",
    "ToolApprovalPolicy",
    "ToolArgumentError",
    "ToolCall",
    "ToolContext",
    "ToolKind",
    "Transform",
    "Usage",
    "WorkspaceAgentFileSystem",
    "__version__",
    "agent",
    "ai_endpoint",
    "coordinator",
    "create_harness_router",
    "get_admin_principal",
    "get_file_system",
    "get_harness",
    "get_long_term_memory",
    "get_plan_store",
    "get_user_id",
    "harness_router",
    "prompt",
    "skill",
    "tool",
]
