"""`WS P/ws` over a real uvicorn server: frames, heartbeats, disconnects, slow clients."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from atmosphere_harness import ScriptedRuntime, ToolCall
from atmosphere_harness._web import websocket as ws_module
from tests.firehose import FRAMES, Firehose, FirehoseEndpoint, settled, slow_connection
from tests.firehose import PATH as FIREHOSE
from tests.http.test_memory_http import KEEPER, Keeper, _facts, app_for, eventually, model
from tests.support import client_for, make_app, serve
from tests.support import prompt as post_prompt


def ws_url(base: str, path: str, **query: str) -> str:
    suffix = "&".join(f"{key}={value}" for key, value in query.items())
    return base.replace("http://", "ws://") + path + "/ws" + (f"?{suffix}" if suffix else "")


async def receive(socket: ClientConnection, timeout: float = 10) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(socket.recv(), timeout))


async def run_over(socket: ClientConnection, body: Any) -> list[dict[str, Any]]:
    """Send one prompt and collect its frames up to the terminal one."""
    await socket.send(json.dumps(body))
    frames = []
    while True:
        frame = await receive(socket)
        if frame["event"] == "heartbeat":
            continue
        frames.append(frame)
        if frame["event"] in ("complete", "error"):
            return frames


def tool_script() -> ScriptedRuntime:
    return ScriptedRuntime(
        default=lambda request: (
            [ToolCall("write_todos", {"todos": [{"content": "Do it", "status": "completed"}]})]
            if request.messages[-1].role == "user"
            else f"answered after {len(request.messages)} messages"
        )
    )


async def test_frames_match_the_sse_stream_and_prompts_continue_the_conversation(
    workspace: Path,
) -> None:
    app = make_app([Keeper], runtime=tool_script(), workspace=workspace)
    async with serve(app) as base, client_for(app) as client:
        sse = await post_prompt(client, KEEPER, "hello", conversation_id="over-sse")
        async with connect(ws_url(base, KEEPER, conversationId="over-ws")) as socket:
            first = await run_over(socket, {"message": "hello"})
            second = await run_over(socket, {"event": "prompt", "data": {"message": "again"}})
            other = await run_over(socket, {"message": "elsewhere", "conversationId": "other"})
    assert [f["event"] for f in first] == [f["event"] for f in sse]
    assert [f["event"] for f in first] == [
        "tool-start",
        "plan-update",
        "tool-result",
        "text",
        "text",
        "text",
        "text",
        "complete",
    ]
    assert {f["conversationId"] for f in first + second} == {"over-ws"}
    assert [f["seq"] for f in first] == list(range(1, len(first) + 1))
    assert first[0]["sessionId"] != second[0]["sessionId"], "one sessionId per prompt"
    assert first[-1]["data"]["summary"] == "answered after 3 messages"
    assert second[-1]["data"]["summary"] == "answered after 7 messages", "history carried over"
    assert {f["conversationId"] for f in other} == {"other"}
    assert other[-1]["data"]["summary"] == "answered after 3 messages"


async def test_a_prompt_without_a_conversation_id_gets_a_new_one(workspace: Path) -> None:
    app = make_app([Keeper], runtime=tool_script(), workspace=workspace)
    async with serve(app) as base, connect(ws_url(base, KEEPER)) as socket:
        frames = await run_over(socket, {"message": "hi"})
    assert len(frames[0]["conversationId"]) == 36


async def test_bad_messages_get_an_error_and_the_socket_stays_usable(workspace: Path) -> None:
    app = make_app([Keeper], runtime=tool_script(), workspace=workspace)
    async with serve(app) as base, connect(ws_url(base, KEEPER)) as socket:
        notices = []
        for bad in ("not json", json.dumps({"text": "hi"}), json.dumps({"message": ""})):
            await socket.send(bad)
            notices.append(await receive(socket))
        await socket.send(json.dumps({"message": "hi", "conversationId": "../x"}))
        notices.append(await receive(socket))
        await socket.send(b"\x00binary")
        notices.append(await receive(socket))
        frames = await run_over(socket, {"message": "hi"})
    for notice in notices:
        assert notice["event"] == "error"
        assert notice["data"]["type"] == "invalid_request"
        assert "sessionId" not in notice, "not a run frame"
    assert "not JSON" in notices[0]["data"]["message"]
    assert "message" in notices[1]["data"]["message"]
    assert "conversationId" in notices[3]["data"]["message"]
    assert frames[-1]["event"] == "complete"


DEPTH = 50_000


@pytest.mark.parametrize(
    "hostile",
    [
        "[" * DEPTH + "]" * DEPTH,
        '{"a":' * DEPTH + "1" + "}" * DEPTH,
        '{"message": "hi", "extra": ' + "[" * DEPTH + "]" * DEPTH + "}",
    ],
    ids=["array", "object", "inside-a-prompt"],
)
async def test_json_nested_50000_levels_deep_gets_an_error_and_the_socket_stays(
    workspace: Path, hostile: str
) -> None:
    app = make_app([Keeper], runtime=tool_script(), workspace=workspace)
    async with serve(app) as base, connect(ws_url(base, KEEPER)) as socket:
        await socket.send(hostile)
        notice = await receive(socket)
        frames = await run_over(socket, {"message": "still here?"})
    assert notice["event"] == "error"
    assert notice["data"]["type"] == "invalid_request"
    assert "nested too deeply" in notice["data"]["message"]
    assert "sessionId" not in notice, "not a run frame"
    assert frames[-1]["event"] == "complete", "the same socket still runs prompts"


async def test_an_invalid_conversation_in_the_url_is_refused(workspace: Path) -> None:
    app = make_app([Keeper], runtime=tool_script(), workspace=workspace)
    async with serve(app) as base:
        with pytest.raises(Exception) as refused:
            async with connect(ws_url(base, KEEPER, conversationId="..")) as socket:
                await socket.recv()
    assert "HTTP 400" in str(refused.value)


async def test_only_same_origin_or_listed_browsers_may_connect(workspace: Path) -> None:
    app = make_app(
        [Keeper],
        runtime=tool_script(),
        workspace=workspace,
        websocket_allowed_origins="https://app.example.com, https://other.example.com/",
    )
    async with serve(app) as base:
        url = ws_url(base, KEEPER)
        for origin in (base, "https://app.example.com", "https://other.example.com"):
            async with connect(url, origin=origin) as socket:
                assert (await run_over(socket, {"message": "hi"}))[-1]["event"] == "complete"
        for origin in ("https://evil.example", "http://127.0.0.1:1", "null"):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(url, origin=origin):
                    pass
            assert refused.value.response.status_code == 403, origin


async def test_any_origin_when_star_is_listed(workspace: Path) -> None:
    app = make_app(
        [Keeper], runtime=tool_script(), workspace=workspace, websocket_allowed_origins="*"
    )
    async with serve(app) as base, connect(ws_url(base, KEEPER), origin="https://x.test") as ws:
        assert (await run_over(ws, {"message": "hi"}))[-1]["event"] == "complete"


async def test_heartbeats_keep_an_idle_socket_visibly_alive(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ws_module, "HEARTBEAT_SECONDS", 0.05)
    app = make_app([Keeper], runtime=tool_script(), workspace=workspace)
    async with serve(app) as base, connect(ws_url(base, KEEPER)) as socket:
        beats = [await receive(socket, timeout=5) for _ in range(2)]
    assert beats == [{"event": "heartbeat", "data": {}}] * 2


async def test_a_disconnect_closes_the_conversation_and_extraction_runs(workspace: Path) -> None:
    runtime = model()
    app = app_for([Keeper], workspace, runtime)
    async with serve(app) as base, client_for(app) as client:
        url = ws_url(base, KEEPER, conversationId="ws-conv")
        async with connect(url, additional_headers={"X-User-Id": "alice"}) as socket:
            await run_over(socket, {"message": "remember that I sail"})
            await run_over(socket, {"message": "remember that I cook"})
            assert await client.get("/facts", params={"user": "alice"}) is not None
            assert not await _facts(client, "alice", 1), "nothing is extracted while connected"
        await eventually(lambda: _facts(client, "alice", 2))
        facts = (await client.get("/facts", params={"user": "alice"})).json()
    assert facts == ["I sail", "I cook"]
    extraction = [r for r in runtime.requests if r.metadata.get("purpose") == "memory-extraction"]
    assert len(extraction) == 1


# --- a slow client ---------------------------------------------------------------------------


@asynccontextmanager
async def stalled_reader(
    base: str, path: str, prompt: str
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client that sends one prompt and then reads nothing (`slow_connection`)."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await slow_connection(base)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET {path}/ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101"), head
    payload = json.dumps({"message": prompt}).encode()
    mask = os.urandom(4)
    masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
    writer.write(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
    await writer.drain()
    try:
        yield reader, writer
    finally:
        writer.close()


async def test_a_slow_client_slows_only_its_own_run_and_is_disconnected(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ws_module, "SEND_TIMEOUT", 3.0)
    Firehose.reset()
    app = make_app([FirehoseEndpoint, Keeper], runtime=tool_script(), workspace=workspace)
    async with (
        serve(app) as base,
        stalled_reader(base, FIREHOSE, "flood me") as (reader, _writer),
    ):
        stuck_at = await settled()
        assert 0 < stuck_at < FRAMES, "the run waits for the slow client (bounded queue)"

        async with connect(ws_url(base, KEEPER)) as fast:
            frames = await run_over(fast, {"message": "hi"})
        assert frames[-1]["event"] == "complete"
        assert Firehose.emitted < FRAMES, "the other client finished while this one stalled"

        await asyncio.wait_for(Firehose.cancelled.wait(), 15)
        while await asyncio.wait_for(reader.read(1 << 20), 15):
            pass  # the server closed the connection: the reads end with b""
    assert Firehose.emitted < FRAMES
