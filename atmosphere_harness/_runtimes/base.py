"""What a model runtime receives and returns, and the `AgentRuntime` protocol.

A runtime is deliberately small: one async method that turns a `ModelRequest` into a
`ModelResponse`, streaming text deltas to an optional callback as they arrive. The tool loop,
tool execution, memory and events all live outside it, so a new provider is one adapter.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from .._cache import CacheHint

Role = Literal["system", "user", "assistant", "tool"]
TextSink = Callable[[str], Awaitable[None]]


class AiCapability(enum.Enum):
    """What a runtime can do natively. The attach engines read these to pick a surface."""

    TOOL_CALLING = "tool-calling"
    PARALLEL_TOOL_CALLS = "parallel-tool-calls"
    STREAMING = "streaming"
    SYSTEM_PROMPT = "system-prompt"
    PROMPT_CACHING = "prompt-caching"
    USAGE = "usage"
    PLANNING = "planning"
    VIRTUAL_FILESYSTEM = "virtual-filesystem"


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:16]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool invocation the model asked for."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=new_call_id)


@dataclass(frozen=True, slots=True)
class Message:
    """One entry of the conversation as the model sees it.

    `tool_calls` is set on assistant messages that requested tools; `tool_call_id` and `name` are
    set on the `tool` message that answers one of them.
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    @classmethod
    def user(cls, content: str) -> Message:
        return cls("user", content)

    @classmethod
    def assistant(cls, content: str, tool_calls: Sequence[ToolCall] = ()) -> Message:
        return cls("assistant", content, tuple(tool_calls))

    @classmethod
    def tool(cls, call: ToolCall, content: str) -> Message:
        return cls("tool", content, tool_call_id=call.id, name=call.name)

    @classmethod
    def system(cls, content: str) -> Message:
        return cls("system", content)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as offered to the model: name, description and JSON-schema parameters.

    `native` is a provider-native declaration (e.g. Anthropic's
    `{"type": "memory_20250818", "name": "memory"}`); the runtime that owns it sends it instead
    of the schema, every other runtime ignores the tool's native form.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    native: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything a runtime needs for one model call.

    `system_prompt` is the stable prefix (it must not change from turn to turn, so provider
    prompt caches keep hitting); per-turn context such as recalled facts travels in `context`,
    which runtimes place after the stable prefix.
    """

    system_prompt: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    conversation_id: str = ""
    context: tuple[str, ...] = ()
    cache_hint: CacheHint | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token accounting for one call or a whole run."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    def to_wire(self) -> dict[str, int]:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cacheReadTokens": self.cache_read_tokens,
            "cacheWriteTokens": self.cache_write_tokens,
        }


NO_USAGE = Usage()
"""No tokens yet: where a run's or a turn's usage starts (immutable, so one object serves all)."""


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """One model turn: final text, or tool calls (possibly with some text), plus usage."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    stop_reason: str | None = None
    model: str | None = None
    """The model that answered, when the runtime knows it (a fallback chain's actual one)."""
    refusals: Mapping[str, str] = field(default_factory=dict)
    """Calls the harness refuses to run (call id -> the answer the model gets instead): set by
    the loop's bounds (`tools.bounds`) right after the runtime answers, never by a runtime."""


@runtime_checkable
class AgentRuntime(Protocol):
    """A model provider adapter.

    Implementations stream text through `on_text` as it is generated and return the complete
    turn. They must not execute tools: the harness does, so governance, bounds and events apply
    the same way whatever the model.
    """

    name: str
    capabilities: frozenset[AiCapability]

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse: ...


@runtime_checkable
class NativeSurfaceRuntime(Protocol):
    """Optional: a runtime that serves a primitive through its provider's own tool.

    When a runtime declares `AiCapability.PLANNING` or `AiCapability.VIRTUAL_FILESYSTEM`, the
    attach engine asks it for the tools that make up that surface (e.g. Anthropic's memory tool
    backed by the conversation's `AgentFileSystem`) and registers them instead of the built-in
    floor. The tools run through the same executor, so governance and bounds still apply.
    """

    def native_tools(self, capability: AiCapability) -> Sequence[Any]: ...


@runtime_checkable
class ContextWindowRuntime(Protocol):
    """Optional: a runtime that knows its model's context window, in tokens (`None`: unknown).

    `token-window` compaction takes it as its budget unless the `context_window_tokens` setting
    is set explicitly. The provider runtimes look their model up in
    `atmosphere_harness._runtimes.windows.MODEL_CONTEXT_WINDOWS`.
    """

    context_window: int | None
