"""Two real uvicorn processes on one workspace root and one backend, and an SSE reader.

Shared by the two-replica tests of each backend: `pair(kind, workspace, logs, env)` starts
replica A and B with the same environment (the backend's URL), and `read_sse` reads an event
stream until a condition holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from tests.reliability.server import ServerProcess

ADMIN_TOKEN = "scaleout-admin-token"
PATH = "/atmosphere/agent/assistant"
USER = {"X-User-Id": "alice"}


@dataclass
class SseEvent:
    id: str | None
    event: str
    data: Any


@contextlib.contextmanager
def two_replicas(
    kind: str, workspace: Path, logs: Path, env: Mapping[str, str]
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Replicas A and B; both killed when the block ends (their state is the backend's)."""
    full = {"ATMOSPHERE_ADMIN_TOKEN": ADMIN_TOKEN, **env}
    a = ServerProcess(kind, workspace, logs / "a.log", full).start()
    try:
        b = ServerProcess(kind, workspace, logs / "b.log", full).start()
        try:
            yield a, b
        finally:
            b.kill()
    finally:
        a.kill()


async def read_sse(
    client: httpx2.AsyncClient,
    url: str,
    *,
    until: Callable[[list[SseEvent]], bool],
    headers: Mapping[str, str] | None = None,
    started: asyncio.Event | None = None,
    timeout: float = 30.0,
) -> list[SseEvent]:
    """The events of `url` until `until(events)` holds (hang guard: `timeout`)."""
    events: list[SseEvent] = []
    async with asyncio.timeout(timeout):
        async with client.stream("GET", url, headers=dict(headers or {})) as response:
            assert response.status_code == 200, await response.aread()
            event_id: str | None = None
            name = "message"
            async for line in response.aiter_lines():
                if line.startswith("id:"):
                    event_id = line[3:].strip()
                elif line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    events.append(SseEvent(event_id, name, json.loads(line[5:].strip())))
                    if name.startswith("plan-snapshot") and started is not None:
                        started.set()
                    if until(events):
                        return events
                elif not line:
                    event_id, name = None, "message"
    return events


async def prompt(
    client: httpx2.AsyncClient,
    base: str,
    message: str,
    conversation_id: str,
    *,
    headers: Mapping[str, str] = USER,
    on_frame: Callable[[dict[str, Any]], Any] | None = None,
    path: str = PATH,
) -> list[dict[str, Any]]:
    """POST one prompt, its frames up to the terminal one (`on_frame` may be async)."""
    frames: list[dict[str, Any]] = []
    body = {"message": message, "conversationId": conversation_id}
    async with client.stream("POST", base + path, json=body, headers=dict(headers)) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            frame = json.loads(line[5:].strip())
            frames.append(frame)
            if on_frame is not None:
                outcome = on_frame(frame)
                if asyncio.iscoroutine(outcome):
                    await outcome
            if frame["event"] in ("complete", "error"):
                break
    return frames


def summary(frames: list[dict[str, Any]]) -> str:
    assert frames, "no frames"
    assert frames[-1]["event"] == "complete", frames[-1]
    return str(frames[-1]["data"].get("summary"))
