"""A prompt that floods its stream, for the slow-client tests of every transport.

`FirehoseEndpoint` emits `FRAMES` padded frames as fast as its stream takes them, counting them
in `Firehose.emitted` and setting `Firehose.cancelled` when its run is cancelled; a client that
stops reading shows whether the run waits for it (bounded buffers) and is cut off in the end.
"""

from __future__ import annotations

import asyncio

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
