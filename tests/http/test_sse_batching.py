"""Frames ready at the same time leave in one write (one HTTP chunk), not one write a frame."""

from __future__ import annotations

import json
from pathlib import Path

from atmosphere_harness import ScriptedRuntime, StreamingSession, ai_endpoint, prompt
from tests.support import make_app, post_chunks, serve

BURST = 40
PATH = "/atmosphere/burst"


@ai_endpoint(PATH)
class Burst:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        for index in range(BURST):
            await session.emit("burst", {"index": index})


async def test_frames_published_together_are_written_in_one_chunk(workspace: Path) -> None:
    app = make_app([Burst], runtime=ScriptedRuntime(["hi"]), workspace=workspace)
    async with serve(app) as base:
        chunks = await post_chunks(base, PATH)
    body = b"".join(chunks)
    assert body.count(b"event: burst\r\n") == BURST
    assert b'"event":"complete"' in body
    carrying = [chunk for chunk in chunks if b"event: burst" in chunk]
    assert len(carrying) <= BURST // 4, f"{len(carrying)} writes for {BURST} frames ready at once"
    # Every event is whole inside its chunk, in order.
    indexes = [
        json.loads(line[6:])["data"]["index"]
        for chunk in carrying
        for line in chunk.split(b"\r\n")
        if line.startswith(b"data: ")
    ]
    assert indexes == list(range(BURST))
