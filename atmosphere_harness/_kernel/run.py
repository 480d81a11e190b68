"""One prompt run: its ids, its stream, its injectables, and how a `@prompt` method is called."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from .._contracts import Endpoint, FrameSink, LiveRunHandle, TypedMap
from .._errors import ConversationTaken, RunCancelled
from .._log import fault, get_logger
from .._runtimes.base import NO_USAGE, Usage
from .endpoint import HostedEndpoint
from .entry import take_lock
from .loop import call_run
from .session import StreamingSession

if TYPE_CHECKING:
    from .control import RunTicket
    from .entry import Entry
    from .host import HarnessHost

Holder = Callable[[], contextlib.AbstractContextManager[None]]
"""What keeps a request alive past its connection (its live run's `hold`)."""

log = get_logger(__name__)
T = TypeVar("T")


class RunContext:
    """Everything one prompt run shares between the loop, the tools and the primitives."""

    def __init__(
        self,
        *,
        host: HarnessHost | None,
        endpoint: HostedEndpoint,
        conversation_id: str,
        user_id: str | None,
        sink: FrameSink | None,
        parent: RunContext | None = None,
        holder: Holder | None = None,
        live: LiveRunHandle | None = None,
    ) -> None:
        self.host = host
        self.endpoint = endpoint
        self.conversation_id = conversation_id
        self.user_id = user_id
        self.parent = parent
        self.live = live if parent is None else None
        """The journal this (top-level) run publishes into, when it was started as a live run."""
        self.session_id = (
            live.session_id if live is not None and live.session_id else uuid.uuid4().hex
        )
        self.usage = NO_USAGE
        self.state = TypedMap()
        """Per-run scratch space for primitives and hooks (keyed by their own `Key`s)."""
        self._discarded = False
        self.in_hooks = False
        """Inside its `RunHooks.around_run` chain (a prompt run is, from its start; a `task`
        sub-agent's run enters it as its loop starts)."""
        if self.live is not None:
            sink = self.live.bind(self)
        elif sink is None:
            raise TypeError("a run needs a sink or a live journal for its frames")
        self.session = StreamingSession(self, sink)
        self._holder = holder
        self._resolved: dict[type, Any] = {}
        """The injectables built so far (the session is `session`, never kept here)."""

    def adopt(self, live: LiveRunHandle, holder: Holder | None) -> None:
        """Publish into `live` from now on: a run made before its journal existed (its
        conversation's entry, `kernel.entry`, is begun before the response starts)."""
        self.live = live
        if live.session_id:
            self.session_id = live.session_id
        self.session = StreamingSession(self, live.bind(self))
        self._holder = holder

    @property
    def root(self) -> RunContext:
        """The top-level run (the request) this run belongs to."""
        run = self
        while run.parent is not None:
            run = run.parent
        return run

    def resolve(self, kind: type[T]) -> T | None:
        """The injectable of type `kind` for this run, built once per run; `None` if absent."""
        if kind is StreamingSession:
            return self.session  # type: ignore[return-value]
        if kind in self._resolved:
            value: T | None = self._resolved[kind]
            return value
        provider = self.endpoint.providers.get(kind)
        value = provider(self) if provider is not None else None
        self._resolved[kind] = value
        return value

    def add_usage(self, usage: Usage) -> None:
        self.usage = self.usage + usage
        if self.parent is not None:
            self.parent.add_usage(usage)

    def hold(self) -> contextlib.AbstractContextManager[None]:
        """Keep the request alive past its connection while the block runs (an approval wait).

        A request started as a live run is held by its journal; any other run has nothing
        to hold, so this is a no-op there.
        """
        root = self.root
        return root._holder() if root._holder is not None else contextlib.nullcontext()

    @property
    def suspended(self) -> bool:
        """Stopped by a shutdown, to resume on restart: leave no trace of an end."""
        live = self.root.live
        return live is not None and live.suspended

    @property
    def discarded(self) -> bool:
        return self.root._discarded

    def discard(self) -> None:
        self.root._discarded = True

    def child(self, endpoint: Endpoint, *, conversation_id: str, sink: FrameSink) -> RunContext:
        """A sub-agent's run inside this one, on an endpoint `derive` built."""
        if not isinstance(endpoint, HostedEndpoint):
            raise TypeError(f"a child run needs a kernel endpoint, got {endpoint!r}")
        return RunContext(
            host=self.host,
            endpoint=endpoint,
            conversation_id=conversation_id,
            user_id=self.user_id,
            sink=sink,
            parent=self,
        )


async def execute_prompt(
    host: HarnessHost,
    endpoint: HostedEndpoint,
    live: LiveRunHandle | None = None,
    *,
    message: str,
    conversation_id: str,
    user_id: str | None,
    sink: FrameSink | None = None,
    parent: RunContext | None = None,
    ticket: RunTicket | None = None,
    entry: Entry[RunContext] | None = None,
    claims: bool = False,
) -> RunContext:
    """Call the endpoint's `@prompt` method for one message and finish its stream.

    The stream always ends with exactly one `complete` or `error` frame, whatever the method
    does (unless a shutdown suspends a durable run: its next life ends it); prompts of one
    conversation run one at a time. `live` is the run's journal, its frames' sink (a durable
    one makes the run resumable, and replays a resumed run's first life); without one, `sink`
    takes them. `parent` makes the run part of another (a fleet member answering a
    coordinator). `ticket` is its run control (`kernel.control`): told its status, and a cancel
    request that stops the run ends its stream with a `RunCancelled` error instead of
    propagating; with `live`, it keeps the run alive past its connection while it waits for a
    person (`RunTicket.hold`). `entry` is the run's claim and lock, begun before its response
    started (`kernel.entry`: its run is this run, adopting `live`); else, with `claims`, the
    lock's tries claim the conversation for the user as they take it (a prompt's run; see
    `contracts.LockedClaim`).
    """
    holder = ticket.hold if ticket is not None and live is not None else None
    if entry is not None:
        run = entry.run
        if live is not None:
            run.adopt(live, holder)
        if ticket is not None and entry.read is None:
            ticket.offer(None)  # (nothing rides on the lock: the ticket stores its status now)
    else:
        run = RunContext(
            host=host,
            endpoint=endpoint,
            conversation_id=conversation_id,
            user_id=user_id,
            sink=sink,
            parent=parent,
            holder=holder,
            live=live,
        )
    session = run.session
    if ticket is not None:
        ticket.attach(run)
    run.in_hooks = True
    try:
        try:
            # The run's body as a `partial`, not a closure, and no local keeps it.
            await call_run(
                endpoint.hooks,
                run,
                partial(_call_prompt, host, run, message, ticket, entry, claims),
            )
        finally:
            if entry is not None:
                entry.close()  # (a run that ended before it used its lock frees it)
        if ticket is not None:
            failure = await ticket.settle("completed")
            if failure is not None:
                raise failure  # (the turn, stored with the run's end, could not be stored)
        await session.complete()
    except asyncio.CancelledError:
        if ticket is None or ticket.cancel_mode is None or run.suspended:
            raise
        await _cancelled(run, ticket)
    except Exception as exc:
        if run.suspended:
            raise
        if isinstance(exc, ConversationTaken):
            log.info("prompt refused: its conversation is another user's", endpoint=endpoint.path)
        elif not run.discarded:  # (that one is logged where it was decided, and is no failure)
            fault(log, "prompt run failed", exc, endpoint=endpoint.path)
        if ticket is not None:
            exc = await ticket.settle("failed", exc) or exc
        await session.error(exc)
    return run


async def _call_prompt(
    host: HarnessHost,
    run: RunContext,
    message: str,
    ticket: RunTicket | None,
    entry: Entry[RunContext] | None,
    claims: bool,
) -> None:
    """The run inside its hooks: its conversation's lock, then its `@prompt` method."""
    if ticket is not None and ticket.cancel_mode is not None:
        raise asyncio.CancelledError  # cancelled before it started
    endpoint = run.endpoint
    holding = (
        entry.holding()
        if entry is not None
        else take_lock(
            host.locks,
            host.access,
            endpoint.locked_reader,
            run,
            ticket,
            message=message if claims else None,
        )
    )
    async with holding:
        if ticket is not None:
            ticket.running()
        kwargs: dict[str, Any] = {}
        for name, kind in endpoint.prompt_parameters:
            kwargs[name] = message if kind is None else run.resolve(kind)
        spec = endpoint.spec
        assert spec is not None
        assert spec.prompt_method is not None
        result = await getattr(endpoint.instance, spec.prompt_method)(**kwargs)
        session = run.session
        if isinstance(result, str) and result and not session.closed:
            await session.send(result)
            session.last_text = result


async def _cancelled(run: RunContext, ticket: RunTicket) -> None:
    """End a run a cancel request stopped: its stream gets a `RunCancelled` error frame (the
    loop already wrote its turn without a half tool pair, or nothing for a rollback)."""
    task = asyncio.current_task()
    if task is not None:
        while task.cancelling():
            task.uncancel()  # this cancellation was ours, and it is handled here
    reason = {
        "cancel": "the run was cancelled",
        "interrupt": "the run was interrupted by a newer prompt in its conversation",
        "rollback": "the run was rolled back by a newer prompt in its conversation",
    }.get(ticket.cancel_mode or "", "the run was cancelled")
    error = RunCancelled(reason)
    log.info("run cancelled", endpoint=run.endpoint.path, run=ticket.run_id, how=ticket.cancel_mode)
    failure = await ticket.settle("cancelled", error)
    await run.session.error(failure or error)
