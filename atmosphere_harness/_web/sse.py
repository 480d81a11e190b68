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
import functools
import logging
import math
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Mapping,
    Sequence,
)
from contextvars import ContextVar
from json.encoder import encode_basestring
from typing import Any

import anyio
from sse_starlette import EventSourceResponse
from sse_starlette.sse import (
    AppStatus,
    SendTimeoutError,
    _ensure_watcher_started_on_this_loop,
    _get_shutdown_state,
)
from starlette.types import Message, Receive, Scope, Send

from .._contracts import LiveRunHandle
from .._events import TEXT, Frame, line_safe
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
            self._cut_off(scope)

    def _cut_off(self, scope: Scope) -> None:
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
    """`HarnessEventSource` streamed by the request's own task and one watcher task.

    sse-starlette serves a response with four tasks in an anyio task group (the stream, the
    pings, the server's exit signal, the client's disconnect), each with its cancel scope and
    handle, and bounds each send with `anyio.move_on_after` (about 11 us a send on the benchmark
    VM). A run in flight holds a response for as long as it streams, so this one does the same
    work with less: the request's task writes the stream (its content's chunks, or batches of a
    run's frames written as one chunk each, sent as they come); one task waits for the client to
    disconnect; a timer (re-armed, one per response) sends the pings and cuts off a reader whose
    current send has not returned after `send_timeout` seconds; the server's exit signal is
    sse-starlette's one watcher per process, which calls `stopping` and, after the shutdown
    grace, ends the stream. Whatever ends it (the client gone, cut off, the server stopping),
    the stream's generator is closed at once, which cancels its run unless an approval holds it.

    It overrides sse-starlette's private pieces (`_stream_response`, `_send_with_timeout`) and
    uses the state they share with the rest of it and the shutdown watcher's (written against
    3.7); `tests/http/test_planning_http.py`, `tests/http/test_hosting_http.py`,
    `tests/http/test_stream_disconnect.py` and the durable restart tests hold the behaviour
    (pings, a stalled reader cut off, a client that leaves, the shutdown frame) so a change in
    the library shows up as a failing test, not a silent one.
    """

    def __init__(
        self,
        content: AsyncIterable[bytes] | AsyncIterable[list[Frame]],
        *,
        send_timeout: float,
        run: _RunFrames | None = None,
        **kw: Any,
    ) -> None:
        self._sending_since: float | None = None
        self._run = run
        """A run's frames (the content): told when the response is closed and when the server
        shuts down."""
        self._ended: str | None = None
        """Why the stream task was cancelled by this response (`_end`), if it was."""
        self._streaming: asyncio.Task[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._pinging: asyncio.Task[None] | None = None
        self._send: Send | None = None
        """The response's `send`, for the pings (`_tick`)."""
        self._next_ping = math.inf
        self._content: AsyncIterable[bytes | list[Frame]] = content
        super().__init__(content, send_timeout=send_timeout, **kw)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # One coroutine for the whole response (a run in flight keeps each it awaits through).
        try:
            if scope["type"] != "http" or scope["method"].upper() == "HEAD":
                await super().__call__(scope, receive, send)
                return
            loop = asyncio.get_running_loop()
            task = self._streaming = asyncio.current_task()
            assert task is not None
            watcher = loop.create_task(self._watch(receive))
            exit_signal = _ExitSignal(self)
            state = _get_shutdown_state()
            state.events.add(exit_signal)  # type: ignore[arg-type]
            _ensure_watcher_started_on_this_loop()
            if AppStatus.should_exit:
                exit_signal.set()
            self._send = send
            self._next_ping = loop.time() + (self.ping_interval or math.inf)
            self._tick()
            try:
                await self._stream_response(send)
            except asyncio.CancelledError:
                if self._ended is None:
                    raise  # (the server cancelled the request)
                task.uncancel()
                if self._ended == "timeout":
                    self._cut_off(scope)
                    return
            finally:
                self._streaming = None
                state.events.discard(exit_signal)
                exit_signal.cancel()
                watcher.cancel()
                if self._timer is not None:
                    self._timer.cancel()
                if self._pinging is not None:
                    self._pinging.cancel()
            # As sse-starlette: a stream cut short by the server's exit still ends its body.
            if (
                self._response_started
                and not self._response_complete
                and not self._client_disconnected
                and not self._send_interrupted
            ):
                with contextlib.suppress(OSError):
                    await self._send_with_timeout(
                        send, {"type": "http.response.body", "body": b"", "more_body": False}
                    )
                    self._response_complete = True
            if self.background is not None:
                await self.background()
        finally:
            if self._run is not None:
                self._run.closed()

    async def _watch(self, receive: Receive) -> None:
        """sse-starlette's disconnect listener (the state it sets, its close handler), then the
        stream's end: no done callback (and its context) a run in flight would keep."""
        try:
            await self._listen_for_disconnect(receive)
        except Exception as exc:
            log.info("SSE client's connection failed; closed its stream", error=exc)
        self._end("disconnect")

    def _end(self, why: str) -> None:
        """Stop the stream (cancel its task) while it streams; the first reason wins."""
        if self._streaming is not None and self._ended is None:
            self._ended = why
            self._streaming.cancel()

    def _tick(self) -> None:
        """The pings and the send timeout: one timer, re-armed for the next thing to look at."""
        if self._streaming is None:
            return
        loop = asyncio.get_running_loop()
        limit = float(self.send_timeout or 0)
        since = self._sending_since
        next_ping = self._next_ping
        now = loop.time()
        if limit and since is not None and now - since >= limit:
            # The same send is still pending: the reader stopped reading.
            self._send_interrupted = True
            self._end("timeout")
            return
        if now >= next_ping:
            next_ping = self._next_ping = now + self.ping_interval
            send = self._send
            if since is None and self.active and self._pinging is None and send is not None:
                self._pinging = loop.create_task(self._send_ping(send))
        # Idle, wake for the ping, or after `limit` to look at a send begun meanwhile (with the
        # defaults the ping comes first: no extra wake-ups); sending, at its deadline.
        wake = next_ping if not limit else min(next_ping, (now if since is None else since) + limit)
        if wake != math.inf:
            self._timer = loop.call_at(max(wake, now), self._tick)

    async def _stream_response(self, send: Send) -> None:
        """sse-starlette's writer, a send lighter: each chunk the content gives (or batch of
        frames, written as one chunk) is sent as it is, its send timed for `_tick`, no encoding
        step, log call or coroutine around it. A send that fails closes the content (bounded
        by `cleanup_timeout`) before the error goes on, as sse-starlette does."""
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        self._response_started = True
        time = asyncio.get_running_loop().time
        content: AsyncIterator[bytes | list[Frame]] = aiter(self._content)
        async for item in content:
            self._sending_since = time()
            try:
                chunk = item if isinstance(item, bytes) else frames_chunk(item)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except BaseException:
                self._send_interrupted = True
                await self._close_content(content)
                raise
            finally:
                self._sending_since = None
            if not isinstance(item, bytes) and len(item) > 1:
                # A backlog (a replay) comes batch after batch without the loop ever running
                # in between, so a client gone after its first frame would not be noticed until
                # all were written into the dead socket (one asyncio WARNING each). One turn of
                # the loop per batch lets the server see the disconnect.
                await asyncio.sleep(0)
        async with self._send_lock:
            # As sse-starlette: `active` flips only once the closing send returned.
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except BaseException:
                self._send_interrupted = True
                raise
            self._response_complete = True
            self.active = False

    async def _close_content(self, content: AsyncIterator[Any]) -> None:
        aclose = getattr(content, "aclose", None)
        if aclose is None:
            return
        with anyio.move_on_after(self._cleanup_timeout, shield=True) as scope:
            try:
                await aclose()
            except Exception:
                log.exception("closing an SSE stream's content after a failed send failed")
        if scope.cancel_called:
            log.warning(
                "an SSE stream's content was not closed in time", seconds=self._cleanup_timeout
            )

    async def _send_ping(self, send: Send) -> None:
        try:
            async with self._send_lock:
                if self.active and self._sending_since is None:
                    await self._send_with_timeout(send, _PING)
        except Exception as exc:
            # The stream's own task sees the connection fail too, and ends the response.
            log.info("SSE ping not sent", error=str(exc) or type(exc).__name__)
        finally:
            self._pinging = None

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        self._sending_since = asyncio.get_running_loop().time()
        try:
            await send(message)
        except BaseException:
            self._send_interrupted = True
            raise
        finally:
            self._sending_since = None


class _ExitSignal:
    """What sse-starlette's shutdown watcher sets for one `EventStream` (in place of an
    `anyio.Event` and a task waiting on it): `stopping` now, the stream's end after the grace."""

    def __init__(self, stream: EventStream) -> None:
        self._stream = stream
        self._grace: asyncio.TimerHandle | None = None
        self._set = False

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        stream = self._stream
        if stream._run is not None:
            stream._run.stopping()
        self._grace = asyncio.get_running_loop().call_later(
            stream._shutdown_grace_period, stream._end, "exit"
        )

    def cancel(self) -> None:
        if self._grace is not None:
            self._grace.cancel()


_PING: Message = {"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True}


def frame_bytes(frame: Frame) -> bytes:
    """One frame as one SSE event: `id:` its seq, `event:` its type, `data:` the JSON frame
    (one line: `Frame.to_json` escapes line breaks)."""
    data = frame.data
    if frame.event == TEXT and len(data) == 1 and type(text := data.get("text")) is str:
        # A token: its JSON written around its text (the same bytes `to_json` gives).
        seq = frame.seq
        quoted = encode_basestring(text)
        return (
            f'id: {seq}\r\nevent: text\r\ndata: {{"event":"text","data":{{"text":'
            f"{quoted if quoted.isascii() else line_safe(quoted)}}},"
            f'{_ids(frame.session_id, frame.conversation_id)}"seq":{seq}}}\r\n\r\n'
        ).encode()
    return f"id: {frame.seq}\r\nevent: {frame.event}\r\ndata: {frame.to_json()}\r\n\r\n".encode()


@functools.lru_cache(maxsize=1024)
def _ids(session_id: str, conversation_id: str) -> str:
    """`"sessionId":...,"conversationId":...,` as a frame's JSON spells them."""
    return (
        f'"sessionId":{line_safe(encode_basestring(session_id))},'
        f'"conversationId":{line_safe(encode_basestring(conversation_id))},'
    )


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
    start = functools.partial(
        _start_streamed,
        host,
        endpoint,
        message,
        conversation_id,
        user_id,
        run,
        ticket is None,
        headers,
        entry,
    )
    return _follow(
        start,
        0,
        conversation_id,
        run.run_id,
        never_opened=entry.abandon if entry is not None else None,
    )


def _start_streamed(
    host: HarnessHost,
    endpoint: HostedEndpoint,
    message: str,
    conversation_id: str,
    user_id: str | None,
    ticket: RunTicket,
    announce: bool,
    headers: Mapping[str, str] | None,
    entry: Entry[RunContext] | None,
) -> LiveRunHandle:
    """`stream_prompt`'s run, started as its response first asks for its frames."""
    if announce:
        ticket.announce()  # (a held ticket's record is stored already: `HarnessHost.submit`)
    return start_prompt(
        host,
        endpoint,
        message=message,
        conversation_id=conversation_id,
        user_id=user_id,
        ticket=ticket,
        headers=headers,
        entry=entry,
    )


def follow_run(live: LiveRunHandle, after: int) -> EventSourceResponse:
    """Re-attach to a live (or recently finished) run: the frames after seq `after`, then live."""
    return _follow(lambda: live, after, live.conversation_id)


class _RunFrames:
    """A run's frames for its `EventStream`, the frames ready together in one batch (one send;
    a lone frame is sent at once). The run starts (`open_run`) when they are first asked for:
    a response that never streams never starts one (and `never_opened` undoes what was begun
    for it). Both are let go once the run started (a run in flight keeps neither)."""

    def __init__(
        self,
        open_run: Callable[[], LiveRunHandle],
        after: int,
        never_opened: Callable[[], None] | None,
    ) -> None:
        self._open_run: Callable[[], LiveRunHandle] | None = open_run
        self._after = after
        self._never_opened = never_opened
        self._live: LiveRunHandle | None = None
        self._stopped = False

    def __aiter__(self) -> AsyncIterator[list[Frame]]:
        open_run = self._open_run
        if open_run is None:
            raise RuntimeError("a run's frames are streamed once")
        self._open_run = self._never_opened = None
        live = self._live = open_run()
        if self._stopped:
            self.stopping()
        return live.follow_batches(self._after)

    def stopping(self) -> None:
        # When the server stops, the stream ends with an `error` frame saying so (and a
        # durable run is suspended, to resume on restart) instead of just being cut.
        self._stopped = True
        live = self._live
        if live is not None:
            live.interrupt(RESTARTING if live.durable else STOPPING)

    def closed(self) -> None:
        if self._never_opened is not None:
            self._never_opened()


def _follow(
    open_run: Callable[[], LiveRunHandle],
    after: int,
    conversation_id: str,
    run_id: str | None = None,
    never_opened: Callable[[], None] | None = None,
) -> EventSourceResponse:
    frames = _RunFrames(open_run, after, never_opened)
    return EventStream(
        frames,
        ping=PING_SECONDS,
        send_timeout=SEND_TIMEOUT,
        headers={"X-Conversation-Id": conversation_id} | ({"X-Run-Id": run_id} if run_id else {}),
        shutdown_grace_period=SHUTDOWN_GRACE,
        run=frames,
    )
