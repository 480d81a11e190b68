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
"""

from __future__ import annotations

import asyncio
import math
import socket
import ssl
from collections import deque
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2

HIGH_WATER = 256 * 1024
"""Bytes a connection buffers before it stops reading its socket (until they are read)."""

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
            loop = asyncio.get_running_loop()
            waiter = protocol.waiter = loop.create_future()
            if timeout is not None:
                protocol.wait_until(loop, loop.time() + timeout)
            else:
                protocol.deadline = math.inf
            try:
                await waiter
            except TimeoutError:
                raise httpcore2.ReadTimeout("timed out reading from the model server") from None
            finally:
                protocol.waiter = None
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


class LoopTransport(httpx2.AsyncHTTPTransport):
    """`httpx2.AsyncHTTPTransport` (certificates from the environment, HTTP/1.1, `limits`) whose
    connections use `LoopBackend`."""

    def __init__(self, limits: httpx2.Limits) -> None:
        super().__init__(limits=limits)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=LoopBackend(),
        )
