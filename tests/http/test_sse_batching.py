"""Frames ready at the same time leave in one write (one HTTP chunk), not one write a frame."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from atmosphere_harness import ScriptedRuntime, StreamingSession, ai_endpoint, prompt
from tests.support import make_app, serve

BURST = 40
PATH = "/atmosphere/burst"


@ai_endpoint(PATH)
class Burst:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        for index in range(BURST):
            await session.emit("burst", {"index": index})


async def read_chunks(base: str) -> list[bytes]:
    """`POST P` over a raw socket; the response body's HTTP chunks, as sent."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps({"message": "go"}).encode()
    writer.write(
        f"POST {PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    chunks: list[bytes] = []
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        chunks.append(rest[:size])
        rest = rest[size + 2 :]
    return chunks


async def test_frames_published_together_are_written_in_one_chunk(workspace: Path) -> None:
    app = make_app([Burst], runtime=ScriptedRuntime(["hi"]), workspace=workspace)
    async with serve(app) as base:
        chunks = await read_chunks(base)
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
