"""Run control over real HTTP, embedded: background runs, run status, cancel, multitask, owners.

The model is scripted by the prompt: `nap <seconds>` asks for the `nap` tool (a tool that
sleeps), then answers once the result is back; anything else is echoed. A run that naps is a
run long enough to watch, cancel, or send a second prompt into.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx2

from atmosphere_harness import ScriptedRuntime, StreamingSession, ToolCall, agent, prompt, tool
from atmosphere_harness._runtimes.base import ModelRequest
from tests.support import client_for, make_app, parse_sse

PATH = "/atmosphere/agent/runner"
ALICE = {"X-User": "alice"}
BOB = {"X-User": "bob"}


def model(request: ModelRequest) -> str | list[ToolCall]:
    last = request.messages[-1]
    if last.role == "tool":
        return f"rested: {last.content}"
    words = last.content.split()
    if words[0] == "nap":
        return [ToolCall("nap", {"seconds": float(words[1])}, f"call-{time.monotonic_ns()}")]
    return f"echo {last.content}"


@agent(name="runner")
class Runner:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)

    @tool
    async def nap(self, seconds: float) -> str:
        """Sleep a while.

        Args:
            seconds: How long.
        """
        await asyncio.sleep(seconds)
        return "rested"


def runtime() -> ScriptedRuntime:
    return ScriptedRuntime(default=model)


def app_for(workspace: Path, scripted: ScriptedRuntime | None = None) -> Any:
    return make_app(
        [Runner], runtime=scripted or runtime(), workspace=workspace, user_id_header="X-User"
    )


async def start(
    client: httpx2.AsyncClient, message: str, conversation: str, **body: Any
) -> dict[str, Any]:
    headers = body.pop("headers", ALICE)
    response = await client.post(
        PATH,
        json={"message": message, "conversationId": conversation, "background": True, **body},
        headers=headers,
    )
    assert response.status_code == 202, response.text
    started: dict[str, Any] = response.json()
    return started


async def status(
    client: httpx2.AsyncClient, run_id: str, headers: dict[str, str] = ALICE
) -> dict[str, Any]:
    response = await client.get(f"{PATH}/runs/{run_id}", headers=headers)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def until_status(
    client: httpx2.AsyncClient, run_id: str, wanted: set[str], guard: float = 30.0
) -> dict[str, Any]:
    deadline = time.monotonic() + guard
    while True:
        found = await status(client, run_id)
        if found["status"] in wanted:
            return found
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.02)


async def test_a_background_run_completes_with_no_client(workspace: Path) -> None:
    async with client_for(app_for(workspace)) as client:
        started = await start(client, "nap 0.3", "c-bg")
        assert started["status"] in ("queued", "running")
        assert started["conversationId"] == "c-bg"
        done = await until_status(client, started["runId"], {"completed", "failed"})
        assert done["status"] == "completed", done
        assert done["usage"]["inputTokens"] > 0
        assert "error" not in done
        # The conversation kept its turn: its events replay the finished run.
        replay = await client.get(f"{PATH}/conversations/c-bg/events", headers=ALICE)
        assert parse_sse(replay.text)[-1]["data"]["summary"] == "rested: rested"


async def test_cancel_stops_a_run_within_a_second_and_keeps_no_half_tool_pair(
    workspace: Path,
) -> None:
    scripted = runtime()
    async with client_for(app_for(workspace, scripted)) as client:
        body = {"message": "nap 30", "conversationId": "c-cancel"}
        frames: list[dict[str, Any]] = []
        run_id: list[str] = []
        napping = asyncio.Event()

        async def follow() -> None:
            async with client.stream("POST", PATH, json=body, headers=ALICE) as response:
                run_id.append(response.headers["X-Run-Id"])
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        frames.append(json.loads(line[5:]))
                        if frames[-1]["event"] == "tool-start":
                            napping.set()

        reader = asyncio.create_task(follow())
        await asyncio.wait_for(napping.wait(), 30)
        asked = time.monotonic()
        cancel = await client.post(f"{PATH}/runs/{run_id[0]}/cancel", headers=ALICE)
        assert cancel.status_code == 202, cancel.text
        await asyncio.wait_for(reader, 30)
        took = time.monotonic() - asked
        assert took < 1.0, took
        assert frames[-1]["event"] == "error"
        assert frames[-1]["data"]["type"] == "RunCancelled"
        done = await status(client, run_id[0])
        assert done["status"] == "cancelled"
        assert done["error"]["type"] == "RunCancelled"
        # The next prompt sees the history: the user message, and no tool call without result.
        await client.post(
            PATH, json={"message": "hello", "conversationId": "c-cancel"}, headers=ALICE
        )
        sent = scripted.requests[-1].messages
        assert [m.role for m in sent] == ["user", "user"], sent
        assert not any(m.tool_calls for m in sent)


async def test_a_queued_run_is_cancelled_too(workspace: Path) -> None:
    async with client_for(app_for(workspace)) as client:
        first = await start(client, "nap 30", "c-q")
        second = await start(client, "hello", "c-q")
        assert (await until_status(client, second["runId"], {"queued"}))["status"] == "queued"
        for run in (second, first):
            assert (
                await client.post(f"{PATH}/runs/{run['runId']}/cancel", headers=ALICE)
            ).status_code == 202
        for run in (first, second):
            done = await until_status(client, run["runId"], {"cancelled"}, guard=2.0)
            assert done["error"]["type"] == "RunCancelled"


async def test_multitask_reject_answers_409_while_a_run_is_in_flight(workspace: Path) -> None:
    async with client_for(app_for(workspace)) as client:
        first = await start(client, "nap 30", "c-rej")
        refused = await client.post(
            PATH,
            json={"message": "hello", "conversationId": "c-rej", "multitask": "reject"},
            headers=ALICE,
        )
        assert refused.status_code == 409
        assert "in flight" in refused.json()["error"]
        assert (await status(client, first["runId"]))["status"] == "running"
        await client.post(f"{PATH}/runs/{first['runId']}/cancel", headers=ALICE)
        await until_status(client, first["runId"], {"cancelled"})
        accepted = await client.post(
            PATH,
            json={"message": "hello", "conversationId": "c-rej", "multitask": "reject"},
            headers=ALICE,
        )
        assert accepted.status_code == 200
        assert parse_sse(accepted.text)[-1]["event"] == "complete"


async def test_multitask_enqueue_runs_after_the_run_in_flight(workspace: Path) -> None:
    async with client_for(app_for(workspace)) as client:
        first = await start(client, "nap 0.5", "c-enq")
        second = await start(client, "hello", "c-enq", multitask="enqueue")
        done = await until_status(client, second["runId"], {"completed"})
        assert (await status(client, first["runId"]))["status"] == "completed"
        assert done["status"] == "completed"


async def test_multitask_interrupt_cancels_the_run_and_keeps_its_turn(workspace: Path) -> None:
    scripted = runtime()
    async with client_for(app_for(workspace, scripted)) as client:
        first = await start(client, "nap 30", "c-int")
        await until_status(client, first["runId"], {"running"})
        await asyncio.sleep(0.2)  # (inside the nap)
        began = time.monotonic()
        second = await client.post(
            PATH,
            json={"message": "hello", "conversationId": "c-int", "multitask": "interrupt"},
            headers=ALICE,
        )
        assert time.monotonic() - began < 1.0
        assert parse_sse(second.text)[-1]["data"]["summary"] == "echo hello"
        assert (await status(client, first["runId"]))["status"] == "cancelled"
        sent = scripted.requests[-1].messages
        assert [(m.role, m.content) for m in sent] == [("user", "nap 30"), ("user", "hello")]


async def test_multitask_rollback_also_removes_the_cancelled_turn(workspace: Path) -> None:
    scripted = runtime()
    async with client_for(app_for(workspace, scripted)) as client:
        await start(client, "nap 0.01", "c-rb")  # a finished turn stays
        await asyncio.sleep(0.5)
        first = await start(client, "nap 30", "c-rb")
        await until_status(client, first["runId"], {"running"})
        await asyncio.sleep(0.2)
        second = await client.post(
            PATH,
            json={"message": "hello", "conversationId": "c-rb", "multitask": "rollback"},
            headers=ALICE,
        )
        assert parse_sse(second.text)[-1]["data"]["summary"] == "echo hello"
        done = await status(client, first["runId"])
        assert done["status"] == "cancelled"
        sent = scripted.requests[-1].messages
        contents = [m.content for m in sent if m.role == "user"]
        assert contents == ["nap 0.01", "hello"], sent


async def test_a_run_is_its_owners_alone(workspace: Path) -> None:
    async with client_for(app_for(workspace)) as client:
        started = await start(client, "nap 30", "c-own")
        run_id = started["runId"]
        for headers in (BOB, {}):
            assert (await client.get(f"{PATH}/runs/{run_id}", headers=headers)).status_code == 404
            refused = await client.post(f"{PATH}/runs/{run_id}/cancel", headers=headers)
            assert refused.status_code == 404
            assert "error" in refused.json()
        assert (await status(client, run_id))["status"] == "running"
        unknown = await client.get(f"{PATH}/runs/{'0' * 32}", headers=ALICE)
        assert unknown.status_code == 404
        assert (await client.get(f"{PATH}/runs/not-an-id", headers=ALICE)).status_code == 400
        await client.post(f"{PATH}/runs/{run_id}/cancel", headers=ALICE)
        await until_status(client, run_id, {"cancelled"})


async def test_an_approval_wait_reads_as_waiting_approval(workspace: Path) -> None:
    @agent(name="gated")
    class Gated:
        @prompt
        async def chat(self, message: str, session: StreamingSession) -> None:
            await session.stream(message)

        @tool(requires_approval=True)
        async def launch(self) -> str:
            """Launch (a person approves)."""
            return "launched"

    scripted = ScriptedRuntime([[ToolCall("launch", {}, "call-launch")], "launched."])
    app = make_app([Gated], runtime=scripted, workspace=workspace, user_id_header="X-User")
    async with client_for(app) as client:
        path = "/atmosphere/agent/gated"
        response = await client.post(
            path,
            json={"message": "go", "conversationId": "c-gate", "background": True},
            headers=ALICE,
        )
        run_id = response.json()["runId"]
        deadline = time.monotonic() + 30
        while True:
            found = (await client.get(f"{path}/runs/{run_id}", headers=ALICE)).json()
            if found["status"] == "waiting-approval":
                break
            assert time.monotonic() < deadline, found
            await asyncio.sleep(0.02)
        await client.post(f"{path}/runs/{run_id}/cancel", headers=ALICE)
        deadline = time.monotonic() + 30
        while found["status"] != "cancelled":
            assert time.monotonic() < deadline, found
            await asyncio.sleep(0.02)
            found = (await client.get(f"{path}/runs/{run_id}", headers=ALICE)).json()


async def test_the_openapi_document_lists_every_answer_of_the_run_routes(workspace: Path) -> None:
    async with client_for(app_for(workspace)) as client:
        paths = (await client.get("/openapi.json")).json()["paths"]
    answers = {
        (method, path): sorted(operation["responses"])
        for path, operations in paths.items()
        for method, operation in operations.items()
        if path.startswith(PATH)
    }
    assert {"200", "202", "409"} <= set(answers[("post", PATH)])
    assert {"200", "400", "404"} <= set(answers[("get", PATH + "/runs/{run_id}")])
    assert {"202", "400", "404"} <= set(answers[("post", PATH + "/runs/{run_id}/cancel")])
    status = paths[PATH + "/runs/{run_id}"]["get"]["responses"]["200"]
    schema = status["content"]["application/json"]["schema"]
    assert "waiting-approval" in schema["properties"]["status"]["enum"]
