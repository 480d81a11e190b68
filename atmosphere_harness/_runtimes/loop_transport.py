"""The model client's sockets on the running asyncio loop directly, for streamed answers.

The SDKs' HTTP client reads each chunk of a streamed answer through anyio: every read turns the
socket's reader on and off in the loop's selector (two `epoll_ctl` calls) and opens a cancel
scope for its timeout, which was about a quarter of a busy replica's CPU (`benchmarks/
inflight.py`, py-spy). `LoopBackend` is an `httpcore2` network backend whose connections are
plain asyncio protocols: the socket stays registered while the connection lives, data waits in
a bounded buffer (reading pauses past `HIGH_WATER` bytes), and a read that has to wait only
moves the connection's deadline: one timer per connection stays armed and, when it fires early
(the deadline moved on since), re-arms itself for the new one, instead of a timer made and
cancelled for every chunk. Everything else (pooling, HTTP/1.1, TLS, proxies from the
environment, the SDK's retries) is the same client's.

A streamed answer's body (`Transfer-Encoding: chunked`, no `Content-Encoding`) is then read by
`ChunkedBody`, straight from the connection's buffer: its chunks are cut here, instead of going
through `h11` (an event object, a state machine step) and five layers of async generators
(`httpcore2`'s connection and pool streams, `httpx2`'s) for every token. Once the last chunk
came, `h11` is given that end of the body, so the connection goes back to the pool exactly as
after a body `h11` read itself; a body `h11` already began buffering when the headers came, or
a connection that is not this module's, is read the usual way.
"""

from __future__ import annotations

import asyncio
import math
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import Any

import h11
import httpcore2
import httpx2
from httpcore2._async.connection_pool import PoolByteStream
from httpcore2._async.http11 import HTTP11ConnectionByteStream
from httpx2._transports.default import AsyncResponseStream

READ_TIMEOUT = "timed out reading from the model server"
"""The error a read that waited past its timeout raises (`httpcore2`'s or `httpx2`'s)."""
HIGH_WATER = 256 * 1024
"""Bytes a connection buffers before it stops reading its socket (until they are read)."""
READ_BYTES = 64 * 1024
"""The most `ChunkedBody` takes from the buffer at once (as `httpcore2` reads)."""
MAX_CHUNK_LINE = 4096
"""The longest chunk-size line (or trailer section) `ChunkedBody` accepts."""

SocketOption = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)


class _Protocol(asyncio.Protocol):
    """Buffers what arrives, wakes the reader waiting for it, and says when writes may go on."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.eof = False
        self.error: BaseException | None = None
        self.reading_paused = False
        self.waiter: asyncio.Future[None] | None = None
        self.writable: asyncio.Future[None] | None = None
        self.deadline = 0.0
        """When the read waiting now (`waiter`) times out, on the loop's clock."""
        self.timer: asyncio.TimerHandle | None = None

    def waiting(self, timeout: float | None) -> asyncio.Future[None]:
        """The future the next read waits on (set when data comes), timing out after
        `timeout` seconds (`None`: never); the reader clears `waiter` once it returns."""
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        if timeout is not None:
            self.wait_until(loop, loop.time() + timeout)
        else:
            self.deadline = math.inf
        return waiter

    def wait_until(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Time out the waiting read at `deadline` (the armed timer is kept if it fires first)."""
        self.deadline = deadline
        timer = self.timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self.timer = loop.call_at(deadline, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        waiter, when = self.waiter, self.timer.when() if self.timer is not None else 0.0
        self.timer = None
        if waiter is None or waiter.done():
            return
        if self.deadline <= when:
            waiter.set_exception(TimeoutError())
        elif self.deadline != math.inf:
            self.timer = loop.call_at(self.deadline, self._expire, loop)

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > HIGH_WATER and not self.reading_paused and self.transport:
            self.reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()
        self.stop_timer()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        if self.writable is None or self.writable.done():
            self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class LoopStream(httpcore2.AsyncNetworkStream):
    """One connection: `read` returns what is buffered, or waits (one timer) for the next data."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        protocol = self._protocol
        if not protocol.chunks and not protocol.eof:
            try:
                await protocol.waiting(timeout)
            except TimeoutError:
                raise httpcore2.ReadTimeout(READ_TIMEOUT) from None
            finally:
                protocol.waiter = None
        return self.take(max_bytes)

    def take(self, max_bytes: int) -> bytes:
        """What is buffered, at most `max_bytes` (`b""` at the end; the error that ended the
        connection, if one did): without waiting."""
        protocol = self._protocol
        if protocol.chunks:
            data = protocol.chunks.popleft()
            if len(data) > max_bytes:
                data, rest = data[:max_bytes], data[max_bytes:]
                protocol.chunks.appendleft(rest)
            protocol.buffered -= len(data)
            if protocol.reading_paused and protocol.buffered <= HIGH_WATER // 2:
                protocol.reading_paused = False
                self._transport.resume_reading()
            return data
        if protocol.error is not None:
            raise httpcore2.ReadError(str(protocol.error) or type(protocol.error).__name__)
        return b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        protocol = self._protocol
        if protocol.eof and protocol.error is not None:
            raise httpcore2.WriteError(str(protocol.error) or type(protocol.error).__name__)
        self._transport.write(buffer)
        writable = protocol.writable
        if writable is not None and not writable.done():
            try:
                await asyncio.wait_for(asyncio.shield(writable), timeout)
            except TimeoutError:
                raise httpcore2.WriteTimeout("timed out writing to the model server") from None

    async def aclose(self) -> None:
        self._protocol.stop_timer()
        self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(
                    self._transport, self._protocol, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError:
            self._transport.close()
            raise httpcore2.ConnectTimeout("timed out in the TLS handshake") from None
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise httpcore2.ConnectError(str(exc)) from exc
        if transport is None:
            raise httpcore2.ConnectError("the connection closed during the TLS handshake")
        return LoopStream(transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        if info == "is_readable":
            # A pooled connection the server closed, or that holds unread bytes, is not reused.
            return self._protocol.eof or bool(self._protocol.chunks)
        return None


class LoopBackend(httpcore2.AsyncNetworkBackend):
    """`httpcore2`'s network backend on the running asyncio loop (see the module docstring)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local = (local_address, 0) if local_address else None
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(
                    _Protocol, host, port, local_addr=local
                )
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"timed out connecting to {host}:{port}") from None
        except OSError as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        _apply(transport, socket_options)
        return LoopStream(transport, protocol)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_unix_connection(_Protocol, path)
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"timed out connecting to {path}") from None
        except OSError as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        _apply(transport, socket_options)
        return LoopStream(transport, protocol)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _apply(transport: asyncio.BaseTransport, options: Iterable[SocketOption] | None) -> None:
    raw: socket.socket | None = transport.get_extra_info("socket")
    if raw is not None:
        for option in options or ():
            raw.setsockopt(*option)


class ChunkedBody(httpx2.AsyncByteStream):
    """A chunked response body read from its `LoopStream` directly (the module docstring).

    The parser's state lives here, so a second iteration (the SDK reading what follows the
    answer's last event, to reuse the connection) goes on where the first one stopped. Read
    errors are `httpx2`'s, as the usual path raises them; a malformed body is a
    `RemoteProtocolError`, and its connection is closed rather than reused.

    `h11` may hold the body's first bytes already (they came with the headers): they are read
    here as well, and `h11` gets, once a chunk ends past them, the bytes up to that chunk's
    end, so that what it holds is whole chunks; at the body's end it is given the last chunk
    and reads the whole body it holds (its `Data` events are dropped: they were read here).
    """

    def __init__(
        self,
        closer: AsyncResponseStream,
        state: h11.Connection,
        network: LoopStream,
        timeout: float | None,
        held: bytes,
    ) -> None:
        self._closer = closer
        self._h11 = state
        self._network = network
        self._timeout = timeout
        self._buffer = held
        """Bytes read and not parsed yet."""
        self._left = 0
        """Bytes of the current chunk's data still to come."""
        self._started = False
        """A chunk came before: a CR LF ends its data before the next size line."""
        self._done = False
        self._held = len(held)
        """How much of the body `h11` holds (from its start)."""
        self._position = 0
        """Where `_buffer` starts in the body."""
        self._owed: bytearray | None = bytearray() if held else None
        """While `h11` holds part of a chunk: the bytes parsed here since the end of what it
        holds (`None` once it holds whole chunks)."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while data := await self.next_data():
            yield data

    async def next_data(self) -> bytes:
        """The next piece of the body's data, as soon as some came; `b""` once it ended."""
        while True:
            left = self._left
            if left:
                buffer = self._buffer or await self._read()
                if len(buffer) <= left:
                    self._left = left - len(buffer)
                    self._take(buffer, len(buffer))
                    return buffer
                self._left = 0
                return self._take(buffer, left)
            if self._done:
                return b""
            if self._started and self._owed is None:
                buffer = self._buffer
                if buffer == b"\r\n":
                    # The last chunk's CR LF alone: the next chunk comes with the next read,
                    # looked at as it came (no copy of it behind that CR LF).
                    buffer = await self._read()
                    data = self._whole_chunk(buffer, 0)
                    if data is not None:
                        return data
                    self._buffer = b"\r\n" + buffer
                else:
                    if len(buffer) < 2:
                        buffer = self._buffer = buffer + await self._read()
                    if buffer.startswith(b"\r\n"):
                        data = self._whole_chunk(buffer, 2)
                        if data is not None:
                            return data
            await self._next_chunk()

    def _whole_chunk(self, buffer: bytes, start: int) -> bytes | None:
        """The data of the next chunk, whose size line begins at `start` (past the CR LF that
        ended the last one), when `buffer` holds all of it (a model's token comes so, one chunk
        a read): taken in one step; `None` leaves it to `_next_chunk`, which takes any chunk
        piece by piece. Only once `h11` holds whole chunks (`_owed` is `None`: what it is owed
        is not counted here)."""
        end = buffer.find(b"\r\n", start)
        if end <= start:
            return None
        size = _chunk_size(buffer[start:end])
        if not size:
            return None  # (a size line `_next_chunk` rejects, or the last chunk)
        stop = end + 2 + size
        if len(buffer) < stop:
            return None  # (one still arriving)
        self._buffer = buffer[stop:]
        return buffer[end + 2 : stop]

    def _take(self, buffer: bytes, size: int) -> bytes:
        """The first `size` bytes of `buffer`, parsed: the buffer keeps the rest."""
        taken = buffer[:size]
        self._buffer = buffer[size:]
        if self._owed is not None:
            self._owed += taken[max(self._held - self._position, 0) :]
        self._position += size
        return taken

    async def _next_chunk(self) -> None:
        """Take the CR LF after the last chunk's data and the next chunk's size line; at the
        last chunk, its trailer section too, then have `h11` end the body."""
        if self._started:
            while len(self._buffer) < 2:
                self._buffer += await self._read()
            if not self._buffer.startswith(b"\r\n"):
                raise _malformed("chunk data longer than its size")
            self._take(self._buffer, 2)
        self._started = True
        owed = self._owed
        if owed is not None and self._position >= self._held:
            # `h11` holds part of this body: with these bytes, whole chunks. (Never `b""`:
            # to `h11` that is the connection's end.)
            if owed:
                self._h11.receive_data(bytes(owed))
            self._owed = None
        buffer = self._buffer
        while (end := buffer.find(b"\r\n")) < 0:
            if len(buffer) > MAX_CHUNK_LINE:
                raise _malformed("a chunk size line that never ends")
            buffer = self._buffer = buffer + await self._read()
        size = _chunk_size(buffer[:end])
        if size is None:
            raise _malformed(f"illegal chunk header: {buffer[:end][:40]!r}")
        self._take(buffer, end + 2)
        self._left = size
        if self._left:
            return
        # The last chunk: a trailer section (header lines) until an empty line.
        buffer = self._buffer
        while True:
            if buffer.startswith(b"\r\n"):
                stop = 2
                break
            stop = buffer.find(b"\r\n\r\n")
            if stop >= 0:
                stop += 4
                break
            if len(buffer) > MAX_CHUNK_LINE:
                raise _malformed("a trailer section that never ends")
            buffer = self._buffer = buffer + await self._read()
        trailer = self._take(buffer, stop)
        self._done = True
        self._end(b"0\r\n" + trailer if self._owed is None else bytes(self._owed))

    def _end(self, rest: bytes) -> None:
        """Give `h11` the rest of the body and have it read what it holds to the end."""
        try:
            if rest:
                self._h11.receive_data(rest)
            while type(event := self._h11.next_event()) is h11.Data:
                pass
        except h11.RemoteProtocolError as exc:
            raise httpx2.RemoteProtocolError(str(exc)) from exc
        if type(event) is not h11.EndOfMessage:
            raise _malformed("the body did not end where its last chunk said")

    async def _read(self) -> bytes:
        # `LoopStream.read`, its wait awaited here (one coroutine less a token).
        network = self._network
        protocol = network._protocol
        if not protocol.chunks and not protocol.eof:
            try:
                await protocol.waiting(self._timeout)
            except TimeoutError:
                raise httpx2.ReadTimeout(READ_TIMEOUT) from None
            finally:
                protocol.waiter = None
        try:
            data = network.take(READ_BYTES)
        except httpcore2.ReadError as exc:
            raise httpx2.ReadError(str(exc)) from exc
        if not data:
            raise httpx2.RemoteProtocolError(
                "peer closed connection without sending complete message body "
                "(incomplete chunked read)"
            )
        return data

    async def aclose(self) -> None:
        await self._closer.aclose()


HEX_DIGITS = b"0123456789abcdefABCDEF"
"""A chunk size's digits: 1 to 16 of these (checked by stripping them, cheaper a token than a
regular expression)."""


def _chunk_size(line: bytes) -> int | None:
    """The size a chunk's size line (without its CR LF) gives, extensions ignored; `None` when
    it is malformed."""
    if not line.strip(HEX_DIGITS) and len(line) <= 16:
        return int(line, 16) if line else None  # (the usual line: its digits alone)
    digits = line.split(b";", 1)[0].rstrip(b" \t")
    if not 0 < len(digits) <= 16 or digits.strip(HEX_DIGITS):
        return None
    return int(digits, 16)


def _malformed(what: str) -> httpx2.RemoteProtocolError:
    return httpx2.RemoteProtocolError(f"malformed chunked body from the model server: {what}")


def chunked_body(response: httpx2.Response, request: httpx2.Request) -> ChunkedBody | None:
    """The `ChunkedBody` that reads `response`, or `None` when it is not this module's to read:
    not chunked (or encoded), or not on a `LoopStream`."""
    headers = response.headers
    if headers.get("transfer-encoding", "").lower() != "chunked" or headers.get(
        "content-encoding", "identity"
    ).lower() not in ("", "identity"):
        return None
    stream = response.stream
    if type(stream) is not AsyncResponseStream:
        return None
    pooled = getattr(stream, "_httpcore_stream", None)
    inner = getattr(pooled, "_stream", None) if type(pooled) is PoolByteStream else None
    if type(inner) is not HTTP11ConnectionByteStream:
        return None
    connection = getattr(inner, "_connection", None)
    state = getattr(connection, "_h11_state", None)
    network = getattr(connection, "_network_stream", None)
    if (
        type(state) is not h11.Connection
        or type(network) is not LoopStream
        or state.their_state is not h11.SEND_BODY
    ):
        return None
    held, closed = state.trailing_data
    if closed:
        return None
    timeouts = request.extensions.get("timeout") or {}
    return ChunkedBody(stream, state, network, timeouts.get("read"), held)


class LoopTransport(httpx2.AsyncHTTPTransport):
    """`httpx2.AsyncHTTPTransport` (certificates from the environment, HTTP/1.1, `limits`) whose
    connections use `LoopBackend`, and whose chunked bodies `ChunkedBody` reads."""

    def __init__(self, limits: httpx2.Limits) -> None:
        super().__init__(limits=limits)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=LoopBackend(),
        )

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        body = chunked_body(response, request)
        if body is not None:
            response.stream = body
        return response
