"""Server-sent events: a prompt run as a `text/event-stream`, and `run_frames`, the one way
every transport (SSE, WebSocket, AG-UI) reads a run.

The run executes in its own task and writes its frames into a live-run journal
(`kernel.live`) that the response follows. A slow client therefore slows the run
down (back-pressure) instead of growing memory; a client that stops reading for `SEND_TIMEOUT`
seconds, or disconnects, cancels the run, unless the run is waiting for an approval: then it
outlives the connection and a client re-attaches with `GET P/conversations/{id}/events`.
Every harness SSE response is a `HarnessEventSource`, so a reader cut off that way costs one INFO
line, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import anyio
from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.types import Message, Receive, Scope, Send

from .._contracts import LiveRunHandle
from .._events import Frame
from .._kernel.control import RunTicket
from .._kernel.endpoint import HostedEndpoint
from .._kernel.entry import Entry
from .._kernel.host import HarnessHost
from .._kernel.live import RESTARTING, STOPPING
from .._kernel.run import RunContext
from .._log import get_logger
from .._tracing import incoming

log = get_logger(__name__)

SEND_TIMEOUT = 30.0
PING_SECONDS = 15
SHUTDOWN_GRACE = 1.0
"""Seconds a stream has, once the server is stopping, to send its last `error` frame."""
QUEUE_FRAMES = 256
"""Frames a transport may buffer for one slow client (the WebSocket outbox)."""

_CUT_OFF: ContextVar[bool] = ContextVar("atmosphere_sse_cut_off", default=False)
_UNFINISHED = "ASGI callable returned without completing response."


class _CutOffFilter(logging.Filter):
    """Drops uvicorn's "returned without completing response" ERROR for a stream this module
    cut off on purpose (it already said so at INFO); uvicorn logs it in the request's own task,
    so the context variable set there marks exactly that request."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_CUT_OFF.get() and record.getMessage() == _UNFINISHED)


_CUT_OFF_FILTER = _CutOffFilter()
logging.getLogger("uvicorn.error").addFilter(_CUT_OFF_FILTER)


class HarnessEventSource(EventSourceResponse):
    """An `EventSourceResponse` whose reader may be cut off without a traceback.

    A client that takes nothing for `send_timeout` seconds makes sse-starlette raise
    `SendTimeoutError` out of the response, which the ASGI server logs as an unhandled exception
    with its traceback. Being cut off is the designed outcome for a client that stopped reading,
    so it is logged as one INFO line instead; the stream's generator has already been closed
    (cancelling its run, unless an approval holds it) and the server drops the connection.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:
            _CUT_OFF.set(True)
            log.info(
                "SSE client stopped reading; closed its stream",
                path=scope.get("path"),
                client=_client(scope),
                send_timeout=self.send_timeout,
            )


def _client(scope: Scope) -> str | None:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else None


class EventStream(HarnessEventSource):
    """`HarnessEventSource` whose sends carry no per-send cancel scope.

    sse-starlette bounds each send with `anyio.move_on_after` (about 11 us a send on the
    benchmark VM), paid once per frame per reader. Here a send only records when it began, and
    the response's ping task, which already wakes every `ping` seconds, also checks that
    record: a reader whose current send has not returned after `send_timeout` seconds is
    disconnected (the ping task fails and the task group tears the response down, as a
    per-send timeout did). No task is added per reader.

    It overrides two of sse-starlette's private methods (`_send_with_timeout`, `_ping`; written
    against 3.7); `tests/http/test_planning_http.py` and `tests/http/test_hosting_http.py` hold
    the behaviour (pings, a stalled reader cut off) so a change in the library shows up as a
    failing test, not a silent one.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        send_timeout: float,
        closed: Callable[[], None] | None = None,
        **kw: Any,
    ) -> None:
        self._sending_since: float | None = None
        self._closed = closed
        super().__init__(content, send_timeout=send_timeout, **kw)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._closed is not None:
                self._closed()

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        self._sending_since = asyncio.get_running_loop().time()
        try:
            await send(message)
        except BaseException:
            self._send_interrupted = True
            raise
        finally:
            self._sending_since = None

    async def _ping(self, send: Send) -> None:
        loop = asyncio.get_running_loop()
        limit = float(self.send_timeout or 0)
        next_ping = loop.time() + self.ping_interval
        while self.active:
            since = self._sending_since
            now = loop.time()
            if limit and since is not None and now - since >= limit:
                # The same send is still pending: the reader stopped reading.
                self._send_interrupted = True
                raise SendTimeoutError()
            if now >= next_ping:
                next_ping = now + self.ping_interval
                if since is None:
                    await self._send_with_timeout(send, _PING)
                continue
            # Idle, wake for the ping, or after `limit` to look at a send begun meanwhile (with
            # the defaults the ping comes first: no extra wake-ups); sending, at its deadline.
            wake = (
                next_ping
                if not limit
                else min(next_ping, (now if since is None else since) + limit)
            )
            await asyncio.sleep(max(wake - now, 0.0))


_PING: Message = {"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True}


def frame_bytes(frame: Frame) -> bytes:
    """One frame as one SSE event: `id:` its seq, `event:` its type, `data:` the JSON frame
    (one line: `Frame.to_json` escapes line breaks)."""
    return f"id: {frame.seq}\r\nevent: {frame.event}\r\ndata: {frame.to_json()}\r\n\r\n".encode()


def frames_chunk(batch: Sequence[Frame]) -> bytes:
    """The frames ready together, as the one chunk written for them."""
    if len(batch) == 1:
        return frame_bytes(batch[0])
    return b"".join(frame_bytes(frame) for frame in batch)


async def admit(
    host: HarnessHost,
    endpoint: HostedEndpoint,
    *,
    message: str,
    conversation_id: str,
    user_id: str | None,
    multitask: str,
) -> RunTicket | None:
    """Apply a prompt's `multitask` before its run starts, the same way on every transport.

    `enqueue` needs nothing (`None`: the run waits behind the conversation's runs in flight).
    Otherwise the run is stored now (`HarnessHost.submit`) and its ticket returned, for
    `start_prompt`: `reject` raises `RunConflict` while the conversation has a run in flight;
    `interrupt` and `rollback` have asked the caller's runs in flight to stop.
    """
    if multitask == "enqueue":
        return None
    return await host.submit(
        endpoint,
        message=message,
        conversation_id=conversation_id,
        user_id=user_id,
        multitask=multitask,
        start=False,
    )


def start_prompt(
    host: HarnessHost,
    endpoint: HostedEndpoint,
    *,
    message: str,
    conversation_id: str,
    user_id: str | None,
    ticket: RunTicket | None = None,
    headers: Mapping[str, str] | None = None,
    entry: Entry[RunContext] | None = None,
) -> LiveRunHandle:
    """Start one prompt run under `ticket` (from `admit`: its record is stored already; `None`:
    a new one) or `entry` (`HarnessHost.enter`, with its ticket); a `traceparent` among the
    request's `headers` is the run's parent span (the run's task takes the context it starts
    in)."""
    with incoming(headers, enabled=host.settings.groups.tracing.enabled):
        return host.start_run(
            endpoint,
            message=message,
            conversation_id=conversation_id,
            user_id=user_id,
            ticket=ticket,
            entry=entry,
        )


async def run_frames(
    host: HarnessHost,
    endpoint: HostedEndpoint,
    *,
    message: str,
    conversation_id: str,
    user_id: str | None,
    ticket: RunTicket | None = None,
    headers: Mapping[str, str] | None = None,
) -> AsyncGenerator[Frame, None]:
    """One prompt run as the frames it streams, read through its live-run journal.

    Closing the iterator early cancels the run (and waits for it to unwind, so its turn is
    persisted before the caller goes on), unless the run is held by a pending approval: then it
    outlives the reader, as it does for SSE. `ticket` and `headers` as `start_prompt` takes them.
    """
    live = start_prompt(
        host,
        endpoint,
        message=message,
        conversation_id=conversation_id,
        user_id=user_id,
        ticket=ticket,
        headers=headers,
    )
    follower = live.follow(0)
    try:
        async with contextlib.aclosing(follower):
            async for frame in follower:
                yield frame
    finally:
        task = live.task
        if task is not None and not task.done() and not live.held:
            await asyncio.gather(task, return_exceptions=True)


def stream_prompt(
    host: HarnessHost,
    endpoint: HostedEndpoint,
    *,
    message: str,
    conversation_id: str,
    user_id: str | None,
    ticket: RunTicket | None = None,
    headers: Mapping[str, str] | None = None,
    entry: Entry[RunContext] | None = None,
) -> EventSourceResponse:
    """Start one prompt run and stream it from its first frame (its id: `X-Run-Id`);
    `headers` as `run_frames` takes them; `entry` (`HarnessHost.enter`) is its claim and lock,
    begun already (freed if the response never streams)."""
    if entry is not None:
        run = entry.ticket
    else:
        run = ticket or host.control.ticket(
            path=endpoint.path, conversation_id=conversation_id, user_id=user_id
        )

    def start() -> LiveRunHandle:
        if ticket is None:
            run.announce()  # (a held ticket's record is stored already: `HarnessHost.submit`)
        return start_prompt(
            host,
            endpoint,
            message=message,
            conversation_id=conversation_id,
            user_id=user_id,
            ticket=run,
            headers=headers,
            entry=entry,
        )

    return _follow(
        start,
        0,
        conversation_id,
        run.run_id,
        never_opened=entry.abandon if entry is not None else None,
    )


def follow_run(live: LiveRunHandle, after: int) -> EventSourceResponse:
    """Re-attach to a live (or recently finished) run: the frames after seq `after`, then live."""
    return _follow(lambda: live, after, live.conversation_id)


def _follow(
    open_run: Callable[[], LiveRunHandle],
    after: int,
    conversation_id: str,
    run_id: str | None = None,
    never_opened: Callable[[], None] | None = None,
) -> EventSourceResponse:
    stopping = anyio.Event()
    opened = False

    # The run starts inside the generator: a response that never streams never starts one
    # (and `never_opened` undoes what was begun for it).
    async def events() -> AsyncIterator[bytes]:
        nonlocal opened
        opened = True
        live = open_run()
        # When the server stops, the stream ends with an `error` frame saying so (and a
        # durable run is suspended, to resume on restart) instead of just being cut.
        watcher = asyncio.get_running_loop().create_task(_interrupt_on(stopping, live))
        try:
            # The frames ready together go out in one send; a lone frame is sent at once.
            async for batch in live.follow_batches(after):
                yield frames_chunk(batch)
                if len(batch) > 1:
                    # A backlog (a replay) comes batch after batch without the loop ever
                    # running in between, so a client gone after its first frame would not be
                    # noticed until all were written into the dead socket (one asyncio WARNING
                    # each). One turn of the loop per batch lets the server see the disconnect.
                    await asyncio.sleep(0)
        finally:
            watcher.cancel()

    def closed() -> None:
        if not opened and never_opened is not None:
            never_opened()

    return EventStream(
        events(),
        ping=PING_SECONDS,
        send_timeout=SEND_TIMEOUT,
        headers={"X-Conversation-Id": conversation_id} | ({"X-Run-Id": run_id} if run_id else {}),
        shutdown_event=stopping,
        shutdown_grace_period=SHUTDOWN_GRACE,
        closed=closed,
    )


async def _interrupt_on(stopping: anyio.Event, live: LiveRunHandle) -> None:
    await stopping.wait()
    live.interrupt(RESTARTING if live.durable else STOPPING)
