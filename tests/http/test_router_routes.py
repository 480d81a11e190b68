"""Routes are declared when the harness router is built: under an include prefix, in the OpenAPI
document before start-up, from the decorator registry for `harness_router`, one app per router."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI
from websockets.asyncio.client import connect

from atmosphere_harness import (
    HarnessSettings,
    ModelRequest,
    ScriptedRuntime,
    ToolCall,
    agent,
    ai_endpoint,
    create_harness_router,
    get_user_id,
    prompt,
    tool,
)
from atmosphere_harness._registry import AgentRegistry
from atmosphere_harness._web.deps import user_id_from_header
from samples.personal_assistant.app import Assistant
from tests.agents import echo
from tests.delegation_support import open_prompt
from tests.http.test_agui_http import run_agui, run_input
from tests.http.test_planning_http import EventReader
from tests.http.test_websocket import run_over, ws_url
from tests.support import client_for, of_type, parse_sse, serve

REPO = Path(__file__).resolve().parents[2]
SHIPPED: list[str] = []


@tool(requires_approval=True)
async def ship(parcel: str) -> str:
    """Ship a parcel (a person approves it first).

    Args:
        parcel: Which parcel.
    """
    SHIPPED.append(parcel)
    return f"shipped {parcel}"


Courier = echo(agent(name="routes-courier"), "Courier", tools=[ship])


@ai_endpoint("/atmosphere/routes-echo")
class Echo:
    @prompt
    async def chat(self, message: str) -> str:
        return message.upper()


@agent(name="routes-helper", headless=True)
class Helper:
    pass


COURIER = "/atmosphere/agent/routes-courier"
V1 = "/v1" + COURIER
SUFFIXES = (
    "",
    "/plan/events",
    "/conversations/{conversation_id}/close",
    "/conversations/{conversation_id}/events",
    "/approvals",
    "/approvals/{approval_id}",
    "/ag-ui",
)


def courier_model(request: ModelRequest) -> Any:
    """`plan ...` writes a plan, `ship X` asks to ship X, a tool result is reported back."""
    last = request.messages[-1]
    if last.role == "tool":
        return f"done: {last.content}"
    if last.content.startswith("plan"):
        return [ToolCall("write_todos", {"todos": [{"content": "Pack", "status": "in_progress"}]})]
    if last.content.startswith("ship "):
        return [ToolCall("ship", {"parcel": last.content.removeprefix("ship ")})]
    return f"echo: {last.content}"


def prefixed_app(workspace: Path, *agents: type, prefix: str = "/v1") -> FastAPI:
    app = FastAPI()
    router = create_harness_router(
        HarnessSettings(workspace_root=workspace),
        agents=list(agents),
        runtime=ScriptedRuntime(default=courier_model),
    )
    app.include_router(router, prefix=prefix)
    app.dependency_overrides[get_user_id] = user_id_from_header
    return app


# --- an include prefix ------------------------------------------------------------------------


async def test_a_prefix_serves_the_prompt_plan_events_and_conversation_routes(
    workspace: Path,
) -> None:
    app = prefixed_app(workspace, Courier)
    alice = {"X-User-Id": "alice"}
    async with client_for(app) as client:
        unprefixed = await client.post(COURIER, json={"message": "hi"})
        response = await client.post(
            V1, json={"message": "plan it", "conversationId": "c1"}, headers=alice
        )
        frames = parse_sse(response.text)
        params = {"conversationId": "c1"}
        async with client.stream(
            "GET", V1 + "/plan/events", params=params, headers=alice
        ) as stream:
            assert stream.status_code == 200
            reader = EventReader(stream)
            assert await reader.next() == {"retry": "3000"}
            snapshot = await reader.next()
        replay = await client.get(V1 + "/conversations/c1/events", headers=alice)
        closed = await client.post(V1 + "/conversations/c1/close", headers=alice)
    assert unprefixed.status_code == 404
    assert response.status_code == 200
    assert [f["event"] for f in frames][-1] == "complete"
    assert of_type(frames, "plan-update")[0]["data"]["steps"][0]["content"] == "Pack"
    assert snapshot["event"] == "plan-snapshot"
    assert [step["content"] for step in snapshot["data"]["steps"]] == ["Pack"]
    assert replay.status_code == 200
    assert [f["seq"] for f in parse_sse(replay.text)] == [f["seq"] for f in frames]
    assert closed.status_code == 200
    assert closed.json() == {"conversationId": "c1", "closed": True}


async def test_a_prefix_serves_approvals(workspace: Path) -> None:
    SHIPPED.clear()
    app = prefixed_app(workspace, Courier)
    async with (
        serve(app) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
        open_prompt(client, V1, "ship p1", conversation_id="c2") as reader,
    ):
        asked = await reader.until("approval-required")
        approval_id = asked["data"]["approvalId"]
        listed = await client.get(V1 + "/approvals", params={"conversationId": "c2"})
        answered = await client.post(f"{V1}/approvals/{approval_id}", json={"approve": True})
        rest = await reader.rest()
    assert [a["approvalId"] for a in listed.json()["approvals"]] == [approval_id]
    assert answered.json() == {"approvalId": approval_id, "status": "approved"}
    assert SHIPPED == ["p1"]
    assert rest[-1]["data"]["summary"] == "done: shipped p1"


async def test_a_prefix_serves_the_websocket_and_ag_ui(workspace: Path) -> None:
    app = prefixed_app(workspace, Courier)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        async with connect(ws_url(base, V1, conversationId="over-ws")) as socket:
            frames = await run_over(socket, {"message": "hello"})
        events = await run_agui(client, V1, run_input("thread-1", "hello"))
    assert frames[-1]["event"] == "complete"
    assert frames[-1]["conversationId"] == "over-ws"
    assert "".join(f["data"]["text"] for f in of_type(frames, "text")) == "echo: hello"
    assert events[0]["type"] == "RUN_STARTED"
    assert events[-1] == {**events[-1], "type": "RUN_FINISHED", "result": "echo: hello"}


# --- the OpenAPI document before start-up ----------------------------------------------------


def test_the_openapi_document_lists_every_agent_route_before_start_up(workspace: Path) -> None:
    app = prefixed_app(workspace, Courier, Echo, Helper)
    paths = app.openapi()["paths"]  # no lifespan has run: nothing is hosted yet
    for base in (V1, "/v1/atmosphere/routes-echo"):
        for suffix in SUFFIXES:
            assert base + suffix in paths, base + suffix
    assert paths[V1]["post"]["summary"] == "Prompt routes-courier"
    assert "/v1/api/console/info" in paths
    assert not any("routes-helper" in path for path in paths), "a headless agent has no routes"
    assert not any(path.startswith("/atmosphere/") for path in paths)


def test_a_fleet_class_the_router_was_not_given_is_declared_too(workspace: Path) -> None:
    app = FastAPI()
    app.include_router(create_harness_router(agents=[Assistant]))
    paths = app.openapi()["paths"]
    assert "/atmosphere/agent/assistant" in paths
    assert "/atmosphere/agent/writer/plan/events" in paths, "writer is in the assistant's fleet"
    assert not any("/research" in path for path in paths), "research is headless"


# --- one router, one app ----------------------------------------------------------------------


@agent(name="routes-left")
class Left:
    @prompt
    async def chat(self, message: str) -> str:
        return "left"


@agent(name="routes-right")
class Right:
    @prompt
    async def chat(self, message: str) -> str:
        return "right"


async def test_two_apps_from_two_routers_do_not_see_each_others_agents(workspace: Path) -> None:
    left_app = prefixed_app(workspace / "left", Left, prefix="")
    right_app = prefixed_app(workspace / "right", Right, prefix="")
    assert not any("routes-right" in path for path in left_app.openapi()["paths"])
    assert not any("routes-left" in path for path in right_app.openapi()["paths"])
    async with client_for(left_app) as left, client_for(right_app) as right:
        own = await left.post("/atmosphere/agent/routes-left", json={"message": "x"})
        foreign = await left.post("/atmosphere/agent/routes-right", json={"message": "x"})
        mine = await right.post("/atmosphere/agent/routes-right", json={"message": "x"})
        theirs = await right.post("/atmosphere/agent/routes-left", json={"message": "x"})
        left_info = (await left.get("/api/console/info")).json()
    assert parse_sse(own.text)[-1]["data"]["summary"] == "left"
    assert parse_sse(mine.text)[-1]["data"]["summary"] == "right"
    assert foreign.status_code == theirs.status_code == 404
    assert [e["path"] for e in left_info["endpoints"]] == ["/atmosphere/agent/routes-left"]


async def test_a_route_whose_endpoint_the_running_host_lacks_says_so(workspace: Path) -> None:
    # Two harness routers in one app: one lifespan's host is the app's, so the other router's
    # routes find no endpoint. It should not happen; when it does, it is explained.
    app = FastAPI()
    for cls in (Left, Right):
        app.include_router(
            create_harness_router(
                HarnessSettings(workspace_root=workspace / cls.__name__), agents=[cls]
            )
        )
    async with client_for(app) as client:
        answers = {
            path: await client.post(path, json={"message": "x"})
            for path in ("/atmosphere/agent/routes-left", "/atmosphere/agent/routes-right")
        }
    assert sorted(answer.status_code for answer in answers.values()) == [200, 500]
    path, failed = next((p, a) for p, a in answers.items() if a.status_code == 500)
    assert f"{path} is not hosted by the app's running harness" in failed.text


async def test_include_order_decides_against_a_catch_all(workspace: Path) -> None:
    first = prefixed_app(workspace / "first", Courier, prefix="")

    @first.get("/{anything:path}")
    async def fallback(anything: str) -> dict[str, str]:
        return {"fallback": anything}

    late = FastAPI()

    @late.get("/{anything:path}")
    async def late_fallback(anything: str) -> dict[str, str]:
        return {"fallback": anything}

    late.include_router(
        create_harness_router(HarnessSettings(workspace_root=workspace / "late"), agents=[Courier])
    )
    query = {"conversationId": "c"}
    async with client_for(first) as client:
        served = await client.get(COURIER + "/approvals", params=query)
        other = await client.get("/index.html")
    async with client_for(late) as client:
        shadowed = await client.get(COURIER + "/approvals", params=query)
        prompted = await client.post(COURIER, json={"message": "hi"})
    assert served.json() == {"error": "unknown conversation 'c'"}, "the harness answered"
    assert other.json() == {"fallback": "index.html"}
    assert shadowed.json() == {"fallback": COURIER.lstrip("/") + "/approvals"}
    assert prompted.status_code == 200, "a GET catch-all does not take a POST route"


# --- the registry: harness_router and create_harness_router() ---------------------------------


@pytest.fixture
def registry() -> AgentRegistry:
    """A registry holding only this test's classes (as the package's holds a module's)."""
    return AgentRegistry()


async def test_a_registry_router_declares_the_classes_decorated_before_it_is_included(
    workspace: Path, registry: AgentRegistry
) -> None:
    router = create_harness_router(
        HarnessSettings(workspace_root=workspace),
        agents=registry,
        runtime=ScriptedRuntime(default="hi"),
    )  # like harness_router: built before any class is decorated

    Early = echo(registry.agent(name="routes-early"), "Early")

    app = FastAPI()
    app.include_router(router, prefix="/v1")
    assert "/v1/atmosphere/agent/routes-early" in app.openapi()["paths"]
    async with client_for(app) as client:
        frames = await client.post("/v1/atmosphere/agent/routes-early", json={"message": "x"})
        info = (await client.get("/v1/api/console/info")).json()
    assert parse_sse(frames.text)[-1]["data"]["summary"] == "hi"
    assert [e["path"] for e in info["endpoints"]] == ["/atmosphere/agent/routes-early"]
    assert [spec.cls for spec in router.specs] == [Early]

    @registry.agent(name="routes-late")
    class Late:
        @prompt
        async def chat(self, message: str) -> str:
            return "never served"

    again = FastAPI()
    again.include_router(router)
    assert not any("routes-late" in path for path in again.openapi()["paths"])
    with pytest.raises(RuntimeError, match=r"Late \(/atmosphere/agent/routes-late\): decorated"):
        async with again.router.lifespan_context(again):
            pass


def test_a_registry_router_that_was_never_included_reads_the_registry_late(
    registry: AgentRegistry,
) -> None:
    router = create_harness_router(agents=registry)

    @registry.ai_endpoint("/atmosphere/routes-later")
    class Later:
        @prompt
        async def chat(self, message: str) -> str:
            return message

    assert [spec.cls for spec in router.hosted_specs()] == [Later]
    assert any(getattr(route, "path", "") == "/atmosphere/routes-later" for route in router.routes)


def test_the_module_level_harness_router_serves_the_ten_line_app(tmp_path: Path) -> None:
    """The README's shape in a fresh process: classes declared after the import, then included."""
    script = textwrap.dedent(
        """
        import json
        from fastapi import FastAPI
        from fastapi.testclient import TestClient
        from atmosphere_harness import StreamingSession, agent, harness_router, prompt

        @agent(name="assistant")
        class Assistant:
            @prompt
            async def chat(self, message: str, session: StreamingSession) -> None:
                await session.stream(message)

        app = FastAPI()
        app.include_router(harness_router, prefix="/v1")
        paths = sorted(app.openapi()["paths"])
        with TestClient(app) as client:
            body = client.post("/v1/atmosphere/agent/assistant", json={"message": "hello"}).text

        @agent(name="late")
        class Late:
            @prompt
            async def chat(self, message: str) -> str:
                return message

        try:
            with TestClient(app):
                late = "started"
        except RuntimeError as exc:
            late = str(exc)
        print(json.dumps({"paths": paths, "body": body, "late": late}))
        """
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ATMOSPHERE_", "LLM_"))
    }
    env["ATMOSPHERE_WORKSPACE_ROOT"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "/v1/atmosphere/agent/assistant/plan/events" in result["paths"]
    frames = parse_sse(result["body"])
    assert "".join(f["data"]["text"] for f in of_type(frames, "text")) == "You said: hello"
    assert result["late"].startswith("Late (/atmosphere/agent/late): decorated after")
