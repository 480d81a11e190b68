"""Test helpers: a real uvicorn server on loopback, an SSE reader, and app builders."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import types
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn
from fastapi import FastAPI

from atmosphere_harness import HarnessSettings, create_harness_router
from atmosphere_harness._runtimes.base import AgentRuntime


def make_app(
    agents: Sequence[type],
    *,
    runtime: AgentRuntime | None = None,
    workspace: Path,
    router: Mapping[str, Any] | None = None,
    **settings: Any,
) -> FastAPI:
    """A FastAPI app hosting `agents` with settings rooted in a temp workspace; `router` holds
    more `create_harness_router` arguments (policies, a long-term memory store, ...)."""
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace, **settings),
            agents=agents,
            runtime=runtime,
            **(router or {}),
        )
    )
    return app


START_GUARD_SECONDS = 120


@asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[str]:
    """Run `app` under uvicorn on 127.0.0.1 (a free port) and yield its base URL."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", ws="auto"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        # A failure guard, not a speed limit: start-up may spawn MCP servers and open backends,
        # which on a loaded machine takes seconds.
        deadline = time.monotonic() + START_GUARD_SECONDS
        while not (server.started or task.done()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start within {START_GUARD_SECONDS} s")
            await asyncio.sleep(0.01)
        if task.done():
            task.result()
            raise RuntimeError("uvicorn exited before it started")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)


@asynccontextmanager
async def client_for(app: FastAPI) -> AsyncIterator[httpx2.AsyncClient]:
    """An HTTP client talking to `app` over a real loopback socket."""
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        yield client


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Every `data:` payload of an SSE body, JSON-decoded, checked against `event:`/`id:`."""
    frames: list[dict[str, Any]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        if "data" not in fields:
            continue
        frame = json.loads(fields["data"])
        if "event" in fields and isinstance(frame, dict) and "event" in frame:
            assert frame["event"] == fields["event"], (frame, fields)
            assert str(frame["seq"]) == fields.get("id"), (frame, fields)
        frames.append(frame)
    return frames


async def prompt(
    client: httpx2.AsyncClient, path: str, message: str, conversation_id: str | None = None
) -> list[dict[str, Any]]:
    """POST a prompt and return its frames once the stream ends."""
    body: dict[str, Any] = {"message": message}
    if conversation_id is not None:
        body["conversationId"] = conversation_id
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse_sse(response.text)


async def post_chunks(base: str, path: str) -> list[bytes]:
    """`POST path` over a raw socket; the response body's HTTP chunks, as written."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port), limit=2**24)
    body = json.dumps({"message": "go"}).encode()
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 60)
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


def of_type(frames: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [frame for frame in frames if frame["event"] == event]


def require_service(name: str, reason: str) -> None:
    """Skip a service-backed test; fail it instead when CI sets ATMOSPHERE_REQUIRE_SERVICES=1."""
    if os.environ.get("ATMOSPHERE_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{name} is required in CI but unavailable: {reason}")
    pytest.skip(f"{name} unavailable: {reason}")


def doc_example(doc: Path, name: str) -> types.ModuleType:
    """The first python code block of a docs page (```python, with or without a title),
    executed as module `name`."""
    code = re.search(r"```python[^\n]*\n(.*?)```", doc.read_text(encoding="utf-8"), re.DOTALL)
    assert code is not None, f"{doc.name} has a python example"
    module = types.ModuleType(name)
    exec(compile(code.group(1), str(doc), "exec"), module.__dict__)
    return module


async def own(workspace: Path, path: str, conversation_id: str, user_id: str | None = None) -> None:
    """Record `user_id` (anonymous by default) as the owner of a conversation of the embedded
    app rooted at `workspace`, as its first prompt would: for tests that open a conversation's
    stream before prompting in it (every route but a prompt answers 404 for an unused id)."""
    from atmosphere_harness._backends import SqliteConversationOwners
    from atmosphere_harness._contracts import user_key

    owners = SqliteConversationOwners.under(workspace)
    await owners.open()
    try:
        await owners.claim(path, conversation_id, user_key(user_id))
    finally:
        await owners.aclose()
