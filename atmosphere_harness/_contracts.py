"""What the primitives see of the kernel: small protocols, typed keys and the hook shapes.

The kernel (`atmosphere_harness._kernel`) implements these; the primitives (`planning`,
`filesystem`, `memory`, `governance`, `delegation`) and `tools` depend only on them, never on the
kernel's classes. That keeps the import graph a stack (web -> assembly -> backends -> kernel and
primitives -> contracts -> foundations) that `lint-imports` checks on every `make test`; see
`docs/architecture.md`.

State that crosses a process boundary in a scale-out deployment (conversation locks, the live-run
journal) is described here too, so a backend can replace the embedded implementation without a
primitive or the kernel noticing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    Protocol,
    TypeVar,
    overload,
    runtime_checkable,
)

from ._cache import PromptCache
from ._errors import ConversationTaken
from ._events import Frame
from ._harness import Harness

if TYPE_CHECKING:
    from ._registry import AgentSpec, EndpointKind
    from ._runtimes.base import (
        AgentRuntime,
        Message,
        ModelRequest,
        ModelResponse,
        ToolCall,
        Usage,
    )
    from ._settings import HarnessSettings
    from ._tools.base import Tool

T = TypeVar("T")

FrameSink = Callable[[Frame], Awaitable[None]]
"""Where a run's frames go: a connection, a live-run journal, or a parent run's stream."""


# --- typed keys -------------------------------------------------------------------------------


class Key(Generic[T]):
    """A typed key: `services.get(PLAN_BUS)` is a `PlanEventBus | None` to mypy.

    Each primitive declares the keys of what it shares next to the type itself, so the kernel
    carries the values without knowing their types.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Key({self.name!r})"


class TypedMap:
    """A small map from `Key[T]` to `T`: the host's and an endpoint's services, a run's state."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[Key[Any], Any] = {}

    @overload
    def get(self, key: Key[T]) -> T | None: ...

    @overload
    def get(self, key: Key[T], default: T) -> T: ...

    def get(self, key: Key[T], default: T | None = None) -> T | None:
        value: T | None = self._values.get(key, default)
        return value

    def require(self, key: Key[T]) -> T:
        """The value under `key`; a `LookupError` naming the key when absent."""
        if key not in self._values:
            raise LookupError(f"{key.name} is not available here (its primitive is not attached)")
        value: T = self._values[key]
        return value

    def set(self, key: Key[T], value: T) -> None:
        self._values[key] = value

    def setdefault(self, key: Key[T], factory: Callable[[], T]) -> T:
        if key not in self._values:
            self._values[key] = factory()
        value: T = self._values[key]
        return value

    def pop(self, key: Key[T]) -> T | None:
        value: T | None = self._values.pop(key, None)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._values


# --- the stream, the run, the endpoint, the host ------------------------------------------


class Stream(Protocol):
    """One prompt's frames, as a tool or primitive speaks on them (`StreamingSession`)."""

    @property
    def conversation_id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    async def stream(self, message: str) -> str: ...

    async def send(self, text: str) -> None: ...

    async def emit(self, event: Any, data: Mapping[str, Any] | None = None) -> None: ...

    async def error(self, exc: BaseException | str) -> None:
        """End the stream with an `error` frame (later frames are dropped)."""
        ...


class Run(Protocol):
    """One prompt run (or a sub-agent's / fleet member's run inside one)."""

    @property
    def conversation_id(self) -> str: ...

    @property
    def user_id(self) -> str | None: ...

    @property
    def session_id(self) -> str: ...

    @property
    def endpoint(self) -> Endpoint: ...

    @property
    def session(self) -> Stream: ...

    @property
    def parent(self) -> Run | None: ...

    @property
    def root(self) -> Run:
        """The top-level run (the request) this run belongs to."""
        ...

    @property
    def state(self) -> TypedMap:
        """Per-run scratch space for primitives, keyed by their own `Key`s."""
        ...

    @property
    def usage(self) -> Usage: ...

    def resolve(self, kind: type[T]) -> T | None:
        """The injectable of type `kind` for this run (built once per run); `None` if absent."""
        ...

    def add_usage(self, usage: Usage) -> None: ...

    def hold(self) -> contextlib.AbstractContextManager[None]:
        """Keep the request alive while the block runs, even if its client leaves (approvals)."""
        ...

    def child(self, endpoint: Endpoint, *, conversation_id: str, sink: FrameSink) -> Run:
        """A run of `endpoint` inside this one (a sub-agent): its frames go to `sink`."""
        ...

    @property
    def suspended(self) -> bool:
        """Stopped by a shutdown, to resume on restart: the run leaves no trace of an end (no
        history write, no `complete` frame); its next life finishes it."""
        ...

    @property
    def discarded(self) -> bool:
        """Ended without its turn: nothing of it is written to the history (`discard`)."""
        ...

    def discard(self) -> None:
        """End the whole run (the request) without its turn: the loop writes nothing to the
        history and runs no `after_turn`; the error that ends it is not logged as a failure.
        A durable run that must not resume (its conversation went on without it) is one."""
        ...


Provider = Callable[[Run], Any]
"""Builds an injectable for one run."""


class RunInterceptor(Protocol):
    """Shapes every model request of a run and sees each finished turn."""

    async def before_request(self, run: Run, request: ModelRequest) -> ModelRequest: ...

    async def after_turn(self, run: Run, messages: Sequence[Message]) -> None: ...


class HistoryStore(Protocol):
    """Where a conversation's messages live between prompts (the memory primitive provides it)."""

    async def load(self, run: Run) -> list[Message]: ...

    async def append(self, run: Run, messages: Sequence[Message]) -> None: ...


class HistoryMark(Protocol):
    """What can say where a conversation's history stands (the memory primitive's
    `ConversationMemory` can; it sets itself as its endpoint's `history_mark`): a durable run
    journals this mark as it loads the history, and its resumed life compares it with the mark
    then, to tell whether the conversation went on without it (`durable.RunSuperseded`)."""

    async def newest_seq(self, run: Run) -> int:
        """The seq of the run's conversation's newest stored message (0 when it has none)."""
        ...


class PendingCloser(Protocol):
    """What closes the approvals a run's earlier life left waiting for a person (the governance
    primitive's `ApprovalGate`, offered as the endpoint service `PENDING_APPROVALS`): durable
    runs call it when they end a resumed run instead of resuming it (a superseded run,
    `durable.RunSuperseded`), so those approvals are neither listed nor answerable."""

    async def close_pending(self, run: Run, journal: Mapping[str, Any]) -> None:
        """Close the approvals `journal` (the run's first life's checkpoints) left unanswered."""
        ...


PENDING_APPROVALS: Key[PendingCloser] = Key("approvals.pending")
"""Endpoint service: what closes a superseded run's unanswered approvals (absent: nothing to
close, no approval gate on the endpoint)."""


class CloseHook(Protocol):
    """Told when a conversation closes; returns whether it knew the conversation."""

    async def __call__(self, conversation_id: str, user_id: str | None) -> bool: ...


class ForgetHook(Protocol):
    """Deletes everything one primitive keeps of a conversation of its endpoint (a deleted
    conversation, `kernel.forget`): `user_id` is its owner (`None`: anonymous). It must leave
    nothing of the conversation in its stores, and may raise (the deletion then fails, and
    may be asked again: every hook is idempotent)."""

    async def __call__(self, conversation_id: str, user_id: str | None) -> None: ...


class UserForgetHook(Protocol):
    """Deletes everything one primitive keeps of a user outside their conversations (a
    forgotten user); idempotent, may raise."""

    async def __call__(self, user_id: str) -> None: ...


class AdmissionHook(Protocol):
    """Runs before a call runs: a string answers the call instead of the tool, a mapping
    replaces its arguments, `None` admits it as it is."""

    async def __call__(
        self, call: ToolCall, tool: Tool, arguments: dict[str, Any], run: Run
    ) -> str | Mapping[str, Any] | None: ...


@dataclass(frozen=True, slots=True)
class Approval:
    """An approval hook's verdict: run (maybe with edited arguments) or answer with `result`."""

    approved: bool
    arguments: Mapping[str, Any] | None = None
    result: str | None = None


class ApprovalHook(Protocol):
    async def __call__(
        self, call: ToolCall, tool: Tool, arguments: dict[str, Any], run: Run
    ) -> Approval | None: ...


class ResultHook(Protocol):
    """Reshapes a result before the model sees it (e.g. offloads a huge one to a file)."""

    async def __call__(self, call: ToolCall, tool: Tool, result: str, run: Run) -> str: ...


# --- around the loop's model and tool calls -----------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelStep:
    """One model call as an `around_model` hook sees it."""

    run: Run
    """The run making the call: its ids, `session`, `usage`, `state`, `parent` and `root`."""
    request: ModelRequest
    """What the loop asks (system prompt, messages, tools); the endpoint's interceptors shape
    it further, innermost, right before the runtime is called."""
    runtime: AgentRuntime
    """The runtime the innermost `proceed` calls (the endpoint's; a fallback swaps it)."""
    turn: int
    """The run's model turn this call makes, from 1, counted over all of the run's
    `session.stream` loops (a retried or fallen-back call keeps its turn)."""


@dataclass(frozen=True, slots=True)
class ToolStep:
    """One tool call as an `around_tool` hook sees it, and what `proceed` is asked to do."""

    run: Run
    call: ToolCall
    """As the model sent it (after the loop's bounds, `tools.bounds`)."""
    tool: Tool | None
    """`None` for a name the endpoint has no tool for (the call is answered `unknown_tool`)."""
    turn: int
    """The model turn that asked for the call (`ModelStep.turn`)."""
    refusal: str | None = None
    """The loop's bounds refused the call: `proceed` answers it with this, nothing runs."""
    admitted: Mapping[str, Any] | None = None
    """Arguments already admitted and approved: `proceed` skips every gate and runs the
    handler with them (a durable run re-running a call its first life had started)."""
    answer: str | None = None
    """`proceed` answers the call with this instead of running anything; the result hooks
    still see it (a durable run's `interrupted` answer)."""
    before_handler: BeforeHandler | None = None
    """Called with the step and the final arguments once every gate passed, right before the
    handler runs, and awaited if it returns an awaitable (a durable run journals that the call
    started). The executor gives each step the run's `BEFORE_HANDLER`, if its state has one; a
    hook that sets another calls the one it replaces."""


BeforeHandler = Callable[[ToolStep, Mapping[str, Any]], "Awaitable[None] | None"]
"""A `ToolStep.before_handler`: `None` when it did its work at once (a call that waits for
nothing costs no coroutine), else what the executor awaits before the handler runs."""

BEFORE_HANDLER: Key[BeforeHandler] = Key("kernel.before-handler")
"""Run state: the `before_handler` the executor gives every tool step of the run (a durable
run's bind sets it), so a hook need not build each call's step again to set it."""


ToolStatus = Literal[
    "ok", "error", "timeout", "invalid", "unknown", "denied", "refused", "interrupted", "replayed"
]
"""How a tool call ended: `ok` (the handler returned), `error` (it raised), `timeout`,
`invalid` (arguments failed validation), `unknown` (no such tool), `denied` (a policy or a
person said no, or an approval timed out), `refused` (the loop's bounds), `interrupted` (a
restart cut it off and it must not run twice), `replayed` (a resumed durable run took the
result its first life journalled)."""

ToolFrames = Literal["start", "result", "none"]
"""Which of a call's frames the executor still sends once the hooks return: `start` (its
`tool-start`, then its `tool-result`: a call that never reached its gates' `tool-start`),
`result` (its `tool-result` only), `none` (a durable run's replayed call: its first life sent
them)."""


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What one tool call gave the model, and how it ended."""

    result: str
    """The text the model gets (after the result hooks)."""
    status: ToolStatus = "ok"
    frames: ToolFrames = "result"
    arguments: Any = None
    """With `frames="start"`: the arguments its `tool-start` frame shows (default: the
    model's own)."""


ProceedModel = Callable[[ModelStep], Coroutine[Any, Any, "ModelResponse"]]
"""The rest of the chain: the next hook's `around_model`, or the runtime itself."""
ProceedTool = Callable[[ToolStep], Awaitable[ToolOutcome]]
"""The rest of the chain: the next hook's `around_tool`, or the executor's gates and handler."""
ProceedRun = Callable[[], Coroutine[Any, Any, None]]
"""The rest of the chain: the next hook's `around_run`, or the run itself."""


class RunHooks:
    """Middleware around every model call and every tool call of the runs of an endpoint.

    The host installs its hooks on every endpoint it hosts (and on the sub-agent endpoints
    derived from them) in one fixed order, outermost first; `assembly.build_host` installs
    tracing, cancellation, usage limits, durable replay, then model fallback, each only when it
    is on. Override either method; the defaults pass the call through.

    A hook sees the run (`step.run`: session, usage, state, ids, parent, root) and the call. It
    may change the request or the step (`dataclasses.replace`) before `proceed`, change the
    response or outcome after it, call `proceed` zero times (a replayed answer, a refusal),
    once, or several times (a retry, a fallback on another runtime), emit frames through
    `step.run.session`, and raise to end the run (a usage limit: the error ends the stream
    with an `error` frame). Per-run state goes in `step.run.state` (or `step.run.root.state`
    for state shared with sub-agents and fleet members) under the hook's own `Key`s.
    """

    async def around_run(self, run: Run, proceed: ProceedRun) -> None:
        """One whole run: a prompt (its `@prompt` method, from taking the conversation's lock
        to its `complete` frame), a fleet member's answer, or a `task` sub-agent's loop.

        `proceed()` raises what ended the run, if anything (the kernel then sends the `error`
        frame); its `complete` or `error` frame is sent once every hook returned. A hook that
        needs the run's context (a tracing span) sets it around `proceed`: every model and tool
        call of the run, and the runs inside it, happen within.
        """
        await proceed()

    async def around_model(self, step: ModelStep, proceed: ProceedModel) -> ModelResponse:
        """One model call: return its response (from `proceed(step)`, or not)."""
        return await proceed(step)

    async def around_tool(self, step: ToolStep, proceed: ProceedTool) -> ToolOutcome:
        """One tool call: return its outcome (from `proceed(step)`, or not)."""
        return await proceed(step)

    def wrap_history(self, history: HistoryStore) -> HistoryStore:
        """The history store an endpoint's loop uses, given the one its primitives set (called
        once per hosted endpoint that has one; the default keeps it)."""
        return history


class CallJournal(Protocol):
    """A durable run's journal of what happened to its tool calls, as a hook sees it.

    Present in a run's `state` (under `CALL_JOURNAL`) only in a top-level run with durable
    runs on; the governance primitive's approval gate journals an approval and its answer
    there, so a resumed run raises it again (same id and deadline) or goes on with its answer.
    """

    def recall(self, call: ToolCall, kind: str) -> Any | None:
        """What this run's first life journalled as `kind` for `call` in the current model
        turn; `None` in a first life, or when it journalled nothing of that kind."""
        ...

    async def record(self, call: ToolCall, kind: str, value: Any, *, wait: bool = False) -> None:
        """Journal `value` (JSON-serializable) as `kind` for `call`, in order with the run's
        frames; `wait` returns only once it is stored."""
        ...


CALL_JOURNAL: Key[CallJournal] = Key("durable.calls")
"""Run state: the run's `CallJournal` (only in a durable top-level run)."""


class RunCheckpoints(Protocol):
    """A durable run's journal as a hook keeps its own notes in it, outside any tool call.

    Present in a run's `state` (under `RUN_CHECKPOINTS`) only in a top-level run with durable
    runs on; tracing keeps the run's span there, so a resumed run's span links to it.
    """

    def recall(self, key: str) -> Any | None:
        """What this run's first life journalled under `key`; `None` in a first life."""
        ...

    async def record(self, key: str, value: Any) -> None:
        """Journal `value` (JSON-serializable) under `key`, in order with the run's frames."""
        ...


RUN_CHECKPOINTS: Key[RunCheckpoints] = Key("durable.notes")
"""Run state: the run's `RunCheckpoints` (only in a durable top-level run)."""


class Endpoint(Protocol):
    """One prompt loop as the attach engines complete it (`kernel.endpoint.HostedEndpoint`)."""

    path: str
    kind: EndpointKind
    owner: str
    features: frozenset[Harness]
    runtime: AgentRuntime
    system_prompt: str
    root: Path
    tool_timeout: float
    max_rounds: int
    max_tool_calls: int
    max_tool_argument_chars: int
    cache_policy: PromptCache
    spec: AgentSpec | None
    tools: dict[str, Tool]
    services: TypedMap
    interceptors: list[RunInterceptor]
    history: HistoryStore | None
    history_mark: HistoryMark | None
    """Where the history stands, if its store can say (durable runs check it; `None`: no check)."""
    locked_reader: LockedReader | None
    """The history's first read offered to the conversation lock, if its store can make one."""
    hooks: list[RunHooks]
    """Around every model and tool call, outermost first (the host installs them)."""
    close_hooks: list[CloseHook]
    forget_hooks: list[ForgetHook]
    """Called when a conversation of the endpoint is deleted (`kernel.forget`)."""
    expire_hooks: list[ForgetHook]
    """Called before a conversation idle past `conversation_ttl` is deleted (`kernel.retention`):
    what must outlive it is saved here (the memory primitive extracts its facts); a hook that
    raises keeps the conversation for a later sweep."""
    admission_hooks: list[AdmissionHook]
    approval_hook: ApprovalHook | None
    result_hooks: list[ResultHook]

    def has(self, feature: Harness) -> bool: ...

    def tool_specs(self) -> tuple[Any, ...]:
        """The tools as the runtime is told about them (`Tool.spec()` each; the same tuple while
        the tools stay the same)."""
        ...

    def add_builtin_tool(self, tool: Tool) -> bool:
        """Register a built-in tool unless a user tool already claims the name (the user wins)."""
        ...

    def provide(self, kind: type, provider: Provider) -> None:
        """Make `kind` injectable into this endpoint's `@prompt` method and tools."""
        ...

    def report(self, key: str, state: str) -> None:
        """Record what really attached (runtime truth, per endpoint and app-wide)."""
        ...

    def report_detail(self, key: str, states: Mapping[str, str]) -> None:
        """Record a map of states under `key` (e.g. `mcp`: one per server), per endpoint only."""
        ...

    def derive(
        self,
        *,
        agent_id: str,
        system_prompt: str,
        root: Path,
        features: frozenset[Harness],
        tools: Sequence[Tool],
    ) -> Endpoint:
        """A sub-agent's endpoint: this one's runtime and bounds, its own tools and root."""
        ...


class Host(Protocol):
    """The running harness as a primitive sees it while it starts, attaches and stops."""

    settings: HarnessSettings
    services: TypedMap
    """App-wide objects primitives share, by typed key."""
    specs: list[AgentSpec]
    agents: dict[str, AgentSpec]
    """Every declared agent/coordinator by name, headless ones included (fleet members)."""
    user_forget_hooks: list[UserForgetHook]
    """What each primitive keeps of a user beyond their conversations (long-term facts, the
    `/memories` files), forgotten with the user (`kernel.forget.forget_user`)."""

    def endpoint(self, path: str) -> Endpoint | None: ...

    def register_surface(self, kind: Key[T], owner: str, surface: T) -> bool:
        """Record the exact instance an attach engine bound for `owner` (the admin API reads it)."""
        ...

    def spawn(
        self, work: Coroutine[Any, Any, Any], *, name: str | None = None
    ) -> asyncio.Task[Any]:
        """Run background work the host waits for at shutdown (never on the request path)."""
        ...

    async def drain(self, timeout: float = 30.0) -> None: ...

    async def prompt(
        self,
        path: str,
        *,
        message: str,
        conversation_id: str,
        user_id: str | None,
        sink: FrameSink,
        parent: Run | None = None,
    ) -> Run:
        """Run the `@prompt` method of the endpoint at `path` for one message (a fleet member)."""
        ...


class Primitive:
    """Base class of an attach engine; override what the primitive needs.

    A primitive opens what it needs when the host starts (stores, buses), completes every
    endpoint whose resolved features include it (tools, injectables, hooks, runtime truth), and
    closes on shutdown. The host runs them in the order it was given them.
    """

    name = "primitive"

    async def start(self, host: Host) -> None:
        """Open shared resources (called once, before any endpoint is attached)."""

    def attach(self, endpoint: Endpoint, host: Host) -> None:
        """Complete one endpoint (called for every hosted endpoint, features already resolved)."""

    async def stop(self, host: Host) -> None:
        """Release what `start` opened (called in reverse order at shutdown)."""


# --- shared state the kernel owns -------------------------------------------------------------


class Resource(Protocol):
    """Something the host opens before its primitives start and closes after they stop.

    A scale-out backend's connection pool is one: opening it connects (and migrates a schema)
    so that a bad URL fails start-up, not the first request.
    """

    async def open(self) -> None: ...

    async def aclose(self) -> None: ...


class Scrubber(Protocol):
    """A store whose files keep the bytes of deleted rows (SQLite's free pages and its WAL):
    told once a deletion (`kernel.forget`) is done, it wipes them from its files."""

    async def scrub(self) -> None: ...


class LockedRead:
    """A read a run makes first under its conversation's lock, offered to the lock so that it
    can make it in the round trip that takes the lock (`ConversationLocks.hold(..., read)`).

    The reader subclasses it (the memory primitive's `memory.history.HistoryRead`). A lock
    whose store holds what the read asks for makes it *after* the lock is taken, in the same
    round trip, and calls `deliver` before its block starts; any other lock ignores it, and
    the reader, finding nothing delivered, reads as it would have.
    """

    __slots__ = ("__weakref__", "delivered", "result", "status")

    def __init__(self) -> None:
        self.delivered = False
        self.result: Any = None
        self.status: LockedStatus | None = None
        """The run's status record, offered with the read (set by the kernel)."""

    def deliver(self, result: Any) -> None:
        self.delivered = True
        self.result = result

    def take(self) -> tuple[bool, Any]:
        """`(delivered, result)`, once: the result is dropped (a later read must read again)."""
        delivered, result = self.delivered, self.result
        self.delivered, self.result = False, None
        return delivered, result


class LockedWrite:
    """A write a run hands its conversation lock's release (`LockedStatus.hand`) instead of
    making it itself: the turn's history append (the memory primitive's
    `memory.history.HistoryWrite`). A release that can, stores it in the round trip that stores
    the run's end and frees the lock; any other calls `store` before it frees the lock."""

    __slots__ = ()

    async def store(self) -> None:
        """Make the write on its own (as its writer would have)."""
        raise NotImplementedError


_STOPPED_WRITE = "the conversation's turn was not stored: the server stopped"
"""Why a run's handed write failed when the server stopped before it was stored."""


class LockedStatus:
    """A run's status record, offered to its conversation's lock with the run's `LockedRead`
    (its `status`), so that the lock's round trip stores it too.

    A lock whose store also holds `registry`'s records (the PostgreSQL and Redis backends)
    stores `record("running")` in the round trip that takes the lock, or `record("queued")`
    in the first one that finds the lock taken (the run waits), and sets `stored` to that
    status; it never replaces a status that is neither (a run cancelled meanwhile stays
    cancelled). Any other lock ignores it, and the run writes its status itself.

    Such a lock also stores the run's end with its release (`carries_end`), so the end and
    the unlock are one round trip: the release waits (at most `END_WAIT_SECONDS`) for the run
    to hand its final record (`end`), stores it and frees the lock together, then tells the
    run whether the record was stored (`released`); the run writes it itself otherwise. A run
    that will not end here (a durable run suspended to resume) says so (`no_end`), and the
    lock is freed at once.

    A lock whose release can store a write of the run's with its end (`carries_write`, the
    PostgreSQL and Redis locks: the turn's history append) takes the run's last write too
    (`hand`), so the write and the end are one round trip (with the unlock on Redis; on
    PostgreSQL the unlock follows, not waited for). The write is stored before the end and
    the unlock whatever happens (alone, if their round trip failed); the run waits for its
    outcome (`written`) before it reports its end, and a write that could not be stored fails
    the run as the write would have made it fail itself.
    """

    __slots__ = (
        "_end",
        "_failure",
        "_outcome",
        "_write",
        "_wrote",
        "carries_end",
        "carries_write",
        "keeps_writes",
        "record",
        "registry",
        "stored",
    )

    END_WAIT_SECONDS = 2.0
    """How long a release waits for the run's end before it frees the lock without it."""

    def __init__(self, registry: RunRegistry, record: Callable[[str], RunRecord]) -> None:
        self.registry = registry
        self.record = record
        self.stored: str | None = None
        self.carries_end = False
        """Set by a lock that stored the status: its release stores the run's end too."""
        self.carries_write = False
        """Set by a lock that carries the end while its block runs: its release can also store
        a write the run hands it (`hand`)."""
        self.keeps_writes = False
        """Set by the kernel for a run that must make its writes itself (a durable run journals
        each history write once it is stored): `hand` refuses them."""
        self._end: asyncio.Future[RunRecord | None] | None = None
        self._outcome: asyncio.Future[bool] | None = None
        self._write: LockedWrite | None = None
        self._wrote: asyncio.Future[None] | None = None
        self._failure: Exception | None = None

    def _futures(self) -> tuple[asyncio.Future[RunRecord | None], asyncio.Future[bool]]:
        if self._end is None or self._outcome is None:
            loop = asyncio.get_running_loop()
            self._end, self._outcome = loop.create_future(), loop.create_future()
        return self._end, self._outcome

    async def end(self, record: RunRecord) -> bool:
        """The run's final `record`, for the lock's release to store: whether it did (`False`
        at once when the lock carries no end, or its release already went without it)."""
        if not self.carries_end:
            return False
        end, outcome = self._futures()
        if end.done():
            return False
        end.set_result(record)
        return await outcome

    def no_end(self) -> None:
        """The run ends elsewhere (or not at all): the release goes without waiting."""
        if self.carries_end:
            end, _outcome = self._futures()
            if not end.done():
                end.set_result(None)

    async def ending(self) -> RunRecord | None:
        """The lock's release: the run's final record to store with it (`None` if the run
        gave none within `END_WAIT_SECONDS`; a later `end` is then refused). Call `released`
        after."""
        end, _outcome = self._futures()
        if not end.done():
            late = asyncio.get_running_loop().call_later(self.END_WAIT_SECONDS, self._no_record)
            try:
                await end  # (a cancelled release cancels it: a later `end` is refused)
            finally:
                late.cancel()
        return end.result()

    def _no_record(self) -> None:
        if self._end is not None and not self._end.done():
            self._end.set_result(None)

    def released(self, stored: bool) -> None:
        """The lock's release ran: whether it stored the record `ending` returned."""
        _end, outcome = self._futures()
        if not outcome.done():
            outcome.set_result(stored)

    # --- a write riding on the release ----------------------------------------------------------

    def hand(self, write: LockedWrite) -> bool:
        """Give `write` to the lock's release to store (see the class docstring): whether it
        took it. Refused unless the lock carries writes and its block still runs, one at a
        time (take the previous one back first: `take_write`)."""
        if not self.carries_write or self.keeps_writes or self._write is not None:
            return False
        self._write = write
        self._wrote = asyncio.get_running_loop().create_future()
        return True

    def take_write(self) -> LockedWrite | None:
        """The write handed and not taken yet, once: the release takes it to store it, or its
        writer takes it back to make it itself. Whoever took it reports with `wrote`."""
        write, self._write = self._write, None
        return write

    def wrote(self, failure: Exception | None) -> None:
        """The write taken last was stored (`None`), or could not be (`failure`)."""
        if failure is not None and self._failure is None:
            self._failure = failure
        if self._wrote is not None and not self._wrote.done():
            self._wrote.set_result(None)

    @property
    def handed(self) -> bool:
        """A write was handed (the run's end waits for its outcome: `written`)."""
        return self._wrote is not None

    async def written(self) -> Exception | None:
        """Once the handed write's outcome is known: why it (or an earlier one) could not be
        stored, or `None` (stored, or nothing was handed)."""
        if self._wrote is not None:
            await asyncio.shield(self._wrote)
        return self._failure

    def release_dropped(self) -> None:
        """The lock's release was cancelled before it took the run's write: the write fails
        (the run must not wait for it forever) and the run stores its end itself."""
        if self.take_write() is not None:
            self.wrote(RuntimeError(_STOPPED_WRITE))
            self.no_end()
            self.released(False)

    async def store_taken(self, store: Awaitable[None]) -> Exception | None:
        """Make the write taken last (`take_write`) on its own, `store` being its statement
        (or the write's `LockedWrite.store()`), and report how it went (`wrote`): why it
        failed (the run fails with it), or `None`. Cancelled, it reports the turn unstored
        (the run must not wait for it) and is cancelled."""
        try:
            await store
        except Exception as exc:
            self.wrote(exc)
            return exc
        except BaseException:
            self.wrote(RuntimeError(_STOPPED_WRITE))
            raise
        self.wrote(None)
        return None


class LockedClaim:
    """A prompt's claim of its conversation (`ConversationOwners.claim`), offered to the
    conversation's lock (`ClaimingLocks.hold(..., claim=...)`) so that taking the lock and
    claiming the id are one step.

    A lock that carries it (`ClaimingLocks.carries`) claims the id for `user` in its first
    try (whether or not that try takes the lock) and again in the try that takes it, in the
    same round trip as each: a deletion that finished while the prompt waited leaves the id
    unused, and the prompt claims it again. Each claim calls `found` with the owner, which
    raises `ConversationTaken` (the lock is not taken) when it is another user's.
    """

    __slots__ = ("conversation_id", "decided", "owner", "owners", "path", "title", "user")

    def __init__(
        self,
        owners: ConversationOwners,
        path: str,
        conversation_id: str,
        user: str,
        title: str = "",
        decided: Callable[[str], None] | None = None,
    ) -> None:
        self.owners = owners
        self.path = path
        self.conversation_id = conversation_id
        self.user = user
        """The claimant's user key (`user_key`)."""
        self.title = title
        self.owner: str | None = None
        """The owner the last claim found (`None` before the first)."""
        self.decided = decided
        """Called with the owner the first claim found (the prompt's answer: its stream, or a
        404), before the lock is taken."""

    def found(self, owner: str) -> None:
        """A claim found `owner`: tell `decided` the first time; `ConversationTaken` unless it
        is the claimant."""
        first = self.owner is None
        self.owner = owner
        if first and self.decided is not None:
            self.decided(owner)
        if owner != self.user:
            raise ConversationTaken(f"unknown conversation {self.conversation_id!r}")


@runtime_checkable
class ClaimingLocks(Protocol):
    """`ConversationLocks` that can claim a prompt's conversation in the step that takes its
    lock (the embedded, PostgreSQL and Redis locks)."""

    def carries(self, claim: LockedClaim, read: LockedRead | None) -> bool:
        """Whether `hold(..., read, claim=claim)` makes the claim (with `read`, when its store
        also holds the owners): else the kernel claims on its own."""
        ...

    def hold(
        self,
        path: str,
        conversation_id: str,
        read: LockedRead | None = None,
        *,
        claim: LockedClaim | None = None,
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """`ConversationLocks.hold`, claiming the conversation as `LockedClaim` says."""
        ...


class PromptKeys(Protocol):
    """Where the `Idempotency-Key` of a prompt is remembered, with the run it started.

    In this process by default (`kernel.prompt_keys.InProcessPromptKeys`); in the shared store
    with PostgreSQL or Redis, so a resend reaching another replica finds the first request's run.
    """

    async def claim(
        self, scope: str, record: str, ttl: float, *, path: str = "", conversation_id: str = ""
    ) -> str | None:
        """Remember `record` under `scope` for `ttl` seconds unless a live record is there.

        `None` when this call stored `record`; else the record stored first (a resend). One
        atomic step: of two requests with one key, exactly one gets `None`. `path` and
        `conversation_id` name the conversation the record belongs to (`forget` drops it)."""
        ...

    async def forget(self, path: str, conversation_id: str) -> None:
        """Drop every record of the conversation (a deleted conversation)."""
        ...


class ConversationLocks(Protocol):
    """Prompts of one conversation run one at a time, so their history never interleaves.

    The embedded implementation is an `asyncio.Lock` per conversation (one process); a
    scale-out backend holds the lock across replicas.
    """

    def hold(
        self, path: str, conversation_id: str, read: LockedRead | None = None
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold the conversation's lock for the block.

        `read` (only passed when the history store offers one, see `LockedReader`) may be made
        in the round trip that takes the lock, never before it is taken; a lock may ignore it.
        """
        ...


ANONYMOUS = ""
"""The user key of a request without a user (`get_user_id` answered `None`)."""


def user_key(user_id: str | None) -> str:
    """How a user is recorded as an owner: its id, or `ANONYMOUS`."""
    return user_id or ANONYMOUS


TITLE_CHARS = 80
"""A conversation's title: the first prompt's first characters (no model call)."""


def conversation_title(message: str) -> str:
    """The title a conversation's first prompt gives it: its first line-folded characters,
    without control characters (PostgreSQL's text refuses NUL; a title is for display)."""
    printable = "".join(ch if ch.isprintable() else " " for ch in message[: TITLE_CHARS * 4])
    return " ".join(printable.split())[:TITLE_CHARS]


@dataclass(frozen=True, slots=True)
class OwnedConversation:
    """One conversation of a user, as the conversation list shows it."""

    conversation_id: str
    updated_at: float
    """When its last prompt was claimed (epoch seconds)."""
    title: str = ""


@dataclass(frozen=True, slots=True)
class ExpiredConversation:
    """A conversation idle past the retention time, claimed for deletion (`expired`)."""

    path: str
    conversation_id: str
    user: str
    """The owner's user key (`ANONYMOUS` for an anonymous conversation)."""
    updated_at: float


class ConversationOwners(Protocol):
    """Who owns each conversation: the user whose prompt first used its id, on every replica.

    A record is `(path, conversation_id) -> user key` (`user_key`), written by the first
    prompt (`claim`), whose owner never changes; each later prompt of the owner moves its
    `updated_at` forward, so a user's conversations list newest first (`page`). `forget` drops
    it when the conversation is deleted. The embedded implementation is a table of the SQLite
    file under `workspace_root`; a scale-out backend keeps it in PostgreSQL or Redis, so every
    replica sees one owner.

    A conversation a run of another one started (a fleet member's, for its coordinator's
    conversation) is derived from it: its record names that parent (`claim(parent=...)`), the
    parent's deletion finds it (`children`) and deletes it too, and retention never picks it on
    its own (`expired` skips it: it goes with its parent).
    """

    async def claim(
        self,
        path: str,
        conversation_id: str,
        user: str,
        title: str = "",
        parent: tuple[str, str] | None = None,
    ) -> str:
        """Make `user` the owner if the conversation has none, atomically; return the owner
        (`user` when the claim won, or whoever's did before). When the owner is `user`, the
        conversation's `updated_at` becomes now; `title` is kept from the first claim only.
        `parent` (`(path, conversation_id)`) marks the conversation as derived from that one,
        when it names no parent yet (a parent, once recorded, never changes)."""
        ...

    async def children(self, path: str, conversation_id: str) -> list[tuple[str, str]]:
        """The `(path, conversation_id)` of every conversation derived from this one (those
        whose claim named it as their parent and that were not forgotten since)."""
        ...

    async def owner(self, path: str, conversation_id: str) -> str | None:
        """The owner's user key, or `None` when no prompt ever used the id (or it was
        forgotten)."""
        ...

    async def page(
        self, path: str, user: str, limit: int, after: tuple[float, str] | None = None
    ) -> list[OwnedConversation]:
        """Up to `limit` conversations of `user` at `path`, newest `updated_at` first (ties:
        conversation id descending), starting after the `(updated_at, conversation_id)` of the
        last one a previous page returned."""
        ...

    async def forget(
        self, path: str, conversation_id: str, *, idle_before: float | None = None
    ) -> bool:
        """Drop the record: the id is unused again (a deleted conversation). With
        `idle_before`, only if its `updated_at` is older (a prompt since keeps it), in one
        atomic step. Whether a record was dropped."""
        ...

    async def expired(self, before: float, limit: int, lease: float) -> list[ExpiredConversation]:
        """Claim up to `limit` conversations whose `updated_at` is older than `before`, oldest
        first, for `lease` seconds: no other call, on any replica, gets one of them until the
        lease ran out (retention deletes each once). A derived conversation is never one of
        them (it is deleted with its parent)."""
        ...

    async def release(self, path: str, conversation_id: str) -> None:
        """End the claim `expired` took on the conversation (it was in use: the next sweep
        looks at it again)."""
        ...


@runtime_checkable
class LockedReader(Protocol):
    """A history whose first read of a run can ride on the round trip that takes the run's
    conversation lock (the memory primitive's `ConversationMemory` on a PostgreSQL or Redis
    history, set as its endpoint's `locked_reader`): the kernel asks it for that read before
    it takes the lock."""

    def locked_read(self, run: Run) -> LockedRead | None:
        """The read to offer the lock, or `None` (nothing to gain)."""
        ...


class LiveRunHandle(Protocol):
    """One run as the journal keeps it: the run publishes into it, readers follow it."""

    path: str
    conversation_id: str
    user_id: str | None
    session_id: str | None
    task: asyncio.Task[Any] | None
    """The run's task, once started."""

    @property
    def finished(self) -> bool: ...

    @property
    def held(self) -> bool:
        """Whether something (an approval wait) keeps the run alive past its readers."""
        ...

    @property
    def durable(self) -> bool:
        """Whether frames and checkpoints are journalled in a `RunStore` before readers see them."""
        ...

    @property
    def suspended(self) -> bool:
        """Stopped by a shutdown and to be resumed: the run must leave no trace of its end
        (no history write, no `complete`/`error` frame) so that its next life finishes it."""
        ...

    async def publish(self, frame: Frame) -> None:
        """The run's frame sink (may wait: a slow reader slows the run, bounded memory)."""
        ...

    def bind(self, run: Run) -> FrameSink:
        """Called once, as the top-level run that publishes here starts: the sink its session
        writes to. The embedded journal gives `publish`; a durable one puts the run's
        `CALL_JOURNAL` in `run.state` and, in a resumed run, gives a sink that leaves out the
        frames its first life already sent (numbering the new ones after them)."""
        ...

    def hold(self) -> contextlib.AbstractContextManager[None]:
        """Keep the run alive while the block runs, even if every reader leaves."""
        ...

    def follow(self, after: int = 0) -> AsyncGenerator[Frame, None]:
        """Every frame with a seq above `after`, then each new one, until the run ends."""
        ...

    def follow_batches(self, after: int = 0) -> AsyncGenerator[list[Frame], None]:
        """`follow`, the frames ready together in one list (an SSE stream writes each list in
        one send): a lone frame comes alone, at once."""
        ...

    def interrupt(self, message: str) -> None:
        """Server shutdown: end every reader with an `error` frame carrying `message` (not
        journalled), and, when durable, mark the run suspended so it resumes on restart."""
        ...

    def cancel(self) -> bool:
        """Stop the run now (a cancel request): a durable run journals first that it ended, so
        that a restart never runs it again. `False` when there is nothing here to stop."""
        ...


class RunJournal(Protocol):
    """Live (and recently finished) runs and their frames: a run outlives its connection.

    With a `RunStore` (durable runs), runs also outlive the process: `open` resumes the runs a
    killed process left unfinished, by calling `resume(handle, stored)` for each.
    """

    @property
    def durable(self) -> bool: ...

    @property
    def store_name(self) -> str | None:
        """The `RunStore.name` durable runs are journalled in; `None` when they are not."""
        ...

    @property
    def hooks(self) -> RunHooks | None:
        """The hooks durable replay needs on every endpoint (`None` unless durable); the
        assembly installs them in their place in the order (`RunHooks`)."""
        ...

    def start(
        self,
        work: Callable[[LiveRunHandle], Coroutine[Any, Any, Any]],
        *,
        path: str,
        conversation_id: str,
        user_id: str | None,
        session_id: str | None = None,
        message: str = "",
        run_id: str | None = None,
    ) -> LiveRunHandle:
        """Run `work(handle)` in its own task; it publishes its frames into `handle`.

        `message` is what a durable journal stores to run the prompt again after a restart;
        `run_id` names the run in its store (a new id when absent).
        """
        ...

    async def find(
        self, path: str, conversation_id: str, *, session_id: str | None = None
    ) -> LiveRunHandle | None:
        """The run `session_id` names, else the oldest unfinished run, else the newest one."""
        ...

    async def open(
        self, resume: Callable[[LiveRunHandle, StoredRun], Coroutine[Any, Any, Any]]
    ) -> None:
        """Start (host start-up): with a store, claim and resume unfinished runs, now and
        whenever another process's lease on one expires."""
        ...

    async def aclose(self) -> None:
        """Stop every unfinished run (shutdown) and wait for them to unwind; a durable journal
        leaves them unfinished in its store, to resume on the next start."""
        ...

    async def forget(self, path: str, conversation_id: str) -> None:
        """Drop the conversation's finished runs and their frames, here and in the store (a
        deleted conversation; its runs in flight are refused first, `kernel.forget`)."""
        ...


class UserTokens(Protocol):
    """The tokens each user's runs spent per UTC day, where every replica reads and adds to
    them (`ATMOSPHERE_AI_USER_DAILY_TOKEN_LIMIT`). The embedded one counts in this process; a
    scale-out backend's (PostgreSQL, Redis) is shared, with an atomic add."""

    name: str

    async def spent(self, user_id: str, day: str) -> int:
        """The tokens `user_id` spent on `day` (`YYYY-MM-DD`, UTC) so far."""
        ...

    async def add(self, user_id: str, day: str, tokens: int) -> int:
        """Add `tokens` to that count, atomically; returns the new count."""
        ...

    async def reserve(self, user_id: str, day: str, estimate: int, limit: int) -> int | None:
        """In one atomic step: `None` when the count (spent and reserved) is at or over
        `limit`; else add `max(estimate, the user's last remembered call, 1)` to it and return
        what was added (the reservation)."""
        ...

    async def settle(
        self, user_id: str, day: str, reserved: int, used: int, *, remember: bool
    ) -> None:
        """Replace a reservation by what the call used (`count += used - reserved`); with
        `remember`, `used` becomes the user's last call, the next reservation's floor."""
        ...


@dataclass(slots=True)
class TokenGrant:
    """A reservation against a user's daily tokens; set `used` to what the call spent."""

    used: int = 0


class UserDailyCap(Protocol):
    """The per-user daily token cap (`ATMOSPHERE_AI_USER_DAILY_TOKEN_LIMIT`) for the harness's
    own model calls (compaction summaries, fact extraction), under `USER_DAILY_CAP` in the
    host's services when the cap is set."""

    def reserve(
        self, user_id: str, estimate: int, *, remember: bool = False
    ) -> contextlib.AbstractAsyncContextManager[TokenGrant]:
        """Reserve about `estimate` tokens of the user's day for one call, settled with the
        grant's `used` when the block ends; raises `UsageLimitExceeded` when the user is at
        or over the cap."""
        ...


USER_DAILY_CAP: Key[UserDailyCap] = Key("usage.user_daily_cap")
"""Host service: the per-user daily token cap, when it is set."""


# --- the durable run store ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredRun:
    """What a `RunStore` keeps of one run to start it again: who, where, and the message."""

    run_id: str
    path: str
    conversation_id: str
    user_id: str | None
    session_id: str
    message: str
    """The prompt, as the durable journal stores it: JSON text (ASCII), so that every store
    keeps any prompt the run accepts (PostgreSQL's text refuses a raw NUL)."""
    started_at: float
    """Epoch seconds."""


class RunStore(Protocol):
    """Where durable runs are journalled: the storage behind a durable `RunJournal`.

    The embedded implementation is `durable.SqliteRunStore` (a table set in the harness's SQLite
    file); a scale-out backend (PostgreSQL, Redis) implements the same few operations. The
    contract, which the journal relies on:

    - `append(run, frames, checkpoints, create=...)` stores frames, each `(seq, event, data)`
      (a run's seqs only grow), and checkpoints, each `(key, value)` (a later value replaces an
      earlier one of the same key), atomically, in one write. `data` and `value` are JSON text,
      ASCII-only (the journal encodes them when they are published, so a value changed later
      cannot change what was journalled). `create` carries the run's record on its first
      append, which also takes the lease for `owner`. When `append` returns, what it was given
      survives a SIGKILL.
    - With an `owner`, a shared store refuses the append of a run another owner has taken over
      (this one's lease ran out: a stalled process) by raising `LeaseLost`; the journal then
      stops the run here, since its new owner runs it.
    - `load(run_id, limit)` gives back every checkpoint and the newest `limit` frames, decoded.
    - `claim(owner, lease_seconds, limit)` atomically takes over unfinished runs whose lease
      expired (or whose owner is known dead) and returns them; two owners never get one run.
    - `heartbeat(owner, lease_seconds)` extends the lease of every unfinished run `owner` holds;
      `release(owner)` gives them up at once (a graceful stop, so a restart resumes them now).
    - `finish(run_id)` marks the run finished and compacts it: its frames and checkpoints go
      (the conversation history now holds the turn), a small record stays until `expire`.
    - `expire(before)` drops finished records older than `before` (epoch seconds).
    - `open()` / `aclose()`: the store's resource lifecycle (the journal calls both).
    - Owner ids are `host/pid/token`: a store may take over at once the runs of an owner it
      knows is dead (the embedded store does, for processes of its own host).
    - An owner starting with `FEED_OWNER` (a replica with durable runs off that shares its
      frames so other replicas can follow them, `RunFeed`) holds runs that are never claimed
      and never resumed; its appends are not a durability promise (a store may skip waiting
      for its disk), carry frames only, are refused (`LeaseLost`) once the run is finished, and
      finish the run when their last frame is terminal (the feed calls `finish` only when that
      write failed).
    """

    name: str
    """The truth's word for it: `sqlite`, `postgres`, `redis`."""

    async def open(self) -> None: ...

    async def aclose(self) -> None: ...

    async def append(
        self,
        run_id: str,
        frames: Sequence[tuple[int, str, str]],
        checkpoints: Sequence[tuple[str, str]],
        *,
        create: StoredRun | None = None,
        owner: str | None = None,
        lease_seconds: float = 0.0,
    ) -> None: ...

    async def load(self, run_id: str, limit: int) -> tuple[dict[str, Any], list[Frame]]: ...

    async def claim(self, owner: str, lease_seconds: float, limit: int) -> list[StoredRun]: ...

    async def heartbeat(self, owner: str, lease_seconds: float) -> None: ...

    async def release(self, owner: str) -> None: ...

    async def finish(self, run_id: str) -> None: ...

    async def expire(self, before: float) -> int: ...

    async def forget(self, path: str, conversation_id: str) -> None:
        """Drop every finished run of the conversation: records, frames and checkpoints (a
        deleted conversation; a run still unfinished is left to its owner)."""
        ...


FEED_OWNER = "feed:"
"""The prefix of a `RunStore` owner whose runs are only followed, never resumed (`RunFeed`)."""


@runtime_checkable
class RunStoreNow(Protocol):
    """A `RunStore` that can also write an append synchronously, on the event loop.

    Optional: the journal then writes each frame and checkpoint as it is published, without a
    task or a thread hop. `append_now` takes `append`'s arguments and either stores them (and
    returns `True`, with `append`'s guarantees) or writes nothing and returns `False` (too large
    to write on the loop, or the store is busy): the journal then calls `append`. It must never
    wait (no lock, no network, no `fsync`): the event loop does nothing else meanwhile.

    The journal makes the payloads it hands such a store (`data`, `value`) with its `encode`:
    the text of a JSON value in any form the store reads back as that value (an embedded store
    may spare itself escaping a long string into JSON, see `durable.SqliteRunStore.encode`, and
    even copying it: a `str` subclass carrying part of the payload aside, which only that
    store's own `append` and `append_now` are given back).
    """

    def encode(self, value: Any) -> str: ...

    def append_now(
        self,
        run_id: str,
        frames: Sequence[tuple[int, str, str]],
        checkpoints: Sequence[tuple[str, str]],
        *,
        create: StoredRun | None = None,
        owner: str | None = None,
        lease_seconds: float = 0.0,
    ) -> bool: ...


AskListener = Callable[[str, str, str | None], None]
"""Called with `(path, conversation_id, session_id)` for each `RunFeed.ask` heard."""


@runtime_checkable
class RunFeed(Protocol):
    """A `RunStore` other processes can follow a run from while it runs elsewhere.

    Optional: with it, `GET P/conversations/{id}/events` on one replica replays and follows a
    run another replica executes (`kernel.remote.RemoteRun` reads it whenever `watch` says
    frames were stored, and polls it slowly in case a notice was lost). A store without it
    serves re-attaching only on the replica that runs the run. With durable runs off, the
    journal writes a run's frames to it only once another replica asks for them (`ask`, heard
    by `hear_asks`): the frame feed, owner `FEED_OWNER`..., see `kernel.feed`.
    """

    async def latest(
        self, path: str, conversation_id: str, *, session_id: str | None = None
    ) -> tuple[StoredRun, bool] | None:
        """The run `session_id` names, else the oldest unfinished run, else the newest one,
        with whether it is finished; `None` when the conversation has none."""
        ...

    async def frames_after(self, run_id: str, after: int, limit: int) -> tuple[list[Frame], bool]:
        """Up to `limit` stored frames with a seq above `after`, oldest first, and whether the
        run is finished (read together, so "finished" covers every frame before it)."""
        ...

    def watch(self, run_id: str, wake: Callable[[int], None]) -> Callable[[], None]:
        """Call `wake(seq)` whenever any process stored frames of `run_id` up to `seq` (after
        they are committed), and `wake(0)` when notices may have been lost (a reconnect, or
        the watch just started hearing them); returns the call that stops watching. Best
        effort: a reader still polls."""
        ...

    async def ask(self, path: str, conversation_id: str, session_id: str | None) -> None:
        """Ask every replica to share its run of the conversation (the one `session_id` names,
        else the one `latest` would pick) in this store: one notice every replica's `hear_asks`
        hears. Best effort: the asker reads the store afterwards and gives up after a while."""
        ...

    async def hear_asks(self, on_ask: AskListener) -> None:
        """From now on call `on_ask(path, conversation_id, session_id)` for every `ask` of any
        replica (until the store closes). Asks made while the listening connection is down are
        lost (the asker gives up; its client may re-attach again)."""
        ...

    async def abandon(self, message: str, limit: int) -> int:
        """End up to `limit` followed-only runs (owner `FEED_OWNER`...) whose lease ran out
        (their replica died): each gets a terminal `error` frame saying `message` after its
        last stored frame and is marked finished, so its readers end instead of polling on.
        Returns how many it ended."""
        ...


# --- run control: status and cancellation across replicas -----------------------------------

RUN_STATUSES = (
    "queued",
    "running",
    "waiting-approval",
    "completed",
    "failed",
    "cancelled",
    "interrupted",
)
"""Every status `GET P/runs/{runId}` answers."""
ACTIVE_STATUSES = frozenset({"queued", "running", "waiting-approval"})
"""The statuses of a run in flight (the others are final)."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    """What every replica can read of one run: whose, where, its status, usage and error."""

    run_id: str
    path: str
    conversation_id: str
    user_id: str | None
    status: str
    """One of `RUN_STATUSES`."""
    usage: Mapping[str, int] | None = None
    """Tokens so far, as frames carry them (`Usage.to_wire`)."""
    error: Mapping[str, str] | None = None
    """`{"type", "message"}` of a failed or cancelled run."""
    owner: str = ""
    """The process that runs it (a `RunJournal` owner id)."""
    lease_until: float = 0.0
    """Epoch seconds; an active run whose lease ran out reads as `interrupted` (its process
    stopped and nobody resumed it)."""
    started_at: float = 0.0

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    def seen_at(self, now: float) -> RunRecord:
        """The record as a reader reports it at `now`: a run in flight whose owner stopped
        renewing its lease is `interrupted`."""
        if self.active and self.lease_until and self.lease_until < now:
            return replace(self, status="interrupted")
        return self


CancelListener = Callable[[str, str], None]
"""Called with `(run_id, mode)` when a cancel request names a run (possibly not this
process's: the listener ignores runs it does not run)."""


class RunRegistry(Protocol):
    """Run status and cancel requests, shared by every replica (`kernel.control.RunControl`).

    The embedded implementation (`kernel.control.InProcessRunRegistry`) keeps records in this
    process; the PostgreSQL and Redis backends keep them in their store and carry cancel
    requests to the replica that runs the run (`NOTIFY` / pub/sub), within a second.

    - `put(record)` stores the newest state of a run (insert or replace).
    - `begin(record, exclusive=True)` stores a new run only if its conversation has no run in
      flight (atomically, over replicas); `False` when it has one (`multitask: reject`).
    - `get(run_id)`; `active(path, conversation_id)`: the conversation's runs in flight, oldest
      first.
    - `cancel(run_id, mode)` records the request and wakes the run's replica, whose `open`
      listener is then called.
    - `forget(path, conversation_id)` drops the records of the conversation's finished runs (a
      deleted conversation).
    - `heartbeat(owner, run_ids, lease_seconds)` renews the leases of this process's runs in
      flight and returns the cancel requests among them (a wake-up lost in an outage is found
      here), as `{run_id: mode}`; it may also drop records older than the store keeps.
    """

    name: str

    async def open(self, on_cancel: CancelListener) -> None: ...

    async def aclose(self) -> None: ...

    async def put(self, record: RunRecord) -> None: ...

    async def begin(self, record: RunRecord, *, exclusive: bool) -> bool: ...

    async def get(self, run_id: str) -> RunRecord | None: ...

    async def active(self, path: str, conversation_id: str) -> list[RunRecord]: ...

    async def cancel(self, run_id: str, mode: str) -> None: ...

    async def forget(self, path: str, conversation_id: str) -> None: ...

    async def heartbeat(
        self, owner: str, run_ids: Sequence[str], lease_seconds: float
    ) -> dict[str, str]: ...
