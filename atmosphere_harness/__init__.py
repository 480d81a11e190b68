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

from ._version import __version__
from .cache import CacheHint, PromptCache
from .delegation import DelegationError
from .errors import HarnessError
from .events import Event
from .filesystem import (
    AgentFileSystem,
    CompositeAgentFileSystem,
    FileNotFoundInWorkspace,
    FileSystemError,
    FileSystemLimits,
    WorkspaceAgentFileSystem,
)
from .governance import (
    Admit,
    Deny,
    GovernancePolicy,
    PolicyContext,
    PolicyRequest,
    Prefer,
    ToolApprovalPolicy,
    Transform,
)
from .harness import Harness
from .kernel.session import StreamingSession
from .mcp.servers import MCPServerHTTP, MCPServerStdio
from .memory import (
    ConversationMemory,
    InMemoryLongTermMemory,
    LongTermMemory,
    LongTermMemoryInterceptor,
    SqliteLongTermMemory,
)
from .planning import AgentPlan, PlanStatus, PlanStep, PlanStore, PlanStoreError
from .registry import agent, ai_endpoint, coordinator, prompt, skill
from .runtimes.base import (
    AgentRuntime,
    AiCapability,
    Message,
    ModelError,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)
from .runtimes.scripted import ScriptedRuntime
from .settings import HarnessSettings
from .tools.base import Tool, ToolArgumentError, ToolContext, ToolKind, tool
from .web.admin import get_admin_principal
from .web.deps import HarnessDep, get_harness, get_user_id
from .web.files import AgentFileSystemDep, get_file_system
from .web.memory import LongTermMemoryDep, get_long_term_memory
from .web.planning import PlanStoreDep, get_plan_store
from .web.router import create_harness_router, harness_router

if TYPE_CHECKING:
    from .runtimes.anthropic import AnthropicRuntime
    from .runtimes.openai import OpenAIRuntime

_PROVIDER_RUNTIMES = {
    "OpenAIRuntime": ("openai", "atmosphere_harness.runtimes.openai"),
    "AnthropicRuntime": ("anthropic", "atmosphere_harness.runtimes.anthropic"),
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
