"""MCP tool servers over real HTTP: a real `mcp` SDK server as a stdio subprocess and over
streamable HTTP on loopback; schemas, calls, exact results, governance, approvals, failures,
collisions and truth."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest

from atmosphere_harness import (
    MCPServerStdio,
    ModelRequest,
    ToolApprovalPolicy,
    ToolCall,
    ToolKind,
    agent,
)
from atmosphere_harness._assembly import build_host
from atmosphere_harness._mcp import MCPPrimitive
from atmosphere_harness._registry import spec_of
from atmosphere_harness._runtimes.scripted import ScriptedRuntime
from atmosphere_harness._settings import HarnessSettings
from tests.agents import echo
from tests.delegation_support import deny_when, governed_app, open_prompt
from tests.mcp.support import calling, each_turn, http_server, rounds, since_user, stdio_server
from tests.support import doc_example, of_type, serve
from tests.support import prompt as post_prompt

PATH = "/atmosphere/agent/tooled"
SERVER_TOOLS = {"add", "greet", "wipe", "fail", "big", "crash", "hang", "grow"}


def tooled(*servers: Any, harness: Any = None) -> type:
    options: dict[str, Any] = {"mcp_servers": list(servers)}
    if harness is not None:
        options["harness"] = harness
    return echo(agent("tooled", **options), "Tooled")


async def run(
    agent_cls: type, runtime: ScriptedRuntime, workspace: Path, *messages: str, **options: Any
) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    app = governed_app([agent_cls], runtime=runtime, workspace=workspace, **options)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=60) as client:
        frames = [await post_prompt(client, PATH, text) for text in messages or ("go",)]
        info = (await client.get("/api/console/info")).json()
    return frames, info


def results(frames: list[dict[str, Any]]) -> list[str]:
    return [frame["data"]["result"] for frame in of_type(frames, "tool-result")]


def schema_of(request: ModelRequest, name: str) -> dict[str, Any]:
    (spec,) = [tool for tool in request.tools if tool.name == name]
    return dict(spec.parameters)


async def check_offered_and_called(agent_cls: type, workspace: Path, server: str) -> None:
    runtime = calling(
        ToolCall("add", {"a": 2, "b": 3}),
        ToolCall("greet", {"name": "Ada"}),
        ToolCall("greet", {"name": "Bob", "punctuation": "?"}),
        ToolCall("fail", {"message": "no luck"}),
        ToolCall("add", {"a": "x"}),
    )
    ([frames], info) = await run(agent_cls, runtime, workspace)
    assert frames[-1]["event"] == "complete", frames[-1]
    added, ada, bob, failed, invalid = results(frames)
    assert added == "5"
    assert ada == "Hello, Ada!"
    assert bob == "Hello, Bob?"
    assert json.loads(failed) == {
        "error": "tool_error",
        "tool": "fail",
        "server": server,
        "message": "Error executing tool fail: no luck",
    }
    assert json.loads(invalid)["error"] == "invalid_arguments"

    first = runtime.requests[0]
    assert {tool.name for tool in first.tools} >= SERVER_TOOLS
    assert schema_of(first, "add") == {
        "type": "object",
        "properties": {
            "a": {"title": "A", "type": "integer"},
            "b": {"title": "B", "type": "integer"},
        },
        "required": ["a", "b"],
        "title": "addArguments",
    }, "the schema exactly as the server gives it"
    (description,) = [tool.description for tool in first.tools if tool.name == "greet"]
    assert description == "Greet someone by name."

    (endpoint,) = info["endpoints"]
    assert endpoint["harness"]["mcp"] == {server: "ACTIVE(8 tools)"}
    assert endpoint["toolServers"] == dict.fromkeys(sorted(SERVER_TOOLS), server)
    assert "write_todos" in endpoint["tools"], "built-ins stay"


async def test_a_stdio_server_offers_its_tools_with_schemas_and_answers_exactly(
    workspace: Path,
) -> None:
    await check_offered_and_called(tooled(stdio_server()), workspace, "server")


async def test_a_streamable_http_server_offers_its_tools_and_answers_exactly(
    workspace: Path,
) -> None:
    async with http_server() as server:
        name = server.name
        assert name.startswith("127.0.0.1:")
        await check_offered_and_called(tooled(server), workspace, name)


async def test_governance_denies_an_mcp_call_visibly(workspace: Path) -> None:
    no_wipe = deny_when("no-wipe", lambda ctx: ctx.request.metadata.get("tool_name") == "wipe")
    runtime = calling(ToolCall("wipe", {"path": "/data"}), ToolCall("add", {"a": 1, "b": 1}))
    ([frames], _) = await run(tooled(stdio_server()), runtime, workspace, policies=[no_wipe])
    denied, added = results(frames)
    assert json.loads(denied)["status"] == "cancelled"
    assert "Tool wipe denied by policy 'no-wipe'" in json.loads(denied)["message"]
    assert added == "2"
    starts = [frame["data"]["tool"] for frame in of_type(frames, "tool-start")]
    assert starts == ["wipe", "add"], "the denied call is visible too"


async def test_a_destructive_mcp_tool_waits_for_approval(workspace: Path) -> None:
    gate_deletes = ToolApprovalPolicy.custom(lambda tool: tool.kind is ToolKind.DELETE)
    runtime = calling(ToolCall("wipe", {"path": "/data"}))
    app = governed_app(
        [tooled(stdio_server())], runtime=runtime, workspace=workspace, approval_policy=gate_deletes
    )
    async with (
        serve(app) as base,
        httpx2.AsyncClient(base_url=base, timeout=60) as client,
        open_prompt(client, PATH, "wipe it") as reader,
    ):
        asked = await reader.until("approval-required")
        assert asked["data"]["tool"] == "wipe"
        answer = await client.post(
            f"{PATH}/approvals/{asked['data']['approvalId']}",
            json={"approve": True, "arguments": {"path": "/tmp/scratch"}},
        )
        assert answer.status_code == 200, answer.text
        rest = await reader.rest()
    assert results(rest) == ["wiped /tmp/scratch"], "it ran with the approver's arguments"


async def test_a_server_that_crashes_mid_call_answers_an_error_and_is_restarted(
    workspace: Path, tmp_path: Path
) -> None:
    marks = tmp_path / "starts.txt"
    runtime = rounds([ToolCall("crash", {})], [ToolCall("add", {"a": 20, "b": 22})])
    server = stdio_server(MCP_TEST_MARK=str(marks))
    ([frames], info) = await run(tooled(server), runtime, workspace)
    assert frames[-1]["event"] == "complete", "the run survives the crash"
    crashed, added = results(frames)
    error = json.loads(crashed)
    assert error["error"] == "tool_error"
    assert error["server"] == "server"
    assert "is unavailable: the connection " in error["message"]
    assert "restarted on the next call" in error["message"]
    assert added == "42", "the next call restarted the server"
    assert len(marks.read_text().split()) == 2, "one start, one restart"
    assert info["endpoints"][0]["harness"]["mcp"] == {"server": "ACTIVE(8 tools)"}


async def test_a_server_that_never_answers_times_out_within_the_tool_deadline(
    workspace: Path,
) -> None:
    runtime = rounds([ToolCall("hang", {})], [ToolCall("add", {"a": 1, "b": 2})])
    ([frames], _) = await run(
        tooled(stdio_server()), runtime, workspace, tool_execution_timeout=1.5
    )
    assert frames[-1]["event"] == "complete"
    hung, added = results(frames)
    assert json.loads(hung) == {
        "error": "tool_timeout",
        "tool": "hang",
        "timeoutSeconds": 1.5,
        "message": "Tool execution exceeded the 1.5s deadline and was cancelled",
    }
    assert added == "3", "the server still answers other calls"


@pytest.mark.parametrize(
    ("server", "reason"),
    [
        (
            MCPServerStdio(sys.executable, ["-c", "import sys; sys.exit(3)"], prefix="dead_"),
            "INACTIVE(failed to start: ",
        ),
        (
            MCPServerStdio("/nonexistent/mcp-server-binary", prefix="missing_"),
            "INACTIVE(failed to start: ",
        ),
        (
            MCPServerStdio(sys.executable, ["-c", "import time; time.sleep(60)"], prefix="mute_"),
            "INACTIVE(no answer within 1.5s while starting)",
        ),
    ],
)
async def test_a_server_that_fails_to_start_never_stops_the_app(
    workspace: Path, server: MCPServerStdio, reason: str
) -> None:
    runtime = calling(ToolCall("dead_add", {"a": 1, "b": 2}))
    ([frames], info) = await run(tooled(server), runtime, workspace, mcp_connect_timeout=1.5)
    assert frames[-1]["event"] == "complete"
    (result,) = results(frames)
    assert json.loads(result)["error"] == "unknown_tool", "its tools were never offered"
    (state,) = info["endpoints"][0]["harness"]["mcp"].values()
    assert state.startswith(reason), state


async def test_a_collision_with_a_built_in_fails_start_up_and_prefix_resolves_it(
    workspace: Path,
) -> None:
    colliding = tooled(stdio_server(MCP_TEST_COLLIDE="1"))
    host = build_host(
        HarnessSettings(workspace_root=workspace),
        runtime=ScriptedRuntime(),
        specs=[spec_of(colliding)],
    )
    with pytest.raises(ValueError, match="collides with the built-in tool") as raised:
        await host.start()
    (mcp,) = [primitive for primitive in host.primitives if isinstance(primitive, MCPPrimitive)]
    assert [c.alive for c in mcp.connections.values()] == [False], "start-up cleaned up"
    message = str(raised.value)
    assert "MCP server 'server' offers a tool named 'read_file'" in message
    assert "the built-in tool (filesystem) 'read_file'" in message
    assert "prefix=" in message

    runtime = calling(
        ToolCall("t_read_file", {"path": "a/b"}), ToolCall("read_file", {"path": "x"})
    )
    ([frames], info) = await run(
        tooled(stdio_server(prefix="t_", MCP_TEST_COLLIDE="1")), runtime, workspace
    )
    mine, builtin = results(frames)
    assert mine == "a/b"
    assert builtin.startswith("Error: File not found: x")
    assert info["endpoints"][0]["harness"]["mcp"] == {"t": "ACTIVE(9 tools)"}
    assert info["endpoints"][0]["toolServers"]["t_add"] == "t"


async def test_a_changed_tool_list_is_offered_from_the_next_request(workspace: Path) -> None:
    def turn(request: ModelRequest) -> Any:
        after = since_user(request)
        names = {tool.name for tool in request.tools}
        if not after:
            return [ToolCall("grow", {})]
        if "extra" in names and len(after) == 2:
            return [ToolCall("extra", {})]
        return " | ".join(m.content for m in after if m.role == "tool") + f" ({'extra' in names})"

    runtime = each_turn(turn)
    ([frames], info) = await run(tooled(stdio_server()), runtime, workspace)
    assert frames[-1]["data"]["summary"] == "grew | extra works (True)"
    assert info["endpoints"][0]["harness"]["mcp"] == {"server": "ACTIVE(9 tools)"}


async def test_a_huge_result_is_offloaded_and_a_huge_argument_never_reaches_the_server(
    workspace: Path,
) -> None:
    runtime = calling(
        ToolCall("big", {"lines": 400}),
        ToolCall("greet", {"name": "x" * 3000}),
    )
    ([frames], _) = await run(
        tooled(stdio_server()),
        runtime,
        workspace,
        tool_output_offload_threshold=2000,
        max_tool_argument_chars=1024,
    )
    big, greeted = results(frames)
    assert "Full output saved to tool-output/big-" in big, big[:200]
    [saved] = (workspace / "agents" / "tooled" / "files").rglob("tool-output/big-*")
    assert saved.read_text().splitlines()[-1] == "line 00399 of the long output"
    assert json.loads(greeted)["error"] == "invalid_arguments"


async def test_a_server_that_failed_at_start_up_is_started_again_by_the_next_request(
    workspace: Path, tmp_path: Path
) -> None:
    runtime = calling(ToolCall("add", {"a": 4, "b": 5}))
    server = stdio_server(MCP_TEST_FAIL_FIRST=str(tmp_path / "failed-once"))
    app = governed_app([tooled(server)], runtime=runtime, workspace=workspace)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=60) as client:
        before = (await client.get("/api/console/info")).json()
        (state,) = before["endpoints"][0]["harness"]["mcp"].values()
        assert state.startswith("INACTIVE(failed to start: "), state
        first = await post_prompt(client, PATH, "go")
        assert json.loads(results(first)[0])["error"] == "unknown_tool"
        for _ in range(300):  # the request started it again in the background
            info = (await client.get("/api/console/info")).json()
            if info["endpoints"][0]["harness"]["mcp"] == {"server": "ACTIVE(8 tools)"}:
                break
            await asyncio.sleep(0.1)
        second = await post_prompt(client, PATH, "go")
    assert results(second) == ["9"]


async def test_the_docs_example_runs() -> None:
    module = doc_example(Path(__file__).parents[2] / "docs" / "mcp.md", "mcp_doc_example")
    async with serve(module.app) as base, httpx2.AsyncClient(base_url=base, timeout=60) as client:
        frames = await post_prompt(client, "/atmosphere/agent/forecaster", "weather?")
        info = (await client.get("/api/console/info")).json()
    assert results(frames) == ["Sunny in Montreal, 21 C"]
    assert frames[-1]["data"]["summary"] == "Tomorrow: Sunny in Montreal, 21 C"
    assert info["endpoints"][0]["harness"]["mcp"] == {"weather_server": "ACTIVE(1 tools)"}


async def test_one_session_per_server_shared_by_agents_and_requests(
    workspace: Path, tmp_path: Path
) -> None:
    marks = tmp_path / "starts.txt"
    shared = stdio_server(MCP_TEST_MARK=str(marks))
    first = echo(agent("tooled", mcp_servers=[shared]), "Tooled")
    second = echo(agent("other", harness=(), mcp_servers=[shared]), "Other")
    runtime = calling(ToolCall("add", {"a": 2, "b": 2}))
    app = governed_app([first, second], runtime=runtime, workspace=workspace)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=60) as client:
        answers = [
            results(await post_prompt(client, path, "go"))
            for path in (PATH, "/atmosphere/agent/other", PATH)
        ]
        info = (await client.get("/api/console/info")).json()
    assert answers == [["4"], ["4"], ["4"]], "a bare agent gets its MCP tools too"
    assert len(marks.read_text().split()) == 1, "one process for two agents and three requests"
    assert [e["harness"]["mcp"] for e in info["endpoints"]] == [{"server": "ACTIVE(8 tools)"}] * 2


async def test_the_offline_demo_model_calls_an_mcp_tool_the_message_names(
    workspace: Path,
) -> None:
    runtime = ScriptedRuntime.demo()
    ([frames], _) = await run(tooled(stdio_server()), runtime, workspace, "please greet Ada")
    assert [(f["data"]["tool"], f["data"]["arguments"]) for f in of_type(frames, "tool-start")] == [
        ("greet", {"name": "Ada"})
    ]
    assert frames[-1]["data"]["summary"] == "The greet tool says: Hello, Ada!"
