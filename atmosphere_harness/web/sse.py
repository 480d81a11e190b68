"""Server-sent events: a prompt run as a `text/event-stream`, and `run_frames`, the one way
every transport (SSE, WebSocket, AG-UI) reads a run.

The run executes in its own task and pushes frames into a bounded queue that the response drains.
A slow client therefore slows the run down (back-pressure) instead of growing memory; a client
that stops reading for `SEND_TIMEOUT` seconds, or disconnects, cancels the run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent

from ..endpoint import HostedEndpoint
from ..events import Frame
from ..host import HarnessHost
from ..run import execute_prompt

SEND_TIMEOUT = 30.0
PING_SECONDS = 15
QUEUE_FRAMES = 256


def frame_event(frame: Frame) -> ServerSentEvent:
    """One frame as one SSE event: `event:` its type, `id:` its seq, `data:` the JSON frame."""
    return ServerSentEvent(data=frame.to_json(), event=frame.event, id=str(frame.seq))


async def run_frames(
    host: HarnessHost,
    endpoint: HostedEndpoint,
    *,
    message: str,
    conversation_id: str,
    user_id: str | None,
) -> AsyncGenerator[Frame, None]:
    """One prompt run as the frames it streams; closing the iterator early cancels the run.

    Every transport (SSE, WebSocket, AG-UI) reads a run through this, so back-pressure and
    cancellation behave the same on all of them.
    """
    queue: asyncio.Queue[Frame | None] = asyncio.Queue(maxsize=QUEUE_FRAMES)
    task = asyncio.create_task(
        execute_prompt(
            host,
            endpoint,
            message=message,
            conversation_id=conversation_id,
            user_id=user_id,
            sink=queue.put,
        ),
        name=f"prompt:{endpoint.path}:{conversation_id}",
    )
    task.add_done_callback(lambda _: _close(queue))
    try:
        while True:
            frame = await queue.get()
            if frame is None:
                break
            yield frame
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def stream_prompt(
    host: HarnessHost,
    endpoint: HostedEndpoint,
    *,
    message: str,
    conversation_id: str,
    user_id: str | None,
) -> EventSourceResponse:
    async def events() -> AsyncIterator[ServerSentEvent]:
        frames = run_frames(
            host, endpoint, message=message, conversation_id=conversation_id, user_id=user_id
        )
        async with contextlib.aclosing(frames):
            async for frame in frames:
                yield frame_event(frame)

    return EventSourceResponse(
        events(),
        ping=PING_SECONDS,
        send_timeout=SEND_TIMEOUT,
        headers={"X-Conversation-Id": conversation_id},
    )


def _close(queue: asyncio.Queue[Frame | None]) -> None:
    """Wake the reader after the run ended, even if the queue is full."""
    try:
        queue.put_nowait(None)
    except asyncio.QueueFull:
        asyncio.get_running_loop().create_task(queue.put(None))
