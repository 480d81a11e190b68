"""`HarnessHost`: the running harness of one app (everything the router's lifespan owns).

It resolves each declared class into a `HostedEndpoint`, runs the attach engines over it, keeps
the per-owner surface registries the admin API reads, and tracks background work so shutdown
can drain it. It never imports FastAPI: the web layer is a thin client of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterable, Sequence
from functools import partial
from typing import Any, TypeVar

from .._contracts import (
    ConversationLocks,
    ConversationOwners,
    FrameSink,
    Key,
    LiveRunHandle,
    Primitive,
    PromptKeys,
    Resource,
    Run,
    RunHooks,
    RunJournal,
    RunRegistry,
    Scrubber,
    StoredRun,
    TypedMap,
    UserForgetHook,
)
from .._errors import RunConflict
from .._events import Frame
from .._harness import Harness
from .._log import get_logger
from .._preset import HarnessPreset, effective_cache_policy
from .._registry import AgentSpec, EndpointKind
from .._runtimes.base import AgentRuntime
from .._runtimes.fallback import FallbackRuntime, model_chain
from .._settings import HarnessSettings
from .collector import tune_collector
from .control import InProcessRunRegistry, RunControl, RunTicket, new_run_id
from .endpoint import HostedEndpoint
from .entry import Entry, enter_conversation
from .forget import ForgottenUser, forget_conversation, forget_user
from .live import LiveRun, LiveRuns
from .locks import InProcessConversationLocks
from .owners import ConversationAccess, InMemoryConversationOwners
from .prompt_keys import InProcessPromptKeys
from .retention import sweep_forever
from .run import RunContext, execute_prompt
from .session import StreamingSession

log = get_logger(__name__)
T = TypeVar("T")

HEADLESS_DOCS = "docs/delegation.md#headless-agents"
"""Where the start-up line about a headless agent sends the reader (why it is expected)."""
MAX_REGISTERED_OWNERS = 1024


async def _not_started(frame: Frame) -> None:
    raise RuntimeError("a run sent a frame before it started (its entry only claims and locks)")


class HarnessHost:
    """The live harness: settings, preset, runtime, endpoints and shared services."""

    def __init__(
        self,
        settings: HarnessSettings,
        *,
        runtime: AgentRuntime,
        specs: Sequence[AgentSpec],
        primitives: Sequence[Primitive] = (),
        locks: ConversationLocks | None = None,
        runs: RunJournal | None = None,
        prompt_keys: PromptKeys | None = None,
        resources: Sequence[Resource] = (),
        scrubbers: Sequence[Scrubber] = (),
        hooks: Sequence[RunHooks] | None = None,
        owners: ConversationOwners | None = None,
        registry: RunRegistry | None = None,
        models: Callable[[str], AgentRuntime] | None = None,
    ) -> None:
        self.settings = settings
        self.preset = HarnessPreset(settings)
        self.truth = self.preset.truth
        self.runtime = runtime
        self.specs = list(specs)
        self.primitives = list(primitives)
        self.services = TypedMap()
        """App-wide objects primitives share (buses, stores), by typed key."""
        self.endpoints: dict[str, HostedEndpoint] = {}
        self.agents: dict[str, AgentSpec] = {}
        """Every declared agent/coordinator by name, headless ones included (fleet members)."""
        self.locks: ConversationLocks = locks if locks is not None else InProcessConversationLocks()
        """One prompt at a time per conversation (`backends` may share them across replicas)."""
        self.access = ConversationAccess(
            owners if owners is not None else InMemoryConversationOwners()
        )
        """Who owns each conversation (`kernel.owners`): every route checks it first."""
        self.runs: RunJournal = runs if runs is not None else LiveRuns()
        """Prompt runs started over HTTP, with their frame journals (see `kernel.live`)."""
        self.prompt_keys: PromptKeys = (
            prompt_keys if prompt_keys is not None else InProcessPromptKeys()
        )
        """The `Idempotency-Key` of each prompt and the run it started (shared like `locks`)."""
        owner = getattr(self.runs, "owner", None) or f"process/{new_run_id()}"
        self.control = RunControl(
            registry if registry is not None else InProcessRunRegistry(),
            owner=str(owner),
            lease_seconds=settings.groups.backends.durable_runs_lease_seconds,
        )
        """Every run's status and cancel requests, over replicas (`kernel.control`)."""
        if isinstance(self.runs, LiveRuns):
            self.runs.in_flight = self.control.active  # (who to ask for a run's frames)
        self.hooks: list[RunHooks] = (
            list(hooks) if hooks is not None else [h for h in (self.runs.hooks,) if h is not None]
        )
        """Around every model and tool call of every endpoint, outermost first (`RunHooks`);
        by default the journal's own (durable replay, when runs are durable)."""
        self.user_forget_hooks: list[UserForgetHook] = []
        """What primitives keep of a user beyond their conversations (`kernel.forget`)."""
        self.scrubbers: list[Scrubber] = list(scrubbers)
        """Stores whose files keep deleted rows' bytes, wiped after each deletion."""
        self.backends: dict[str, str] = {"state": "sqlite", "events": "local"}
        """What holds shared state and carries fan-out (`backends.StateBackends.describe`)."""
        self._surfaces: dict[Key[Any], dict[str, Any]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._retention: asyncio.Task[None] | None = None
        """The retention sweep (`kernel.retention`), with a `conversation_ttl`."""
        self._started: list[Primitive] = []
        self.resources = list(resources)
        """Opened before the primitives start, closed after they stop (backend pools)."""
        self._opened: list[Resource] = []
        self._resolve_model = models
        """Builds the runtime an agent's `"<provider>:<model>"` string names (the assembly's:
        `runtimes.resolve.runtime_from_ref` with these settings)."""
        self._built: dict[str, AgentRuntime] = {}
        """Runtimes built from agents' `"<provider>:<model>"` strings, one per string (closed
        at shutdown; the app's runtime and the ones passed as objects are their owners')."""

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self._index_specs()
        try:
            for resource in self.resources:
                await resource.open()
                self._opened.append(resource)
        except BaseException:
            await self._close_resources()
            raise
        try:
            for primitive in self.primitives:
                await primitive.start(self)
                self._started.append(primitive)
            for spec in self.specs:
                if spec.headless:
                    log.info(
                        "headless agent: no prompt loop, so the harness does not apply",
                        agent=spec.name,
                        see=HEADLESS_DOCS,
                    )
                    continue
                self._host(spec)
            await self.control.open()
            # Last: a resumed run needs its endpoint attached (and its run control open).
            await self.runs.open(self._resume)
            ttl = self.settings.groups.memory.conversation_ttl
            if ttl is not None:
                self._retention = asyncio.get_running_loop().create_task(
                    sweep_forever(self, ttl), name="conversation-retention"
                )
            if self.settings.groups.backends.durable_runs:
                name = self.runs.store_name
                self.truth.set_durable(
                    f"ACTIVE({name})" if self.runs.durable and name else "INACTIVE(no-store)"
                )
        except BaseException:
            # A start-up error (a bad route, a tool-name collision) must not leave what the
            # primitives already opened running (MCP server processes, the skills staging
            # directory); `stop` closes the resources last.
            await self.stop()
            raise
        tune_collector(self.settings.groups.process)
        mode = (
            "kill switch"
            if self.preset.kill_switch
            else ("enabled app-wide" if self.settings.groups.harness.enabled else "per annotation")
        )
        log.info(
            "harness started",
            mode=mode,
            endpoints=sorted(self.endpoints),
            runtime=self.runtime.name,
            excluded=sorted(self.preset.exclude_paths),
        )

    async def stop(self) -> None:
        if self._retention is not None:
            self._retention.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention
            self._retention = None
        self.control.stopping = True
        await self.runs.aclose()
        await self.control.aclose()
        await self.drain()
        for primitive in reversed(self._started):
            try:
                await primitive.stop(self)
            except Exception:
                log.exception("primitive failed to stop cleanly", primitive=primitive.name)
        self._started.clear()
        for runtime in (self.runtime, *self._built.values()):
            close = getattr(runtime, "aclose", None)
            if close is not None:
                await close()
        self._built.clear()
        await self._close_resources()

    async def _close_resources(self) -> None:
        while self._opened:
            resource = self._opened.pop()
            try:
                await resource.aclose()
            except Exception:
                log.exception("backend resource failed to close cleanly", resource=repr(resource))

    def _index_specs(self) -> None:
        paths: dict[str, AgentSpec] = {}
        for spec in self.specs:
            if spec.kind is not EndpointKind.AI_ENDPOINT:
                if spec.name in self.agents:
                    raise ValueError(f"two agents are named {spec.name!r}")
                self.agents[spec.name] = spec
            if not spec.headless:
                if spec.path in paths:
                    raise ValueError(
                        f"{spec.cls.__name__} and {paths[spec.path].cls.__name__} both serve "
                        f"{spec.path}"
                    )
                paths[spec.path] = spec

    def _host(self, spec: AgentSpec) -> None:
        features = self.preset.features_for(spec.path, spec.harness, spec.is_agent_default)
        cache_policy = effective_cache_policy(
            spec.prompt_cache, self.settings, cache_feature=Harness.CACHE in features
        )
        runtime = self.runtime_for(spec)
        endpoint = HostedEndpoint.from_spec(
            spec,
            features=features,
            runtime=runtime,
            workspace_root=self.settings.groups.filesystem.workspace_root,
            tool_timeout=self.settings.groups.runtime.tool_execution_timeout,
            max_rounds=self.settings.groups.runtime.max_tool_rounds,
            cache_policy=cache_policy,
            truth=self.truth,
            max_tool_calls=self.settings.groups.runtime.max_tool_calls_per_message,
            max_tool_argument_chars=self.settings.groups.runtime.max_tool_argument_chars,
        )
        self.truth.seed_endpoint(
            spec.path,
            features,
            compaction=self.settings.groups.memory.compaction.value,
            cache_policy=cache_policy,
            coordinator=spec.kind is EndpointKind.COORDINATOR,
        )
        self.truth.report_models(spec.path, model_chain(runtime))
        endpoint.hooks = list(self.hooks)
        for primitive in self.primitives:
            primitive.attach(endpoint, self)
        for hook in reversed(self.hooks):
            if endpoint.history is not None:
                endpoint.history = hook.wrap_history(endpoint.history)
        for name, kind in endpoint.prompt_parameters:
            if kind not in (None, StreamingSession) and kind not in endpoint.providers:
                log.warning(
                    "prompt parameter will be None: its primitive is not attached here",
                    endpoint=spec.path,
                    parameter=name,
                    type=getattr(kind, "__name__", str(kind)),
                )
        self.endpoints[spec.path] = endpoint

    def runtime_for(self, spec: AgentSpec) -> AgentRuntime:
        """The runtime of `spec`'s endpoint: its `model=` (else the app's runtime), followed by
        its `fallback_models=` as a `FallbackRuntime` when it has any."""
        primary = self.runtime if spec.model is None else self._model(spec.model)
        if not spec.fallback_models:
            return primary
        return FallbackRuntime(primary, *(self._model(ref) for ref in spec.fallback_models))

    def _model(self, ref: AgentRuntime | str) -> AgentRuntime:
        if not isinstance(ref, str):
            return ref
        if ref not in self._built:
            if self._resolve_model is None:
                raise ValueError(
                    f"model {ref!r}: this host was built without a model resolver "
                    "(build it with assembly.build_host, or pass a runtime object)"
                )
            self._built[ref] = self._resolve_model(ref)
        return self._built[ref]

    # --- surfaces the admin API reads ------------------------------------------------------

    def register_surface(self, kind: Key[T], owner: str, surface: T) -> bool:
        """Record the exact instance an attach engine bound for `owner` (e.g. its plan store)."""
        if not owner or not owner.strip():
            return False
        registry = self._surfaces.setdefault(kind, {})
        if owner not in registry and len(registry) >= MAX_REGISTERED_OWNERS:
            log.warning("owner registry full; not registering", kind=kind, owner=owner)
            return False
        registry[owner] = surface
        return True

    def surface(self, kind: Key[T], owner: str) -> T | None:
        found: T | None = self._surfaces.get(kind, {}).get(owner)
        return found

    def owners(self, kind: Key[Any]) -> list[str]:
        return sorted(self._surfaces.get(kind, {}))

    # --- runs -----------------------------------------------------------------------------

    def start_run(
        self,
        endpoint: HostedEndpoint,
        *,
        message: str,
        conversation_id: str,
        user_id: str | None,
        session_id: str | None = None,
        ticket: RunTicket | None = None,
        background: bool = False,
        entry: Entry[RunContext] | None = None,
    ) -> LiveRunHandle:
        """Start one prompt run in its own task, its frames journalled (the HTTP entry point).

        `session_id` names it in advance (an `Idempotency-Key` records it before it starts);
        `ticket` is its run control (a new one when absent); a `background` run goes on to its
        end whoever follows it and leaves (nobody has to); `entry` is its claim and lock,
        begun before the response started (`enter`, with that ticket). Without an entry, the
        route claimed the conversation already, and the lock's tries claim it again as they
        take it (`kernel.entry`)."""
        if ticket is None:
            ticket = self.control.ticket(
                path=endpoint.path, conversation_id=conversation_id, user_id=user_id
            )
            ticket.announce()
        # `execute_prompt(self, endpoint, live, ...)` once the journal exists: its coroutine is
        # the run's task (no closure or coroutine around it that a run in flight would keep).
        work = partial(
            execute_prompt,
            self,
            endpoint,
            message=message,
            conversation_id=conversation_id,
            user_id=user_id,
            ticket=ticket,
            entry=entry,
            claims=True,
        )
        live = self.runs.start(
            work,
            path=endpoint.path,
            conversation_id=conversation_id,
            user_id=user_id,
            session_id=session_id,
            message=message,
            run_id=ticket.run_id,
        )
        self._track(ticket, live, background)
        return live

    async def enter(
        self,
        endpoint: HostedEndpoint,
        *,
        message: str,
        conversation_id: str,
        user_id: str | None,
        ticket: RunTicket,
    ) -> Entry[RunContext] | None:
        """Claim the conversation for the user and begin taking its lock, in one step, before
        a streamed prompt's response starts (`kernel.entry`): `None` when it is another user's
        (answer 404: nothing ran or was stored); else pass the entry to `start_run` with
        `ticket`, or `close` it."""
        run = RunContext(
            host=self,
            endpoint=endpoint,
            conversation_id=conversation_id,
            user_id=user_id,
            sink=_not_started,
        )
        ticket.attach(run)
        return await enter_conversation(
            self.locks, self.access, endpoint.locked_reader, run, ticket, message
        )

    def _track(self, ticket: RunTicket, live: LiveRunHandle, background: bool) -> None:
        self.control.track(ticket)
        ticket.live = live
        if background and isinstance(live, LiveRun):
            live.detached = True  # no reader leaving stops it
        if live.task is not None:
            live.task.add_done_callback(ticket.ended)

    async def submit(
        self,
        endpoint: HostedEndpoint,
        *,
        message: str,
        conversation_id: str,
        user_id: str | None,
        multitask: str = "enqueue",
        background: bool = False,
        start: bool = True,
    ) -> RunTicket:
        """Apply the prompt's `multitask` strategy to the conversation's runs in flight, store
        the new run's record, and (with `start`) start it.

        `reject` raises `RunConflict` while the conversation has a run in flight; `interrupt`
        and `rollback` cancel the caller's own runs in flight in it first (a run of someone
        else is waited for, as `enqueue` does); `enqueue` runs it after them, in order.
        """
        ticket = self.control.ticket(
            path=endpoint.path, conversation_id=conversation_id, user_id=user_id
        )
        if multitask in ("interrupt", "rollback"):
            for record in await self.control.active(endpoint.path, conversation_id):
                if record.user_id == user_id:
                    await self.control.cancel(record.run_id, multitask)
        if not await self.control.begin(ticket, exclusive=multitask == "reject"):
            raise RunConflict(
                f"conversation {conversation_id!r} already has a run in flight "
                "(multitask: reject); wait for it, or send with multitask: enqueue"
            )
        if start:
            self.start_run(
                endpoint,
                message=message,
                conversation_id=conversation_id,
                user_id=user_id,
                ticket=ticket,
                background=background,
            )
        return ticket

    async def _resume(self, live: LiveRunHandle, stored: StoredRun) -> RunContext | None:
        """Run again a durable run a dead process left unfinished (see `durable.journal`)."""
        endpoint = self.endpoints.get(stored.path)
        if endpoint is None:
            log.warning(
                "a durable run's endpoint is no longer hosted; the run ends",
                endpoint=stored.path,
                conversation=stored.conversation_id,
            )
            return None
        ticket = self.control.ticket(
            path=stored.path,
            conversation_id=stored.conversation_id,
            user_id=stored.user_id,
            run_id=stored.run_id,
            status="running",
        )
        ticket.changed()
        self._track(ticket, live, background=True)
        return await execute_prompt(
            self,
            endpoint,
            live,
            message=stored.message,
            conversation_id=stored.conversation_id,
            user_id=stored.user_id,
            ticket=ticket,
        )

    async def prompt(
        self,
        path: str,
        *,
        message: str,
        conversation_id: str,
        user_id: str | None,
        sink: FrameSink,
        parent: Run | None = None,
    ) -> RunContext:
        """Run the endpoint at `path` for one message inside `parent` (a fleet member's answer)."""
        endpoint = self.endpoints.get(path)
        if endpoint is None:
            raise LookupError(f"no endpoint is hosted at {path}")
        if parent is not None and not isinstance(parent, RunContext):
            raise TypeError(f"a parent run must be a kernel run, got {parent!r}")
        # A member's conversation is claimed for the user too: its id is derived from the
        # coordinator's, so without a claim another user could reach it at the member's path.
        # Its record names the coordinator's conversation: it is deleted with it (`forget`).
        derived_from = None if parent is None else (parent.endpoint.path, parent.conversation_id)
        if not await self.access.claim(path, conversation_id, user_id, message, derived_from):
            raise PermissionError(f"conversation {conversation_id!r} of {path} is not this user's")
        return await execute_prompt(
            self,
            endpoint,
            message=message,
            conversation_id=conversation_id,
            user_id=user_id,
            sink=sink,
            parent=parent,
        )

    # --- concurrency ----------------------------------------------------------------------

    def spawn(
        self, work: Coroutine[Any, Any, Any], *, name: str | None = None
    ) -> asyncio.Task[Any]:
        """Run background work the host waits for at shutdown (never on the request path)."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", task=task.get_name(), exc_info=task.exception())

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait for background work (e.g. memory extraction) to finish, bounded by `timeout`."""
        pending = set(self._tasks)
        if not pending:
            return
        _done, still = await asyncio.wait(pending, timeout=timeout)
        for task in still:
            task.cancel()
        if still:
            log.warning("background tasks cancelled at shutdown", count=len(still))

    async def close_conversation(
        self, path: str, conversation_id: str, user_id: str | None = None
    ) -> bool:
        """Close a conversation of the endpoint at `path` (close route, WebSocket disconnect).

        Every close hook of the endpoint is told (memory schedules its fact extraction in the
        background); returns whether any of them knew the conversation. Hooks never raise here.
        """
        endpoint = self.endpoints.get(path)
        if endpoint is None:
            return False
        known = False
        for hook in endpoint.close_hooks:
            try:
                known = await hook(conversation_id, user_id) or known
            except Exception:
                log.exception("close hook failed", endpoint=path, conversation=conversation_id)
        return known

    async def forget_conversation(self, path: str, conversation_id: str) -> None:
        """Delete everything every store holds of the conversation (`kernel.forget`); raises
        `RunConflict` while it has a run in flight."""
        await forget_conversation(self, path, conversation_id)

    async def forget_user(self, user_id: str) -> ForgottenUser:
        """Delete every conversation the user owns, their facts and `/memories` files
        (`kernel.forget`); raises `RunConflict` (deleting nothing) while one of their
        conversations has a run in flight."""
        return await forget_user(self, user_id)

    # --- lookups --------------------------------------------------------------------------

    def endpoint(self, path: str) -> HostedEndpoint | None:
        return self.endpoints.get(path)

    def endpoints_of(self, kinds: Iterable[EndpointKind]) -> list[HostedEndpoint]:
        wanted = set(kinds)
        return [endpoint for endpoint in self.endpoints.values() if endpoint.kind in wanted]
