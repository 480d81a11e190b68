"""The admin workspace REST over a real uvicorn server.

Covers Atmosphere's suite's AtmosphereAgentWorkspaceEndpointTest (owners, plan, files, content:
shapes, 404s, 400 traversal), AdminApiAuthFilterReadGateTest (the read-gate matrix, workspace
default-deny with owners open, the opt-in flag, token pass-through, fail-closed without a token),
HarnessRuntimeTruthHttpE2eTest (console info + owners without a token),
HarnessKillSwitchHttpE2eTest, HarnessToolRoundTripHttpE2eTest and HarnessOptInHttpE2eTest.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI

from atmosphere_harness import (
    Harness,
    HarnessDep,
    HarnessSettings,
    ScriptedRuntime,
    ToolCall,
    agent,
    ai_endpoint,
    create_harness_router,
    get_admin_principal,
)
from atmosphere_harness._filesystem.primitive import SURFACE as FILE_SURFACE
from atmosphere_harness._planning.attach import SURFACE as PLAN_SURFACE
from atmosphere_harness._planning.tools import STORE_SERVICE
from atmosphere_harness._web.admin import HINT_NO_TOKEN, UNAUTHORIZED
from tests.agents import echo
from tests.http.test_planning_http import EventReader
from tests.support import client_for, make_app, of_type
from tests.support import prompt as post_prompt

TOKEN = "s3cret-admin-token"
AUTH = {"X-Atmosphere-Auth": TOKEN}


TruthAgent = echo(agent(name="harness-truth-agent"), "TruthAgent")


PlannerOnly = echo(agent(name="planner-only", harness=(Harness.PLANNING,)), "PlannerOnly")


FilesOnly = echo(agent(name="files-only", harness=(Harness.FILESYSTEM,)), "FilesOnly")


Bare = echo(agent(name="bare", harness=()), "Bare")


OptIn = echo(ai_endpoint("/atmosphere/optin-assistant", harness=(Harness.ALL,)), "OptIn")


AGENT = "/atmosphere/agent/harness-truth-agent"
ADMIN = "/api/admin/agents/harness-truth-agent"

TODOS_FIRST = [
    {"content": "Write the plan", "status": "in_progress", "activeForm": "Writing the plan"},
    {"content": "Ship it", "status": "pending"},
]
TODOS_SECOND = [{"content": "Replace the plan", "status": "completed"}]


def round_trip_script() -> ScriptedRuntime:
    """The HarnessToolRoundTripHttpE2eTest flow: two plans, three file tools, one oversize write."""
    return ScriptedRuntime(
        [
            [ToolCall("write_todos", {"todos": TODOS_FIRST, "goal": "Ship the feature"})],
            [ToolCall("write_todos", {"todos": TODOS_SECOND})],
            [ToolCall("write_file", {"path": "notes/todo.md", "content": "- ship\n"})],
            [ToolCall("read_file", {"path": "notes/todo.md"}), ToolCall("ls", {"dir": "notes"})],
            [ToolCall("write_file", {"path": "big.md", "content": "x" * (512 * 1024 + 1)})],
            "done",
        ]
    )


def app_with(*agents: type, runtime: ScriptedRuntime | None = None, **settings: Any) -> FastAPI:
    return make_app(
        list(agents),
        runtime=runtime or ScriptedRuntime(default=lambda request: "ok"),
        **settings,
    )


async def seeded(client: httpx2.AsyncClient, conversation: str = "conv-1") -> list[dict]:
    frames = await post_prompt(client, AGENT, "go", conversation_id=conversation)
    assert frames[-1]["event"] == "complete", frames[-1]
    return frames


# --- HarnessRuntimeTruthHttpE2eTest / kill switch / opt-in -------------------------------------


async def test_runtime_truth_and_owners_without_a_token(workspace: Path) -> None:
    async with client_for(app_with(TruthAgent, workspace=workspace)) as client:
        info = (await client.get("/api/console/info")).json()
        owners = await client.get("/api/admin/workspace/owners")
    assert info["harness"]["conversation-memory"] == "ACTIVE"
    assert info["harness"]["prompt-cache-default"] == "conservative"
    assert info["harness"]["planning"] == "ACTIVE(builtin)"
    assert info["harness"]["filesystem"] == "ACTIVE(builtin)"
    assert owners.status_code == 200
    assert owners.json() == [{"owner": "harness-truth-agent", "plan": True, "filesystem": True}]


async def test_kill_switch_attaches_no_surface(workspace: Path) -> None:
    app = app_with(TruthAgent, workspace=workspace, enabled=False, admin_token=TOKEN)
    async with client_for(app) as client:
        info = (await client.get("/api/console/info")).json()
        owners = (await client.get("/api/admin/workspace/owners")).json()
        plan = await client.get(f"{ADMIN}/plan", params={"sessionId": "c"}, headers=AUTH)
    for key in ("conversation-memory", "planning", "filesystem"):
        assert info["harness"][key] == "INACTIVE(disabled)"
    assert info["harness"]["prompt-cache-default"] != "conservative"
    assert owners == []
    assert plan.status_code == 404


async def test_an_opted_in_ai_endpoint_gets_memory_cache_and_a_workspace(workspace: Path) -> None:
    async with client_for(app_with(OptIn, workspace=workspace)) as client:
        info = (await client.get("/api/console/info")).json()
        owners = (await client.get("/api/admin/workspace/owners")).json()
    endpoint = info["endpoints"][0]
    assert endpoint["harness"]["conversation-memory"] == "ACTIVE"
    assert endpoint["harness"]["prompt-cache-default"] == "conservative"
    assert owners == [{"owner": "atmosphere-optin-assistant", "plan": True, "filesystem": True}]


# --- HarnessToolRoundTripHttpE2eTest ---------------------------------------------------------


async def test_tool_round_trip_then_the_admin_api_reads_what_the_tools_wrote(
    workspace: Path,
) -> None:
    app = app_with(TruthAgent, runtime=round_trip_script(), workspace=workspace, admin_token=TOKEN)
    async with client_for(app) as client:
        frames = await seeded(client)
        plan = await client.get(f"{ADMIN}/plan", params={"conversationId": "conv-1"}, headers=AUTH)
        listing = await client.get(
            f"{ADMIN}/files", params={"conversationId": "conv-1"}, headers=AUTH
        )
        content = await client.get(
            f"{ADMIN}/files/content",
            params={"sessionId": "conv-1", "path": "notes/todo.md"},
            headers=AUTH,
        )
    results = [frame["data"]["result"] for frame in of_type(frames, "tool-result")]
    assert "[~] Writing the plan" in results[0]
    assert "[x] Replace the plan" in results[1]
    assert "Ship it" not in results[1], "write_todos replaces the whole list"
    updates = of_type(frames, "plan-update")
    assert len(updates) == 2
    assert {(u["data"]["conversationId"], u["data"]["agentId"]) for u in updates} == {
        ("conv-1", "harness-truth-agent")
    }
    assert results[2:5] == ["Wrote notes/todo.md", "- ship\n", "notes/todo.md (7 bytes)"]
    assert results[5].startswith("Error: Write rejected:")
    assert "per-file limit" in results[5]

    assert plan.status_code == 200
    assert plan.json() == {
        "agent": "harness-truth-agent",
        "conversationId": "conv-1",
        "sessionId": "conv-1",
        "steps": [{"content": "Replace the plan", "status": "completed"}],
    }, "no goal key when the plan has none"
    assert listing.json()["entries"] == [{"path": "notes", "size": 0, "directory": True}]
    assert content.json() == {
        "agent": "harness-truth-agent",
        "conversationId": "conv-1",
        "sessionId": "conv-1",
        "path": "notes/todo.md",
        "content": "- ship\n",
    }
    files = workspace / "agents" / "harness-truth-agent" / "files" / "conv-1"
    assert not (files / "big.md").exists(), "a rejected write leaves no partial file"


# --- AtmosphereAgentWorkspaceEndpointTest: owners ---------------------------------------------


async def test_owners_lists_every_attached_surface_sorted(workspace: Path) -> None:
    app = app_with(TruthAgent, PlannerOnly, FilesOnly, Bare, OptIn, workspace=workspace)
    async with client_for(app) as client:
        owners = (await client.get("/api/admin/workspace/owners")).json()
    assert owners == [
        {"owner": "atmosphere-optin-assistant", "plan": True, "filesystem": True},
        {"owner": "files-only", "plan": False, "filesystem": True},
        {"owner": "harness-truth-agent", "plan": True, "filesystem": True},
        {"owner": "planner-only", "plan": True, "filesystem": False},
    ], "the bare agent has no surface, so it is not an owner"


async def test_owners_is_empty_without_endpoints(workspace: Path) -> None:
    async with client_for(app_with(workspace=workspace)) as client:
        response = await client.get("/api/admin/workspace/owners")
    assert response.status_code == 200
    assert response.json() == []


async def test_the_api_reads_the_instances_the_attach_engines_registered(
    workspace: Path,
) -> None:
    app = app_with(TruthAgent, workspace=workspace)

    @app.get("/probe")
    async def probe(host: HarnessDep) -> dict[str, bool]:
        endpoint = host.endpoint(AGENT)
        assert endpoint is not None
        return {
            "plan": host.surface(PLAN_SURFACE, "harness-truth-agent")
            is endpoint.services.get(STORE_SERVICE),
            "filesystem": host.surface(FILE_SURFACE, "harness-truth-agent")
            is endpoint.services.get(FILE_SURFACE),
        }

    async with client_for(app) as client:
        assert (await client.get("/probe")).json() == {"plan": True, "filesystem": True}


# --- plan --------------------------------------------------------------------------------------


async def test_plan_wire_shape_with_goal_and_active_form(workspace: Path) -> None:
    runtime = ScriptedRuntime(
        [[ToolCall("write_todos", {"todos": TODOS_FIRST, "goal": "Ship the feature"})], "ok"]
    )
    app = app_with(TruthAgent, runtime=runtime, workspace=workspace, admin_token=TOKEN)
    async with client_for(app) as client:
        await seeded(client)
        plan = await client.get(f"{ADMIN}/plan", params={"sessionId": "conv-1"}, headers=AUTH)
    assert plan.json() == {
        "agent": "harness-truth-agent",
        "conversationId": "conv-1",
        "sessionId": "conv-1",
        "goal": "Ship the feature",
        "steps": [
            {
                "content": "Write the plan",
                "status": "in_progress",
                "activeForm": "Writing the plan",
            },
            {"content": "Ship it", "status": "pending"},
        ],
    }


async def test_plan_404s(workspace: Path) -> None:
    app = app_with(TruthAgent, FilesOnly, workspace=workspace, admin_token=TOKEN)
    async with client_for(app) as client:
        for name, session in (
            ("harness-truth-agent", "never-planned"),
            ("files-only", "conv-1"),
            ("nobody", "conv-1"),
        ):
            response = await client.get(
                f"/api/admin/agents/{name}/plan", params={"sessionId": session}, headers=AUTH
            )
            assert response.status_code == 404, (name, response.text)
            assert response.json()["error"]
    assert not (workspace / "agents" / "harness-truth-agent" / "plans").exists()


TRAVERSAL_SESSIONS = ("../etc", "..", "a/b", "a\\b", "x/../../y")


async def test_plan_rejects_traversal_and_blank_ids_with_400(workspace: Path) -> None:
    app = app_with(TruthAgent, workspace=workspace, admin_token=TOKEN)
    async with client_for(app) as client:
        for session in TRAVERSAL_SESSIONS:
            response = await client.get(
                f"{ADMIN}/plan", params={"sessionId": session}, headers=AUTH
            )
            assert response.status_code == 400, session
            assert response.json() == {
                "error": f"sessionId contains illegal path characters: {session}"
            }
        blanks = [({}, "conversationId"), ({"conversationId": " "}, "conversationId")]
        blanks += [({"sessionId": ""}, "sessionId"), ({"sessionId": "  "}, "sessionId")]
        for params, named in blanks:
            response = await client.get(f"{ADMIN}/plan", params=params, headers=AUTH)
            assert response.status_code == 400
            assert response.json() == {"error": f"{named} must not be blank"}
        traversal = await client.get(
            f"{ADMIN}/plan", params={"conversationId": "../x"}, headers=AUTH
        )
        assert traversal.json() == {
            "error": "conversationId contains illegal path characters: ../x"
        }
        odd = await client.get(f"{ADMIN}/plan", params={"sessionId": "-dash"}, headers=AUTH)
        assert odd.status_code == 400
        assert odd.json()["error"].startswith("sessionId is invalid")
        dots = await client.get(
            "/api/admin/agents/%2E%2E/plan", params={"sessionId": "c"}, headers=AUTH
        )
    assert dots.status_code == 400
    assert dots.json() == {"error": "agent name contains illegal path characters: .."}
    assert sorted(path.name for path in workspace.iterdir()) == ["atmosphere.db"]


async def test_conversation_id_names_the_conversation_and_session_id_stays_an_alias(
    workspace: Path,
) -> None:
    app = app_with(TruthAgent, runtime=file_script(), workspace=workspace, admin_token=TOKEN)
    routes = (
        (f"{ADMIN}/plan", {}),
        (f"{ADMIN}/files", {}),
        (f"{ADMIN}/files/content", {"path": "top.txt"}),
    )
    async with client_for(app) as client:
        await seeded(client)
        for route, extra in routes:
            new = await client.get(
                route, params={"conversationId": "conv-1", **extra}, headers=AUTH
            )
            old = await client.get(route, params={"sessionId": "conv-1", **extra}, headers=AUTH)
            both = {"conversationId": "conv-1", "sessionId": "conv-1", **extra}
            agree = await client.get(route, params=both, headers=AUTH)
            differ = {"conversationId": "conv-1", "sessionId": "conv-2", **extra}
            clash = await client.get(route, params=differ, headers=AUTH)
            assert new.status_code == 200, (route, new.text)
            assert new.json() == old.json() == agree.json(), route
            assert new.json()["conversationId"] == new.json()["sessionId"] == "conv-1"
            assert clash.status_code == 400, route
            assert clash.json() == {
                "error": "conversationId and sessionId name different conversations; "
                "send conversationId only (sessionId is its older name)"
            }
        params = {"conversationId": "conv-1", "X-Atmosphere-Auth": TOKEN}
        async with client.stream("GET", f"{ADMIN}/plan/events", params=params) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
        document = (await client.get("/openapi.json")).json()
    for route in ("plan", "plan/events", "files", "files/content"):
        operation = document["paths"][f"/api/admin/agents/{{name}}/{route}"]["get"]
        parameters = {p["name"]: p for p in operation["parameters"]}
        assert parameters["sessionId"].get("deprecated") is True
        assert not parameters["conversationId"].get("deprecated")


# --- files -------------------------------------------------------------------------------------


def file_script() -> ScriptedRuntime:
    return ScriptedRuntime(
        [
            [
                ToolCall("write_todos", {"todos": [{"content": "Write", "status": "completed"}]}),
                ToolCall("write_file", {"path": "notes/a.md", "content": "alpha"}),
                ToolCall("write_file", {"path": "notes/deep/b.md", "content": "beta"}),
                ToolCall("write_file", {"path": "top.txt", "content": "top"}),
            ],
            "ok",
        ]
    )


async def test_files_listing_root_dirs_first_and_subdirectories(workspace: Path) -> None:
    app = app_with(TruthAgent, runtime=file_script(), workspace=workspace, admin_token=TOKEN)
    async with client_for(app) as client:
        await seeded(client)
        root = await client.get(f"{ADMIN}/files", params={"sessionId": "conv-1"}, headers=AUTH)
        dot = await client.get(
            f"{ADMIN}/files", params={"sessionId": "conv-1", "path": "."}, headers=AUTH
        )
        notes = await client.get(
            f"{ADMIN}/files", params={"sessionId": "conv-1", "path": "notes"}, headers=AUTH
        )
        missing = await client.get(
            f"{ADMIN}/files", params={"sessionId": "conv-1", "path": "nope"}, headers=AUTH
        )
    assert root.json() == {
        "agent": "harness-truth-agent",
        "conversationId": "conv-1",
        "sessionId": "conv-1",
        "path": ".",
        "entries": [
            {"path": "notes", "size": 0, "directory": True},
            {"path": "top.txt", "size": 3, "directory": False},
        ],
    }
    assert dot.json() == root.json()
    assert notes.json()["path"] == "notes"
    assert notes.json()["entries"] == [
        {"path": "notes/deep", "size": 0, "directory": True},
        {"path": "notes/a.md", "size": 5, "directory": False},
    ]
    assert missing.status_code == 200
    assert missing.json()["entries"] == []


async def test_files_404s_never_create_a_directory(workspace: Path) -> None:
    app = app_with(TruthAgent, PlannerOnly, workspace=workspace, admin_token=TOKEN)
    async with client_for(app) as client:
        for name in ("harness-truth-agent", "planner-only", "nobody"):
            for route in ("files", "files/content"):
                response = await client.get(
                    f"/api/admin/agents/{name}/{route}",
                    params={"sessionId": "never-wrote", "path": "a.md"},
                    headers=AUTH,
                )
                assert response.status_code == 404, (name, route)
                assert response.json()["error"]
    assert not (workspace / "agents" / "harness-truth-agent" / "files").exists()
    assert not (workspace / "agents" / "planner-only").exists()


async def test_files_400s_for_bad_paths_and_a_file_as_directory(workspace: Path) -> None:
    app = app_with(TruthAgent, runtime=file_script(), workspace=workspace, admin_token=TOKEN)
    async with client_for(app) as client:
        await seeded(client)
        for path in ("../x", "/etc", "notes/../..", "a\\b", "notes/\x00"):
            for route in ("files", "files/content"):
                response = await client.get(
                    f"{ADMIN}/{route}", params={"sessionId": "conv-1", "path": path}, headers=AUTH
                )
                assert response.status_code == 400, (route, path, response.text)
                assert response.json()["error"]
        for session in TRAVERSAL_SESSIONS:
            response = await client.get(
                f"{ADMIN}/files", params={"sessionId": session}, headers=AUTH
            )
            assert response.status_code == 400, session
        file_as_dir = await client.get(
            f"{ADMIN}/files", params={"sessionId": "conv-1", "path": "top.txt"}, headers=AUTH
        )
    assert file_as_dir.status_code == 400
    assert file_as_dir.json() == {"error": "Not a directory: top.txt"}


async def test_file_content_200_404_and_400(workspace: Path) -> None:
    app = app_with(TruthAgent, runtime=file_script(), workspace=workspace, admin_token=TOKEN)
    async with client_for(app) as client:
        await seeded(client)
        store = workspace / "agents" / "harness-truth-agent" / "files" / "conv-1"
        (store / "latin1.txt").write_bytes(b"caf\xe9")
        (store / "huge.txt").write_bytes(b"x" * (512 * 1024 + 1))

        async def read(path: str | None) -> httpx2.Response:
            params = {"sessionId": "conv-1"} | ({"path": path} if path is not None else {})
            return await client.get(f"{ADMIN}/files/content", params=params, headers=AUTH)

        deep = await read("notes/deep/b.md")
        missing = await read("notes/missing.md")
        directory = await read("notes")
        blank = await read(None)
        latin = await read("latin1.txt")
        huge = await read("huge.txt")
    assert deep.status_code == 200
    assert deep.json()["content"] == "beta"
    assert missing.status_code == 404
    assert missing.json() == {"error": "File not found: notes/missing.md"}
    assert directory.status_code == 404
    assert blank.status_code == 422
    assert blank.json() == {"error": "query.path: Field required"}
    assert latin.status_code == 400
    assert "not UTF-8" in latin.json()["error"]
    assert huge.status_code == 400
    assert huge.json()["error"].startswith("File too large to read")


async def test_a_symlink_out_of_the_store_is_not_followed(workspace: Path, tmp_path: Path) -> None:
    app = app_with(TruthAgent, runtime=file_script(), workspace=workspace, admin_token=TOKEN)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not leak")
    async with client_for(app) as client:
        await seeded(client)
        store = workspace / "agents" / "harness-truth-agent" / "files" / "conv-1"
        (store / "leak.txt").symlink_to(secret)
        (store / "leakdir").symlink_to(tmp_path, target_is_directory=True)
        leaked = await client.get(
            f"{ADMIN}/files/content",
            params={"sessionId": "conv-1", "path": "leak.txt"},
            headers=AUTH,
        )
        through_dir = await client.get(
            f"{ADMIN}/files/content",
            params={"sessionId": "conv-1", "path": "leakdir/secret.txt"},
            headers=AUTH,
        )
    for response in (leaked, through_dir):
        assert response.status_code in (400, 404), response.text
        assert "do not leak" not in response.text


# --- AdminApiAuthFilterReadGateTest ----------------------------------------------------------

WORKSPACE_READS = (
    (f"{ADMIN}/plan", {"sessionId": "conv-1"}),
    (f"{ADMIN}/files", {"sessionId": "conv-1"}),
    (f"{ADMIN}/files/content", {"sessionId": "conv-1", "path": "top.txt"}),
)


async def statuses(
    client: httpx2.AsyncClient, extra: dict[str, str] | None = None, **request: Any
) -> list[int]:
    got = []
    for path, params in WORKSPACE_READS:
        response = await client.get(path, params=params | (extra or {}), **request)
        got.append(response.status_code)
    return got


async def test_workspace_reads_are_denied_without_the_token(workspace: Path) -> None:
    app = app_with(TruthAgent, runtime=file_script(), workspace=workspace, admin_token=TOKEN)
    async with client_for(app) as client:
        await seeded(client)
        anonymous = await statuses(client)
        wrong = await statuses(client, headers={"X-Atmosphere-Auth": "wrong"})
        prefix = await statuses(client, headers={"X-Atmosphere-Auth": TOKEN[:-1]})
        longer = await statuses(client, headers={"X-Atmosphere-Auth": TOKEN + "x"})
        header = await statuses(client, headers=AUTH)
        body = (await client.get(WORKSPACE_READS[0][0], params=WORKSPACE_READS[0][1])).json()
        owners = await client.get("/api/admin/workspace/owners")
    assert anonymous == wrong == prefix == longer == [401, 401, 401]
    assert body["error"] == UNAUTHORIZED
    assert "X-Atmosphere-Auth" in body["hint"]
    assert header == [200, 200, 200]
    assert owners.status_code == 200, "owners stays open without the read flag"


async def test_the_token_also_works_as_a_query_parameter(workspace: Path) -> None:
    app = app_with(TruthAgent, runtime=file_script(), workspace=workspace, admin_token=TOKEN)
    async with client_for(app) as client:
        await seeded(client)
        assert await statuses(client, extra={"X-Atmosphere-Auth": TOKEN}) == [200, 200, 200]
        # The header wins over the query parameter.
        wrong_header = await statuses(
            client, headers={"X-Atmosphere-Auth": "wrong"}, extra={"X-Atmosphere-Auth": TOKEN}
        )
    assert wrong_header == [401, 401, 401]


async def test_without_a_configured_token_every_workspace_read_fails_closed(
    workspace: Path,
) -> None:
    app = app_with(TruthAgent, runtime=file_script(), workspace=workspace)
    async with client_for(app) as client:
        await seeded(client)
        denied = await statuses(client, headers=AUTH)
        empty = await statuses(client, headers={"X-Atmosphere-Auth": ""})
        response = await client.get(WORKSPACE_READS[0][0], params=WORKSPACE_READS[0][1])
    assert denied == empty == [401, 401, 401]
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"error": UNAUTHORIZED, "hint": HINT_NO_TOKEN}


async def test_the_read_flag_gates_owners_too(workspace: Path) -> None:
    app = app_with(
        TruthAgent, workspace=workspace, admin_token=TOKEN, admin_http_read_auth_required=True
    )
    async with client_for(app) as client:
        anonymous = await client.get("/api/admin/workspace/owners")
        allowed = await client.get("/api/admin/workspace/owners", headers=AUTH)
    assert anonymous.status_code == 401
    assert anonymous.json()["error"] == UNAUTHORIZED
    assert allowed.status_code == 200


async def test_the_read_flag_from_the_environment(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("ATMOSPHERE_ADMIN_HTTP_READ_AUTH_REQUIRED", "true")
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace),
            agents=[TruthAgent],
            runtime=ScriptedRuntime(),
        )
    )
    async with client_for(app) as client:
        assert (await client.get("/api/admin/workspace/owners")).status_code == 401
        assert (await client.get("/api/admin/workspace/owners", headers=AUTH)).status_code == 200


async def test_the_host_can_replace_the_check(workspace: Path) -> None:
    app = app_with(TruthAgent, runtime=file_script(), workspace=workspace)
    app.dependency_overrides[get_admin_principal] = lambda: "ops@example.com"
    async with client_for(app) as client:
        await seeded(client)
        assert await statuses(client) == [200, 200, 200]
        app.dependency_overrides[get_admin_principal] = lambda: None
        assert await statuses(client, headers=AUTH) == [401, 401, 401]


# --- GET /api/admin/agents/{name}/plan/events ------------------------------------------------


def plan_each_message() -> ScriptedRuntime:
    def turn(request: Any) -> Any:
        last = request.messages[-1]
        if last.role == "user":
            todos = [{"content": last.content, "status": "in_progress"}]
            return [ToolCall("write_todos", {"todos": todos})]
        return "ok"

    return ScriptedRuntime(default=turn)


async def test_plan_events_stream_behind_the_same_gate(workspace: Path) -> None:
    app = app_with(TruthAgent, runtime=plan_each_message(), workspace=workspace, admin_token=TOKEN)
    events = f"{ADMIN}/plan/events"
    async with client_for(app) as client:
        denied = await client.get(events, params={"sessionId": "live"})
        traversal = await client.get(events, params={"sessionId": "../x"}, headers=AUTH)
        nobody = await client.get(
            "/api/admin/agents/nobody/plan/events", params={"sessionId": "live"}, headers=AUTH
        )
        params = {"sessionId": "live", "X-Atmosphere-Auth": TOKEN}
        async with client.stream("GET", events, params=params) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            reader = EventReader(response)
            assert await reader.next() == {"retry": "3000"}
            snapshot = await reader.next()
            await post_prompt(client, AGENT, "step one", conversation_id="live")
            update = await asyncio.wait_for(reader.next(), 10)
    assert denied.status_code == 401
    assert denied.json()["error"] == UNAUTHORIZED
    assert traversal.status_code == 400
    assert nobody.status_code == 404
    assert snapshot["event"] == "plan-snapshot"
    assert snapshot["data"]["steps"] == []
    assert update["event"] == "plan-update"
    assert update["data"]["steps"] == [{"content": "step one", "status": "in_progress"}]
    assert update["data"]["agentId"] == "harness-truth-agent"
