"""A TCP proxy on loopback that can lose an acknowledgement on purpose.

`LossyProxy(host, port)` forwards every connection to the server behind it, byte for byte. Armed
with `lose_reply_containing(pattern)`, the next chunk the *server* sends that contains `pattern`
(PostgreSQL's `CommandComplete` tag of a `COMMIT`, say) is not forwarded: the proxy closes both
sides of that connection instead. The server has done the work (the transaction committed); the
client sees its connection die while it waits for the answer, which is exactly a lost
acknowledgement. `lose_reply_to(request)` picks the reply by what the client sent instead.
Every later connection, including the client's retry, is forwarded normally.
"""

from __future__ import annotations

import asyncio
import contextlib


class LossyProxy:
    """Forwards `127.0.0.1:<port>` to `target`; cuts one reply on demand (module docstring)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.cuts = 0
        """Replies lost so far."""
        self._pattern: bytes | None = None
        self._request: bytes | None = None
        self._reply = b""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> LossyProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    def lose_reply_containing(self, pattern: bytes) -> None:
        """Drop the next server chunk holding `pattern` and cut that connection (once)."""
        self._pattern = pattern

    def lose_reply_to(self, request: bytes, reply: bytes = b"") -> None:
        """On the connection whose next request holds `request` (a value only that statement
        carries, e.g. a message's text: asyncpg sends a prepared statement's text once per
        connection, its parameters every time), drop the server's next answer holding `reply`
        (any answer when empty; `COMMIT` for the end of that statement's transaction) and cut
        the connection (once)."""
        self._request, self._reply = request, reply

    def url(self, database_url: str) -> str:
        """`database_url` pointed at this proxy instead of the server."""
        host, port = self.target
        return database_url.replace(f"@{host}:{port}/", f"@127.0.0.1:{self.port}/")

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            self._tasks.discard(task)
            return
        try:
            marked: list[bool] = [False]
            upward = asyncio.create_task(
                self._pipe(reader, up_writer, from_server=False, marked=marked)
            )
            downward = asyncio.create_task(
                self._pipe(up_reader, writer, from_server=True, marked=marked)
            )
            await asyncio.wait({upward, downward}, return_when=asyncio.FIRST_COMPLETED)
            for side in (upward, downward):
                side.cancel()
                with contextlib.suppress(BaseException):
                    await side
        finally:
            for end in (writer, up_writer):
                end.close()
            self._tasks.discard(task)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        from_server: bool,
        marked: list[bool],
    ) -> None:
        """Forward one direction; `marked[0]`: this connection's next answer is to be lost."""
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            request = self._request
            if not from_server and request is not None and request in chunk:
                self._request = None
                marked[0] = True
            pattern = self._pattern
            lose = (marked[0] and self._reply in chunk) or (
                pattern is not None and pattern in chunk
            )
            if from_server and lose:
                if marked[0]:
                    marked[0] = False
                else:
                    self._pattern = None
                self.cuts += 1
                return  # the reply is lost: the caller closes both sides
            writer.write(chunk)
            await writer.drain()
