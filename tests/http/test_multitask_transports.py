"""`multitask` on `WS P/ws` (per prompt message) and `POST P/ag-ui` (`forwardedProps.multitask`),
over a real uvicorn server: reject, interrupt and rollback behave as they do for `POST P`.

The agent and model are those of the run-control tests: `nap <seconds>` asks for a tool that
sleeps (a run long enough to send a second prompt into), anything else is echoed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.http.test_agui_http import run_input
from tests.http.test_run_control_http import ALICE, PATH, app_for, start, status, until_status
from tests.http.test_websocket import receive, ws_url
from tests.support import serve


async def next_message(socket: ClientConnection) -> dict[str, Any]:
    """The socket's next message that is not a heartbeat."""
    while True:
        message = await receive(socket)
        if message["event"] != "heartbeat":
            return message


async def until_event(socket: ClientConnection, event: str) -> list[dict[str, Any]]:
    """Messages up to and including the first `event` one."""
    seen = []
    while True:
        seen.append(await next_message(socket))
        if seen[-1]["event"] == event:
            return seen


async def history(client: httpx2.AsyncClient, conversation: str) -> list[tuple[str, str]]:
    response = await client.get(f"{PATH}/conversations/{conversation}/messages", headers=ALICE)
    assert response.status_code == 200, response.text
    return [(m["role"], m["content"]) for m in response.json()["messages"]]


KEPT = [("user", "nap 30"), ("user", "hello"), ("assistant", "echo hello")]
"""The history after `interrupt`: the cut-off turn's user message stays (no half tool pair)."""
ROLLED_BACK = [("user", "hello"), ("assistant", "echo hello")]


async def test_over_websocket_reject_is_an_error_message_and_the_run_goes_on(
    workspace: Path,
) -> None:
    async with serve(app_for(workspace)) as base:
        url = ws_url(base, PATH, conversationId="w-rej")
        async with connect(url, additional_headers=ALICE) as socket:
            await socket.send(json.dumps({"message": "nap 30"}))
            await until_event(socket, "tool-start")
            await socket.send(json.dumps({"message": "hello", "multitask": "reject"}))
            refused = await next_message(socket)
            assert refused["event"] == "error", refused
            assert refused["data"]["type"] == "RunConflict"
            assert "in flight" in refused["data"]["message"]
            assert "sessionId" not in refused  # it belongs to no run
            # The nap goes on: stopping it is the next prompt's business.
            await socket.send(json.dumps({"message": "hello", "multitask": "interrupt"}))
            cut = await until_event(socket, "error")
            assert cut[-1]["data"]["type"] == "RunCancelled"
            assert cut[-1]["sessionId"]
            done = await until_event(socket, "complete")
            assert done[-1]["data"]["summary"] == "echo hello"
        async with httpx2.AsyncClient(base_url=base, timeout=30) as client:
            assert await history(client, "w-rej") == KEPT


async def test_over_websocket_rollback_leaves_the_cut_off_turn_out(workspace: Path) -> None:
    async with serve(app_for(workspace)) as base:
        url = ws_url(base, PATH, conversationId="w-rb")
        async with connect(url, additional_headers=ALICE) as socket:
            await socket.send(json.dumps({"message": "nap 30"}))
            await until_event(socket, "tool-start")
            await socket.send(json.dumps({"message": "hello", "multitask": "rollback"}))
            cut = await until_event(socket, "error")
            assert cut[-1]["data"]["type"] == "RunCancelled"
            done = await until_event(socket, "complete")
            assert done[-1]["data"]["summary"] == "echo hello"
        async with httpx2.AsyncClient(base_url=base, timeout=30) as client:
            assert await history(client, "w-rb") == ROLLED_BACK


async def agui(client: httpx2.AsyncClient, conversation: str, multitask: Any) -> httpx2.Response:
    body = run_input(conversation, "hello")
    body["forwardedProps"] = {"multitask": multitask}
    return await client.post(f"{PATH}/ag-ui", json=body, headers=ALICE)


def agui_events(response: httpx2.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    lines = response.text.replace("\r\n", "\n").split("\n")
    return [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]


async def test_over_agui_reject_is_a_run_error_and_the_run_goes_on(workspace: Path) -> None:
    async with (
        serve(app_for(workspace)) as base,
        httpx2.AsyncClient(base_url=base, timeout=60) as client,
    ):
        first = await start(client, "nap 30", "a-rej")
        await until_status(client, first["runId"], {"running"})
        events = agui_events(await agui(client, "a-rej", "reject"))
        assert [event["type"] for event in events] == ["RUN_STARTED", "RUN_ERROR"]
        assert events[-1]["code"] == "RunConflict"
        assert (await status(client, first["runId"]))["status"] == "running"
        await client.post(f"{PATH}/runs/{first['runId']}/cancel", headers=ALICE)
        await until_status(client, first["runId"], {"cancelled"})


@pytest.mark.parametrize(("multitask", "kept"), [("interrupt", KEPT), ("rollback", ROLLED_BACK)])
async def test_over_agui_interrupt_and_rollback_cancel_the_run_in_flight(
    workspace: Path, multitask: str, kept: list[tuple[str, str]]
) -> None:
    async with (
        serve(app_for(workspace)) as base,
        httpx2.AsyncClient(base_url=base, timeout=60) as client,
    ):
        conversation = f"a-{multitask}"
        first = await start(client, "nap 30", conversation)
        await until_status(client, first["runId"], {"running"})
        events = agui_events(await agui(client, conversation, multitask))
        assert events[-1]["type"] == "RUN_FINISHED", events
        assert events[-1]["result"] == "echo hello"
        cancelled = await status(client, first["runId"])
        assert cancelled["status"] == "cancelled"
        assert cancelled["error"]["type"] == "RunCancelled"
        assert await history(client, conversation) == kept


async def test_over_agui_a_bad_multitask_is_a_422_and_runs_nothing(workspace: Path) -> None:
    async with (
        serve(app_for(workspace)) as base,
        httpx2.AsyncClient(base_url=base, timeout=60) as client,
    ):
        refused = await agui(client, "a-bad", "shove")
        assert refused.status_code == 422
        assert "multitask" in json.dumps(refused.json()["error"])
        unknown = await client.get(f"{PATH}/conversations/a-bad/messages", headers=ALICE)
        assert unknown.status_code == 404  # nothing claimed it
