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

Importing the package loads only the decorators. Every other name loads its part of the harness
the first time it is used: the web layer (and FastAPI) with `harness_router`,
`create_harness_router` or a `Depends()` provider, a provider SDK with its runtime.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._harness import Harness
from ._registry import agent, ai_endpoint, coordinator, prompt, skill
from ._version import __version__

if TYPE_CHECKING:
    from ._cache import CacheHint, PromptCache
    from ._errors import (
        BackendUnavailable,
        DelegationError,
        FileNotFoundInWorkspace,
        FileSystemError,
        HarnessError,
        ModelError,
        PlanStoreError,
        ToolArgumentError,
        UsageLimitExceeded,
    )
    from ._events import Event
    from ._filesystem import (
        AgentFileSystem,
        CompositeAgentFileSystem,
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
    from ._kernel.session import StreamingSession
    from ._limits import UsageLimits
    from ._mcp.servers import MCPServerHTTP, MCPServerStdio
    from ._memory import (
        ConversationMemory,
        InMemoryLongTermMemory,
        LongTermMemory,
        LongTermMemoryInterceptor,
        SqliteLongTermMemory,
    )
    from ._planning import AgentPlan, PlanStatus, PlanStep, PlanStore
    from ._runtimes.anthropic import AnthropicRuntime
    from ._runtimes.base import (
        AgentRuntime,
        AiCapability,
        Message,
        ModelRequest,
        ModelResponse,
        ToolCall,
        Usage,
    )
    from ._runtimes.fallback import FallbackRuntime
    from ._runtimes.openai import OpenAIRuntime
    from ._runtimes.scripted import ScriptedRuntime
    from ._settings import HarnessSettings
    from ._tools.base import Tool, ToolContext, ToolKind, tool
    from ._web.admin import get_admin_principal
    from ._web.deps import HarnessDep, get_harness, get_user_id
    from ._web.files import AgentFileSystemDep, get_file_system
    from ._web.memory import LongTermMemoryDep, get_long_term_memory
    from ._web.planning import PlanStoreDep, get_plan_store
    from ._web.router import create_harness_router, harness_router

_LAZY: dict[str, str] = {
    "Admit": "._governance",
    "AgentFileSystem": "._filesystem",
    "AgentFileSystemDep": "._web.files",
    "AgentPlan": "._planning",
    "AgentRuntime": "._runtimes.base",
    "AiCapability": "._runtimes.base",
    "AnthropicRuntime": "._runtimes.anthropic",
    "BackendUnavailable": "._errors",
    "CacheHint": "._cache",
    "CompositeAgentFileSystem": "._filesystem",
    "ConversationMemory": "._memory",
    "DelegationError": "._errors",
    "Deny": "._governance",
    "Event": "._events",
    "FileNotFoundInWorkspace": "._errors",
    "FileSystemError": "._errors",
    "FallbackRuntime": "._runtimes.fallback",
    "FileSystemLimits": "._filesystem",
    "GovernancePolicy": "._governance",
    "HarnessDep": "._web.deps",
    "HarnessError": "._errors",
    "HarnessSettings": "._settings",
    "InMemoryLongTermMemory": "._memory",
    "LongTermMemory": "._memory",
    "LongTermMemoryDep": "._web.memory",
    "LongTermMemoryInterceptor": "._memory",
    "MCPServerHTTP": "._mcp.servers",
    "MCPServerStdio": "._mcp.servers",
    "Message": "._runtimes.base",
    "ModelError": "._errors",
    "ModelRequest": "._runtimes.base",
    "ModelResponse": "._runtimes.base",
    "OpenAIRuntime": "._runtimes.openai",
    "PlanStatus": "._planning",
    "PlanStep": "._planning",
    "PlanStore": "._planning",
    "PlanStoreDep": "._web.planning",
    "PlanStoreError": "._errors",
    "PolicyContext": "._governance",
    "PolicyRequest": "._governance",
    "Prefer": "._governance",
    "PromptCache": "._cache",
    "ScriptedRuntime": "._runtimes.scripted",
    "SqliteLongTermMemory": "._memory",
    "StreamingSession": "._kernel.session",
    "Tool": "._tools.base",
    "ToolApprovalPolicy": "._governance",
    "ToolArgumentError": "._errors",
    "ToolCall": "._runtimes.base",
    "ToolContext": "._tools.base",
    "ToolKind": "._tools.base",
    "Transform": "._governance",
    "Usage": "._runtimes.base",
    "UsageLimitExceeded": "._errors",
    "UsageLimits": "._limits",
    "WorkspaceAgentFileSystem": "._filesystem",
    "create_harness_router": "._web.router",
    "get_admin_principal": "._web.admin",
    "get_file_system": "._web.files",
    "get_harness": "._web.deps",
    "get_long_term_memory": "._web.memory",
    "get_plan_store": "._web.planning",
    "get_user_id": "._web.deps",
    "harness_router": "._web.router",
    "tool": "._tools.base",
}
"""Where each name that loads on first use lives, relative to the package (the `TYPE_CHECKING`
imports above say the same to type checkers and editors)."""

_EXTRAS = {"._runtimes.openai": "openai", "._runtimes.anthropic": "anthropic"}
"""The modules that need an optional extra, and the extra (and SDK module) they need."""


def __getattr__(name: str) -> Any:
    """Load `name`'s part of the harness on first use, then keep it as a plain attribute."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'atmosphere_harness' has no attribute {name!r}")
    try:
        loaded = importlib.import_module(module, __name__)
    except ModuleNotFoundError as exc:
        extra = _EXTRAS.get(module)
        if extra is None or exc.name != extra:
            raise
        raise ImportError(
            f"{name} needs the {extra} SDK: pip install 'atmosphere-harness[{extra}]'"
        ) from exc
    value = getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Admit",
    "AgentFileSystem",
    "AgentFileSystemDep",
    "AgentPlan",
    "AgentRuntime",
    "AiCapability",
    "AnthropicRuntime",
    "BackendUnavailable",
    "CacheHint",
    "CompositeAgentFileSystem",
    "ConversationMemory",
    "DelegationError",
    "Deny",
    "Event",
    "FallbackRuntime",
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
    "UsageLimitExceeded",
    "UsageLimits",
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
