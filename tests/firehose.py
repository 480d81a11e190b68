"""A prompt that floods its stream, for the slow-client tests of every transport.

`FirehoseEndpoint` emits `FRAMES` padded frames as fast as its stream takes them, counting them
in `Firehose.emitted` and setting `Firehose.cancelled` when its run is cancelled; a client that
stops reading shows whether the run waits for it (bounded buffers) and is cut off in the end.
"""

from __future__ import annotations

import asyncio
import socket

from atmosphere_harness import StreamingSession, ai_endpoint, prompt

FRAMES = 4000
PAD = "x" * 8192
PATH = "/atmosphere/firehose"


class Firehose:
    """Counts what its prompt emitted, and whether it was cancelled."""

    emitted = 0
    cancelled: asyncio.Event

    @classmethod
    def reset(cls) -> None:
        cls.emitted = 0
        cls.cancelled = asyncio.Event()


@ai_endpoint(PATH)
class FirehoseEndpoint:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        try:
            for index in range(FRAMES):
                await session.emit("chunk", {"index": index, "pad": PAD})
                Firehose.emitted = index + 1
        except asyncio.CancelledError:
            Firehose.cancelled.set()
            raise


async def settled(seconds: float = 0.3) -> int:
    """Wait until the firehose stops making progress; return how far it got."""
    last = -1
    while Firehose.emitted != last:
        last = Firehose.emitted
        await asyncio.sleep(seconds)
    return last


async def slow_connection(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection to `base` with small buffers, for a client that stops reading.

    The stream reader stops reading the socket once 128 KiB wait in it, so the server's
    writes back up through the kernel buffers into uvicorn's flow control.
    """
    host, port = base.removeprefix("http://").split(":")
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.setblocking(False)
    await asyncio.get_running_loop().sock_connect(raw, (host, int(port)))
    return await asyncio.open_connection(sock=raw, limit=64 * 1024)
