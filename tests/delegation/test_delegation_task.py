"""The `task` sub-agent over real HTTP (SpawnSubagentToolTest, and what deepagents gets wrong):
isolation, bounds, governance, timeouts, parallel failure containment, cleanup, frames."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx2
import pytest

from atmosphere_harness import (
    HarnessDep,
    ModelRequest,
    PolicyContext,
    ScriptedRuntime,
    ToolApprovalPolicy,
    ToolCall,
    ToolKind,
    Transform,
    agent,
    coordinator,
)
from atmosphere_harness._delegation import SYSTEM_PROMPT
from atmosphere_harness._errors import ModelError
from atmosphere_harness._filesystem import spares
from atmosphere_harness._filesystem.paths import store_key
from atmosphere_harness._filesystem.workspace import WorkspaceAgentFileSystem
from atmosphere_harness._governance import policy_chain
from tests.agents import echo
from tests.delegation_support import Recorder, deny_when, governed_app, open_prompt
from tests.support import of_type, serve
from tests.support import prompt as post_prompt

FILE_TOOLS = {"ls", "read_file", "write_file", "edit_file", "glob", "grep", "delete", "rename"}
BOSS = "/atmosphere/agent/boss"


Boss = echo(coordinator("boss", fleet=()), "Boss")


Echo = echo(agent(name="echo", harness=()), "Echo")


def is_sub(request: ModelRequest) -> bool:
    return request.system_prompt == SYSTEM_PROMPT


def since_user(request: ModelRequest) -> list[Any]:
    last = max(i for i, m in enumerate(request.messages) if m.role == "user")
    return list(request.messages[last + 1 :])


def model(
    first: Sequence[ToolCall] | Callable[[ModelRequest], Any],
    sub: Callable[[ModelRequest], Any],
) -> ScriptedRuntime:
    """The parent asks for `first` (calls, or a turn function) and then quotes its tool results;
    every sub-agent turn is `sub(request)`."""

    def turn(request: ModelRequest) -> Any:
        if is_sub(request):
            return sub(request)
        if callable(first):
            return first(request)
        after = since_user(request)
        if not after:
            return list(first)
        return " | ".join(m.content for m in after if m.role == "tool")

    return ScriptedRuntime((), default=turn)


def plan_write_report(request: ModelRequest) -> Any:
    """A well-behaved sub-agent: plan, write a file, report."""
    rounds = sum(1 for m in since_user(request) if m.role == "assistant")
    task = request.messages[0].content
    if rounds == 0:
        todos = [{"content": "Do it", "status": "in_progress", "activeForm": "Doing it"}]
        return [ToolCall("write_todos", {"todos": todos, "goal": task})]
    if rounds == 1:
        return [ToolCall("write_file", {"path": "notes.md", "content": task})]
    return f"  report on {task}  \n"


def sub_requests(runtime: ScriptedRuntime) -> list[ModelRequest]:
    return [r for r in runtime.requests if is_sub(r)]


async def run_boss(
    runtime: ScriptedRuntime, workspace: Path, *prompts: str, **options: Any
) -> list[list[dict[str, Any]]]:
    options.setdefault("subagent_workspace_dir", workspace.parent / "spawns")
    Path(options["subagent_workspace_dir"]).mkdir(exist_ok=True)
    app = governed_app([Boss, Echo], runtime=runtime, workspace=workspace, **options)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=60) as client:
        return [await post_prompt(client, BOSS, text) for text in prompts or ("go",)]


def leftovers(workspace: Path) -> list[Path]:
    return sorted((workspace.parent / "spawns").glob("*"))


def results(frames: list[dict[str, Any]]) -> list[str]:
    """Tool results in the order they finished (concurrent calls finish in any order)."""
    return [f["data"]["result"] for f in of_type(frames, "tool-result")]


def quoted(frames: list[dict[str, Any]]) -> list[str]:
    """The tool results in call order, as the parent model quoted them in its answer."""
    assert frames[-1]["event"] == "complete", frames[-1]
    return str(frames[-1]["data"]["summary"]).split(" | ")


async def test_an_isolated_spawn_plans_writes_and_only_its_report_crosses_back(
    workspace: Path,
) -> None:
    runtime = model([ToolCall("task", {"description": "count the otters"})], plan_write_report)
    (frames,) = await run_boss(runtime, workspace)
    assert frames[-1]["event"] == "complete"
    assert results(frames) == ["report on count the otters"]

    subs = sub_requests(runtime)
    first = subs[0]
    parent_conversation = frames[0]["conversationId"]
    assert first.conversation_id != parent_conversation
    assert str(uuid.UUID(first.conversation_id)) == first.conversation_id
    assert {r.conversation_id for r in subs} == {first.conversation_id}
    assert first.messages[0].role == "user"
    assert first.messages[0].content == "count the otters"
    assert len(first.messages) == 1, "no history: a fresh context"
    assert {t.name for t in first.tools} == {"write_todos", *FILE_TOOLS, "task"}

    start = of_type(frames, "subagent-start")[0]["data"]
    assert start == {
        "subagentId": first.conversation_id,
        "agentId": "subagent-" + first.conversation_id[:8],
        "description": "count the otters",
    }
    plans = of_type(frames, "plan-update")
    assert [p["data"]["subagentId"] for p in plans] == [first.conversation_id]
    assert plans[0]["data"]["agentId"] == start["agentId"]
    assert plans[0]["data"]["conversationId"] == first.conversation_id
    # Nothing else of the sub-agent leaks: no tool frames of its own, no text.
    assert [f["data"]["tool"] for f in of_type(frames, "tool-start")] == ["task"]
    text = "".join(f["data"]["text"] for f in of_type(frames, "text"))
    assert text == "report on count the otters"
    end = of_type(frames, "subagent-end")[0]["data"]
    assert end["subagentId"] == first.conversation_id
    assert end["status"] == "completed"
    assert end["report"] == "report on count the otters"
    assert end["usage"]["inputTokens"] > 0
    assert frames[-1]["data"]["usage"]["inputTokens"] > end["usage"]["inputTokens"]
    assert leftovers(workspace) == [], "the per-spawn workspace is removed"


async def test_bad_arguments_are_refused_without_spawning(workspace: Path) -> None:
    runtime = model(
        [
            ToolCall("task", {"description": "   "}),
            ToolCall("task", {"description": "x", "subagent_type": "researcher"}),
            ToolCall("task", {"description": "ok", "subagent_type": " General-Purpose "}),
        ],
        lambda request: "fine",
    )
    (frames,) = await run_boss(runtime, workspace)
    assert quoted(frames) == [
        "task failed: 'description' is required.",
        "task failed: unknown subagent_type 'researcher'. Only 'general-purpose' is supported "
        "— use delegate_task for a named fleet specialist.",
        "fine",
    ]
    assert len(of_type(frames, "subagent-start")) == 1
    assert len(sub_requests(runtime)) == 1


async def test_governance_denies_the_spawn_fail_closed(workspace: Path) -> None:
    guard = deny_when(
        "no-spawning", lambda ctx: "subagent.spawn" in ctx.request.metadata, "no spawning"
    )
    runtime = model([ToolCall("task", {"description": "dig"})], plan_write_report)
    (frames,) = await run_boss(runtime, workspace, policies=[guard])
    assert results(frames) == ["task denied by policy: no spawning"]
    assert sub_requests(runtime) == []
    spawn = next(c for c in guard.seen if "subagent.spawn" in c.request.metadata)
    assert spawn.request.message == "dig"
    assert spawn.request.metadata["subagent.spawn"] == "general-purpose"
    end = of_type(frames, "subagent-end")[0]["data"]
    assert end["status"] == "denied"
    assert end["error"] == "no spawning"

    def broken(ctx: PolicyContext) -> Any:
        if "subagent.spawn" in ctx.request.metadata:
            raise RuntimeError("offline")
        return Transform(ctx.request)

    runtime = model([ToolCall("task", {"description": "dig"})], plan_write_report)
    (frames,) = await run_boss(runtime, workspace, policies=[Recorder("p", broken)])
    assert results(frames) == ["task denied by policy: policy 'p' evaluation failed"]
    assert sub_requests(runtime) == []


async def test_the_transformed_description_is_what_the_sub_agent_receives(
    workspace: Path,
) -> None:
    def redact(ctx: PolicyContext) -> Any:
        if "subagent.spawn" in ctx.request.metadata:
            return Transform(ctx.request.with_message(ctx.request.message.replace("4111", "****")))
        return Transform(ctx.request)

    runtime = model(
        [ToolCall("task", {"description": "check card 4111"})], lambda request: "checked"
    )
    (frames,) = await run_boss(runtime, workspace, policies=[Recorder("redact", redact)])
    assert results(frames) == ["checked"]
    assert sub_requests(runtime)[0].messages[0].content == "check card ****"


async def test_a_policy_installed_while_running_governs_the_next_spawn(workspace: Path) -> None:
    runtime = model([ToolCall("task", {"description": "dig"})], lambda request: "dug")
    spawns = workspace.parent / "spawns"
    spawns.mkdir()
    app = governed_app([Boss], runtime=runtime, workspace=workspace, subagent_workspace_dir=spawns)

    @app.post("/install")
    async def install(host: HarnessDep) -> None:
        policy_chain(host).install(
            deny_when("late", lambda ctx: "subagent.spawn" in ctx.request.metadata, "too late")
        )

    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        before = await post_prompt(client, BOSS, "one")
        await client.post("/install")
        after = await post_prompt(client, BOSS, "two")
    assert results(before) == ["dug"]
    assert results(after) == ["task denied by policy: too late"]


async def test_the_sub_agent_timeout_wins_over_the_generic_tool_timeout(workspace: Path) -> None:
    async def stuck(request: ModelRequest) -> str:
        await asyncio.sleep(30)
        return "never"

    runtime = model([ToolCall("task", {"description": "wait"})], stuck)
    (frames,) = await run_boss(runtime, workspace, subagent_timeout=0.5, tool_execution_timeout=0.2)
    assert results(frames) == ["task did not complete within 0.5 seconds."]
    assert of_type(frames, "subagent-end")[0]["data"]["status"] == "timeout"
    assert frames[-1]["event"] == "complete"
    assert leftovers(workspace) == []


async def test_the_depth_bound(workspace: Path) -> None:
    def always_spawn(request: ModelRequest) -> Any:
        if not since_user(request):
            return [ToolCall("task", {"description": f"level below {request.conversation_id}"})]
        return " | ".join(m.content for m in since_user(request) if m.role == "tool")

    runtime = model(always_spawn, always_spawn)
    (frames,) = await run_boss(runtime, workspace)
    subs = sub_requests(runtime)
    by_conversation: dict[str, set[str]] = {}
    for request in subs:
        by_conversation.setdefault(request.conversation_id, {t.name for t in request.tools})
    assert len(by_conversation) == 2, "a spawn, and its spawn; the third level never starts"
    tool_sets = sorted(by_conversation.values(), key=len)
    assert "task" not in tool_sets[0]
    assert "task" in tool_sets[1]
    nested = of_type(frames, "subagent-start")
    assert len(nested) == 2
    assert "parentSubagentId" in nested[1]["data"]
    # The runtime check is there too (a runtime that calls `task` re-entrantly meets it).
    runtime = model([ToolCall("task", {"description": "x"})], lambda request: "no")
    (frames,) = await run_boss(runtime, workspace, subagent_max_depth=0)
    assert results(frames) == [
        "task refused: maximum subagent nesting depth (0) reached — complete this step inline "
        "instead of spawning again."
    ]


async def test_spawns_are_counted_per_request_and_the_count_resets(workspace: Path) -> None:
    calls = [ToolCall("task", {"description": f"job {n}"}) for n in range(9)]
    runtime = model(calls, lambda request: "done " + request.messages[0].content)
    first, second = await run_boss(runtime, workspace, "one", "two")
    for frames in (first, second):
        got = quoted(frames)
        assert got[:8] == [f"done job {n}" for n in range(8)]
        assert got[8] == "task refused: maximum subagent spawns (8) for this request reached."
    assert len(sub_requests(runtime)) == 16


async def test_a_runaway_model_is_stopped_and_the_server_stays_responsive(
    workspace: Path,
) -> None:
    started = asyncio.Event()

    def runaway(request: ModelRequest) -> Any:
        if request.system_prompt.startswith("You are echo"):
            return "still here"
        started.set()
        return [ToolCall("task", {"description": "again"}), ToolCall("task", {"description": "x"})]

    runtime = ScriptedRuntime((), default=runaway)
    spawns = workspace.parent / "spawns"
    spawns.mkdir()
    app = governed_app(
        [Boss, Echo],
        runtime=runtime,
        workspace=workspace,
        subagent_workspace_dir=spawns,
        max_tool_rounds=6,
    )
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=60) as client:
        boss = asyncio.create_task(post_prompt(client, BOSS, "go"))
        await asyncio.wait_for(started.wait(), 10)
        echo = await post_prompt(client, "/atmosphere/agent/echo", "ping")
        frames = await asyncio.wait_for(boss, 60)
    assert echo[-1]["event"] == "complete"
    assert frames[-1]["event"] == "error", "the round limit ends the runaway run"
    assert len(of_type(frames, "subagent-start")) == 8, "8 spawns per request, nested included"
    refused = [r for r in results(frames) if r.startswith("task refused")]
    assert refused
    assert all("maximum subagent spawns (8)" in r for r in refused)
    assert sorted(spawns.iterdir()) == [], "no temp workspace is left behind"


async def test_one_failing_sub_agent_never_cancels_its_siblings(workspace: Path) -> None:
    async def sub(request: ModelRequest) -> str:
        task = request.messages[0].content
        if task == "explode":
            raise ModelError("kaboom")
        await asyncio.sleep(0.1)
        return f"report {task}"

    calls = [ToolCall("task", {"description": d}) for d in ("a", "explode", "c")]
    (frames,) = await run_boss(model(calls, sub), workspace)
    assert quoted(frames) == ["report a", "task failed: kaboom", "report c"]
    assert frames[-1]["event"] == "complete"
    statuses = sorted(f["data"]["status"] for f in of_type(frames, "subagent-end"))
    assert statuses == ["completed", "completed", "failed"]
    assert leftovers(workspace) == []


async def test_the_sub_agent_cannot_reach_the_parents_files(workspace: Path) -> None:
    def parent(request: ModelRequest) -> Any:
        after = since_user(request)
        if not after:
            return [ToolCall("write_file", {"path": "secret.txt", "content": "s3cret"})]
        if len(after) == 2:
            return [ToolCall("task", {"description": "snoop"})]
        if len(after) == 4:
            return [ToolCall("ls", {})]
        return " | ".join(m.content for m in after if m.role == "tool")

    def snoop(request: ModelRequest) -> Any:
        if not since_user(request):
            return [
                ToolCall("read_file", {"path": "secret.txt"}),
                ToolCall("read_file", {"path": "../../secret.txt"}),
                ToolCall("glob", {"pattern": "**/*"}),
                ToolCall("write_file", {"path": "leak.txt", "content": "x"}),
            ]
        return " || ".join(m.content for m in since_user(request) if m.role == "tool")

    runtime = model(parent, snoop)
    (frames,) = await run_boss(runtime, workspace)
    report = results(frames)[1]
    read_plain, read_escape, globbed, wrote = report.split(" || ")
    assert read_plain.startswith("Error:")
    assert "s3cret" not in read_plain
    assert read_escape.startswith("Error:")
    assert globbed == "(no matches)"
    assert wrote == "Wrote leak.txt"
    # Its write stayed inside while it ran; once it ended, its files are kept in their own
    # folder, never over the parent's.
    (start,) = of_type(frames, "subagent-start")
    kept = f"subagents/{start['data']['agentId']}"
    assert results(frames)[2] == "subagents/\nsecret.txt (6 bytes)"
    [leak] = workspace.rglob("leak.txt")
    assert leak.as_posix().endswith(f"/{kept}/leak.txt")


async def test_a_sub_agents_files_are_kept_in_the_parent_conversation(workspace: Path) -> None:
    spawned: list[str] = []

    def parent(request: ModelRequest) -> Any:
        after = since_user(request)
        if not after:
            return [ToolCall("task", {"description": "count the otters"})]
        if len(after) == 2:
            folder = f"subagents/subagent-{spawned[0][:8]}"
            return [ToolCall("read_file", {"path": f"{folder}/notes.md"})]
        return " | ".join(m.content for m in after if m.role == "tool")

    def sub(request: ModelRequest) -> Any:
        spawned.append(request.conversation_id)
        return plan_write_report(request)

    (frames,) = await run_boss(model(parent, sub), workspace)
    (end,) = of_type(frames, "subagent-end")
    folder = "subagents/subagent-" + end["data"]["subagentId"][:8]
    assert end["data"]["files"] == folder
    assert results(frames)[1] == "count the otters", "the parent reads what it wrote"
    conversation = frames[0]["conversationId"]
    [kept] = workspace.glob(f"*/*/files/{conversation}/{folder}/notes.md")
    assert kept.read_text() == "count the otters"
    assert leftovers(workspace) == [], "the per-spawn workspace is still removed"

    # A sub-agent that wrote nothing leaves nothing, and its end frame names no folder.
    runtime = model([ToolCall("task", {"description": "x"})], lambda request: "ok")
    (frames,) = await run_boss(runtime, workspace)
    (end,) = of_type(frames, "subagent-end")
    assert "files" not in end["data"]
    assert not list(workspace.glob(f"*/*/files/{frames[0]['conversationId']}/subagents"))


async def test_a_sub_agent_s_files_are_listed_from_its_count_and_nothing_of_it_stays(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walked: list[str] = []
    real_glob = WorkspaceAgentFileSystem.glob

    async def glob(self: WorkspaceAgentFileSystem, pattern: str) -> list[str]:
        walked.append(str(self.root))
        return await real_glob(self, pattern)

    monkeypatch.setattr(WorkspaceAgentFileSystem, "glob", glob)
    runtime = model([ToolCall("task", {"description": "count the otters"})], plan_write_report)
    (frames,) = await run_boss(runtime, workspace)
    (end,) = of_type(frames, "subagent-end")
    assert end["data"]["files"] == "subagents/subagent-" + end["data"]["subagentId"][:8]
    assert walked == [], "the kept files are listed from the sub-agent's store, not walked"
    assert leftovers(workspace) == []
    spawns = store_key(workspace.parent / "spawns")
    named = [*spares.SPARES._homes, *spares.SPARES._named]
    assert [home for home in named if home.startswith(spawns)] == [], "no spares kept for it"


async def test_a_nested_sub_agents_files_are_kept_inside_its_parents_folder(
    workspace: Path,
) -> None:
    def sub(request: ModelRequest) -> Any:
        after = since_user(request)
        if request.messages[0].content == "outer":
            return [ToolCall("task", {"description": "inner"})] if not after else "outer done"
        if not after:
            return [ToolCall("write_file", {"path": "deep.md", "content": "from below"})]
        return "inner done"

    (frames,) = await run_boss(model([ToolCall("task", {"description": "outer"})], sub), workspace)
    starts = {f["data"]["description"]: f["data"] for f in of_type(frames, "subagent-start")}
    ends = {f["data"]["subagentId"]: f["data"] for f in of_type(frames, "subagent-end")}
    outer, inner = starts["outer"], starts["inner"]
    assert ends[inner["subagentId"]]["files"] == f"subagents/{inner['agentId']}"
    assert ends[outer["subagentId"]]["files"] == f"subagents/{outer['agentId']}"
    conversation = frames[0]["conversationId"]
    path = f"subagents/{outer['agentId']}/subagents/{inner['agentId']}/deep.md"
    [kept] = workspace.glob(f"*/*/files/{conversation}/{path}")
    assert kept.read_text() == "from below"


async def test_cancelling_the_parent_cancels_the_sub_agent_and_removes_its_workspace(
    workspace: Path,
) -> None:
    entered, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(request: ModelRequest) -> Any:
        if not since_user(request):
            return [ToolCall("write_file", {"path": "wip.md", "content": "half"})]
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    spawns = workspace.parent / "spawns"
    spawns.mkdir()
    runtime = model([ToolCall("task", {"description": "slow"})], slow)
    app = governed_app([Boss], runtime=runtime, workspace=workspace, subagent_workspace_dir=spawns)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        async with open_prompt(client, BOSS, "go") as reader:
            await reader.until("subagent-start")
            await asyncio.wait_for(entered.wait(), 10)
            assert len(list(spawns.iterdir())) == 1
        await asyncio.wait_for(cancelled.wait(), 10)
        for _ in range(100):
            if not list(spawns.iterdir()):
                break
            await asyncio.sleep(0.05)
    assert list(spawns.iterdir()) == []


async def test_a_sub_agents_gated_call_is_answered_on_the_coordinators_route(
    workspace: Path,
) -> None:
    def careful(request: ModelRequest) -> Any:
        after = since_user(request)
        if not after:
            return [ToolCall("write_file", {"path": "old.md", "content": "x"})]
        if len(after) == 2:
            return [ToolCall("delete", {"path": "old.md"})]
        return after[-1].content

    spawns = workspace.parent / "spawns"
    spawns.mkdir()
    runtime = model([ToolCall("task", {"description": "tidy up"})], careful)
    app = governed_app(
        [Boss],
        runtime=runtime,
        workspace=workspace,
        subagent_workspace_dir=spawns,
        approval_policy=ToolApprovalPolicy.custom(lambda tool: tool.kind is ToolKind.DELETE),
    )
    async with (
        serve(app) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
        open_prompt(client, BOSS, "go") as reader,
    ):
        start = await reader.until("subagent-start")
        asked = await reader.until("approval-required")
        assert asked["data"]["subagentId"] == start["data"]["subagentId"]
        assert asked["data"]["tool"] == "delete"
        answered = await client.post(
            f"{BOSS}/approvals/{asked['data']['approvalId']}", json={"approve": True}
        )
        assert answered.status_code == 200
        rest = await reader.rest()
    assert results(rest) == ["Deleted old.md"]


async def test_the_demo_model_spawns_a_sub_agent_that_plans_and_writes_a_file(
    workspace: Path,
) -> None:
    runtime = ScriptedRuntime.demo()
    (frames,) = await run_boss(
        runtime,
        workspace,
        "Use the task tool to spawn a general-purpose subagent to brainstorm three "
        "team-building activities, then give me its report.",
    )
    assert frames[-1]["event"] == "complete"
    (start,) = of_type(frames, "subagent-start")
    # The sub-agent gets the subtask, not the instruction to spawn it.
    assert start["data"]["description"].startswith("brainstorm three team-building activities. ")
    plans = of_type(frames, "plan-update")
    assert len(plans) == 2
    assert {p["data"]["subagentId"] for p in plans} == {start["data"]["subagentId"]}
    assert [s["status"] for s in plans[-1]["data"]["steps"]] == ["completed"] * 3
    sub_tool_results = [
        m.content for r in sub_requests(runtime) for m in r.messages if m.role == "tool"
    ]
    assert "Wrote report.md" in sub_tool_results
    assert "report.md" in results(frames)[0]
    assert json.dumps(frames[-1]["data"]["summary"]).count("sub-agent") >= 1
