"""Coordinator fleets: start-up validation, registration and truth (CoordinatorProcessorHarness-
PresetTest), and `delegate_task` over real HTTP (DelegateTaskToolTest)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx2
import pytest

from atmosphere_harness import (
    Harness,
    HarnessSettings,
    Message,
    ModelRequest,
    PolicyContext,
    ScriptedRuntime,
    StreamingSession,
    ToolCall,
    ToolContext,
    Transform,
    agent,
    ai_endpoint,
    coordinator,
    prompt,
    skill,
    tool,
)
from atmosphere_harness._assembly import default_primitives
from atmosphere_harness._errors import ModelError
from atmosphere_harness._kernel.host import HarnessHost
from atmosphere_harness._registry import spec_of
from tests.agents import echo
from tests.delegation_support import Recorder, deny_when, governed_app
from tests.support import of_type, serve
from tests.support import prompt as post_prompt

RESEARCHED: list[tuple[str, str | None]] = []


@agent(name="research", headless=True)
class Research:
    """Looks facts up in the team's notes."""

    @skill("default")
    async def find(self, message: str, context: ToolContext) -> str:
        RESEARCHED.append((message, context.user_id))
        return f"facts about {message}"


@agent(name="flaky", headless=True)
class Flaky:
    @skill("lookup")
    def lookup(self, message: str) -> str:
        raise RuntimeError("the index is down")


@agent(name="writer", system_prompt="You are the writer.")
class Writer:
    """Drafts text."""

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


Lead = echo(coordinator("lead", fleet=[Research, Writer, "flaky"]), "Lead")


Loner = echo(coordinator("loner"), "Loner")


MemoryLead = echo(
    coordinator("memory-lead", fleet=[Research], harness=(Harness.MEMORY,)), "MemoryLead"
)


@tool(name="delegate_task")
async def my_delegate(agent: str, message: str) -> str:
    """The host's own delegation."""
    return f"mine: {agent}"


OwnLead = echo(coordinator("own-lead", fleet=[Research]), "OwnLead", tools=[my_delegate])


Plain = echo(agent(name="plain"), "Plain")


LEAD = "/atmosphere/agent/lead"


def fleet_model(*delegations: dict[str, Any], writer: Callable[[ModelRequest], str] | None = None):
    """The coordinator asks for `delegations` in one message, then quotes the results; the
    writer answers with `writer(request)`."""

    def turn(request: ModelRequest) -> Any:
        if request.system_prompt == "You are the writer.":
            users = [m.content for m in request.messages if m.role == "user"]
            return writer(request) if writer else f"draft {len(users)}: {users[-1]}"
        if request.messages[-1].role == "user":
            return [ToolCall("delegate_task", args) for args in delegations]
        last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
        return " | ".join(m.content for m in request.messages[last_user:] if m.role == "tool")

    return ScriptedRuntime((), default=turn)


async def run_lead(
    workspace: Path,
    *delegations: dict[str, Any],
    policies: Sequence[Any] = (),
    prompts: Sequence[str] = ("go",),
    writer: Callable[[ModelRequest], str] | None = None,
) -> tuple[list[list[dict[str, Any]]], ScriptedRuntime]:
    runtime = fleet_model(*delegations, writer=writer)
    app = governed_app(
        [Lead, Research, Writer, Flaky], runtime=runtime, workspace=workspace, policies=policies
    )
    runs = []
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        for text in prompts:
            runs.append(await post_prompt(client, LEAD, text, conversation_id="thread"))
    return runs, runtime


def summary(frames: list[dict[str, Any]]) -> str:
    assert frames[-1]["event"] == "complete", frames[-1]
    return str(frames[-1]["data"]["summary"])


# --- delegate_task ----------------------------------------------------------------------------


async def test_a_headless_member_answers_through_its_skill(workspace: Path) -> None:
    RESEARCHED.clear()
    (frames,), _ = await run_lead(workspace, {"agent": "research", "message": "otters"})
    assert summary(frames) == "facts about otters"
    assert RESEARCHED == [("otters", None)]


async def test_a_prompt_member_runs_its_own_loop_in_its_own_stable_conversation(
    workspace: Path,
) -> None:
    runs, runtime = await run_lead(
        workspace, {"agent": "writer", "message": "a haiku"}, prompts=("one", "two")
    )
    assert [summary(frames) for frames in runs] == ["draft 1: a haiku", "draft 2: a haiku"]
    writer_requests = [r for r in runtime.requests if r.system_prompt == "You are the writer."]
    conversations = {r.conversation_id for r in writer_requests}
    assert len(conversations) == 1
    assert "thread" not in conversations
    # Only the coordinator's own frames reach its stream: the writer's text stays inside.
    texts = "".join(f["data"]["text"] for f in of_type(runs[0], "text"))
    assert texts == "draft 1: a haiku"
    assert {f["conversationId"] for f in runs[0]} == {"thread"}


async def test_unknown_and_blank_agents_list_the_available_ones(workspace: Path) -> None:
    (frames,), _ = await run_lead(
        workspace, {"agent": "ghost", "message": "x"}, {"agent": "  ", "message": "x"}
    )
    unknown, blank = summary(frames).split(" | ")
    assert unknown == (
        "delegate_task failed: unknown agent 'ghost'. Available agents: [research, writer, flaky]"
    )
    assert blank == (
        "delegate_task failed: 'agent' is required. Available agents: [research, writer, flaky]"
    )


async def test_a_member_failure_is_a_tool_result_not_a_crash(workspace: Path) -> None:
    def broken(request: ModelRequest) -> str:
        raise ModelError("writer model is down")

    (frames,), _ = await run_lead(
        workspace,
        {"agent": "flaky", "message": "x"},
        {"agent": "writer", "message": "x"},
        writer=broken,
    )
    flaky, writer = summary(frames).split(" | ")
    assert flaky == "delegate_task to 'flaky' failed: the index is down"
    assert writer == "delegate_task to 'writer' failed: writer model is down"


async def test_the_fleet_edge_is_governed_fail_closed(workspace: Path) -> None:
    RESEARCHED.clear()
    guard = deny_when(
        "no-research",
        lambda ctx: ctx.request.metadata.get("fleet.dispatch.agent") == "research",
        "no research today",
    )
    (frames,), _ = await run_lead(
        workspace, {"agent": "research", "message": "otters"}, policies=[guard]
    )
    assert summary(frames) == (
        "delegate_task to 'research' failed: fleet-interceptor denied: no research today"
    )
    assert RESEARCHED == []
    dispatch = next(c for c in guard.seen if "fleet.dispatch.agent" in c.request.metadata)
    assert dispatch.request.message == "otters"
    assert dispatch.request.metadata["fleet.dispatch.skill"] == "default"

    def broken(ctx: PolicyContext) -> Any:
        if "fleet.dispatch.agent" in ctx.request.metadata:
            raise RuntimeError("policy store offline")
        return Transform(ctx.request)

    (frames,), _ = await run_lead(
        workspace, {"agent": "research", "message": "otters"}, policies=[Recorder("p", broken)]
    )
    assert summary(frames) == (
        "delegate_task to 'research' failed: fleet-interceptor denied: policy 'p' evaluation failed"
    )
    assert RESEARCHED == []


async def test_a_transform_rewrites_what_the_member_receives(workspace: Path) -> None:
    RESEARCHED.clear()

    def redact(ctx: PolicyContext) -> Any:
        if "fleet.dispatch.agent" in ctx.request.metadata:
            return Transform(ctx.request.with_message(ctx.request.message.replace("ACME", "[x]")))
        return Transform(ctx.request)

    (frames,), _ = await run_lead(
        workspace,
        {"agent": "research", "message": "ACME revenue"},
        policies=[Recorder("redact", redact)],
    )
    assert RESEARCHED == [("[x] revenue", None)]
    assert summary(frames) == "facts about [x] revenue"


async def test_delegations_in_one_message_run_together(workspace: Path) -> None:
    RESEARCHED.clear()
    (frames,), _ = await run_lead(
        workspace,
        {"agent": "research", "message": "a"},
        {"agent": "writer", "message": "b"},
        {"agent": "research", "message": "c"},
    )
    assert summary(frames) == "facts about a | draft 1: b | facts about c"


async def test_a_coordinator_without_a_fleet_says_so(workspace: Path) -> None:
    runtime = ScriptedRuntime([[ToolCall("delegate_task", {"agent": "x", "message": "y"})], "ok"])
    app = governed_app([Loner], runtime=runtime, workspace=workspace)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        frames = await post_prompt(client, "/atmosphere/agent/loner", "go")
    result = of_type(frames, "tool-result")[0]["data"]["result"]
    assert result == "delegate_task unavailable: no agent fleet is bound to this session."


# --- registration and truth -------------------------------------------------------------------


async def start_host(classes: Sequence[type], workspace: Path, **settings: Any) -> HarnessHost:
    host = HarnessHost(
        HarnessSettings(workspace_root=workspace, **settings),
        runtime=ScriptedRuntime(),
        specs=[spec_of(cls) for cls in classes],
        primitives=default_primitives(),
    )
    try:
        await host.start()
    except BaseException:
        await host.stop()
        raise
    return host


async def test_delegation_registers_both_tools_and_reports_active(workspace: Path) -> None:
    host = await start_host([Lead, MemoryLead, OwnLead, Plain, Writer, Research, Flaky], workspace)
    try:
        lead = host.endpoints[LEAD]
        assert {"delegate_task", "task"} <= set(lead.tools)
        assert {"write_todos", "read_file", "write_file"} <= set(lead.tools)
        assert lead.tools["task"].concurrent
        assert lead.tools["delegate_task"].concurrent
        assert set(lead.tools["delegate_task"].parameters["properties"]) == {"agent", "message"}
        assert "- research: Looks facts up in the team's notes." in (
            lead.tools["delegate_task"].description
        )
        assert host.truth.endpoint(LEAD)["delegation"] == "ACTIVE"

        memory_lead = host.endpoints["/atmosphere/agent/memory-lead"]
        assert not {"delegate_task", "task"} & set(memory_lead.tools)
        assert host.truth.endpoint(memory_lead.path)["delegation"] == "INACTIVE(disabled)"

        own = host.endpoints["/atmosphere/agent/own-lead"]
        assert own.tools["delegate_task"].origin == "user"
        assert "task" in own.tools
        assert host.truth.endpoint(own.path)["delegation"] == "ACTIVE(user-tool)"

        plain = host.endpoints["/atmosphere/agent/plain"]
        assert not {"delegate_task", "task"} & set(plain.tools)
        assert host.truth.endpoint(plain.path)["delegation"] == "INACTIVE(no-coordinator)"
        assert host.truth.app_wide()["delegation"].startswith("ACTIVE")
    finally:
        await host.stop()


async def test_without_a_coordinator_delegation_is_inactive(workspace: Path) -> None:
    for enabled, expected in ((True, "INACTIVE(no-coordinator)"), (None, "INACTIVE(disabled)")):
        host = await start_host([Plain], workspace, enabled=enabled)
        try:
            assert host.truth.app_wide()["delegation"] == expected
        finally:
            await host.stop()


async def test_a_fleet_class_the_router_was_not_given_is_hosted_too(workspace: Path) -> None:
    @coordinator("class-lead", fleet=[Research, Writer])
    class ClassLead:
        @prompt
        async def chat(self, message: str) -> None: ...

    host = await start_host([ClassLead], workspace)
    try:
        assert "/atmosphere/agent/writer" in host.endpoints
        assert set(host.agents) == {"class-lead", "research", "writer"}
    finally:
        await host.stop()
    # A name is not a declaration: it must be among the hosted agents.
    await _start_fails([Lead], workspace, "fleet entry 'flaky' is not a declared agent")


async def _start_fails(classes: Sequence[type], workspace: Path, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        await start_host(classes, workspace)


async def test_fleets_are_validated_at_start_up(workspace: Path) -> None:
    @coordinator("c-ghost", fleet=["ghost"])
    class Ghost:
        @prompt
        async def chat(self, message: str) -> None: ...

    await _start_fails([Ghost], workspace, r"fleet entry 'ghost' is not a declared agent")

    class NotAnAgent:
        pass

    @coordinator("c-undecorated", fleet=[NotAnAgent])
    class Undecorated:
        @prompt
        async def chat(self, message: str) -> None: ...

    await _start_fails([Undecorated], workspace, "NotAnAgent is not decorated")

    @coordinator("c-twice", fleet=[Research, "research"])
    class Twice:
        @prompt
        async def chat(self, message: str) -> None: ...

    await _start_fails([Twice, Research], workspace, "lists 'research' more than once")

    @ai_endpoint("/atmosphere/not-a-member")
    class Endpoint:
        @prompt
        async def chat(self, message: str) -> None: ...

    @coordinator("c-endpoint", fleet=[Endpoint])
    class WithEndpoint:
        @prompt
        async def chat(self, message: str) -> None: ...

    await _start_fails([WithEndpoint], workspace, "is an ai_endpoint")

    @agent("many-skills", headless=True)
    class ManySkills:
        @skill("a")
        async def a(self, message: str) -> str: ...

        @skill("b")
        async def b(self, message: str) -> str: ...

    @coordinator("c-many", fleet=[ManySkills])
    class WithMany:
        @prompt
        async def chat(self, message: str) -> None: ...

    await _start_fails([WithMany], workspace, r"name one @skill\('default'\)")


async def test_fleet_cycles_are_rejected(workspace: Path) -> None:
    @coordinator("cycle-a", fleet=["cycle-b"])
    class A:
        @prompt
        async def chat(self, message: str) -> None: ...

    @coordinator("cycle-b", fleet=["cycle-a"])
    class B:
        @prompt
        async def chat(self, message: str) -> None: ...

    await _start_fails([A, B], workspace, "fleet cycle: cycle-a -> cycle-b -> cycle-a")

    @coordinator("narcissus", fleet=["narcissus"])
    class Narcissus:
        @prompt
        async def chat(self, message: str) -> None: ...

    await _start_fails([Narcissus], workspace, "fleet cycle: narcissus -> narcissus")


async def test_a_nested_coordinator_is_a_prompt_member(workspace: Path) -> None:
    SubLead = echo(
        coordinator("sub-lead", fleet=[Research], system_prompt="You are the sub lead."), "SubLead"
    )

    Top = echo(coordinator("top", fleet=[SubLead]), "Top")

    def turn(request: ModelRequest) -> Any:
        last: Message = request.messages[-1]
        if last.role == "tool":
            return last.content
        if request.system_prompt == "You are the sub lead.":
            return [ToolCall("delegate_task", {"agent": "research", "message": last.content})]
        return [ToolCall("delegate_task", {"agent": "sub-lead", "message": "voles"})]

    app = governed_app([Top], runtime=ScriptedRuntime((), default=turn), workspace=workspace)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        frames = await post_prompt(client, "/atmosphere/agent/top", "go")
    assert summary(frames) == "facts about voles"


async def test_a_fleet_members_gated_call_is_answered_by_the_coordinators_client(
    workspace: Path,
) -> None:
    from tests.delegation_support import open_prompt

    sent: list[str] = []

    @tool(requires_approval=True)
    async def publish(text: str) -> str:
        """Publish a text (needs approval)."""
        sent.append(text)
        return f"published {text}"

    Publisher = echo(
        agent(name="publisher", system_prompt="You are the publisher."),
        "Publisher",
        tools=[publish],
    )

    Editor = echo(coordinator("editor", fleet=[Publisher]), "Editor")

    def turn(request: ModelRequest) -> Any:
        last = request.messages[-1]
        if last.role == "tool":
            return last.content
        if request.system_prompt == "You are the publisher.":
            return [ToolCall("publish", {"text": last.content})]
        return [ToolCall("delegate_task", {"agent": "publisher", "message": "hello"})]

    app = governed_app([Editor], runtime=ScriptedRuntime((), default=turn), workspace=workspace)
    path = "/atmosphere/agent/editor"
    async with (
        serve(app) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
        open_prompt(client, path, "go") as reader,
    ):
        asked = await reader.until("approval-required")
        assert asked["data"]["fleetAgent"] == "publisher"
        assert asked["data"]["tool"] == "publish"
        answer = await client.post(
            f"{path}/approvals/{asked['data']['approvalId']}", json={"approve": True}
        )
        assert answer.status_code == 200
        rest = await reader.rest()
    assert sent == ["hello"]
    assert rest[-1]["data"]["summary"] == "published hello"
