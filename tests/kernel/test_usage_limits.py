"""Usage limits over a whole run (sub-agents and fleet members included), over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import (
    HarnessSettings,
    ModelRequest,
    ScriptedRuntime,
    StreamingSession,
    ToolCall,
    UsageLimits,
    prompt,
    tool,
)
from atmosphere_harness._registry import AgentRegistry
from tests.support import client_for, make_app, of_type
from tests.support import prompt as post_prompt

CALLS: list[str] = []


@tool
async def note(text: str) -> str:
    """Write a note down."""
    CALLS.append(text)
    return f"noted {text}"


def limited_agent(
    limits: UsageLimits | None, *, fleet: tuple[type, ...] = (), coordinator: bool = False
) -> type:
    registry = AgentRegistry()
    declare = (
        registry.coordinator("limited", fleet=fleet, usage_limits=limits)
        if fleet or coordinator
        else registry.agent(name="limited", usage_limits=limits)
    )

    @declare
    class Limited:
        tools = [note]

        @prompt
        async def chat(self, message: str, session: StreamingSession) -> None:
            await session.stream(message)

    return Limited


async def run(
    workspace: Path, agents: list[type], runtime: ScriptedRuntime, **settings: Any
) -> list[dict[str, Any]]:
    CALLS.clear()
    app = make_app(agents, runtime=runtime, workspace=workspace, **settings)
    async with client_for(app) as client:
        return await post_prompt(client, "/atmosphere/agent/limited", "go")


def notes(*texts: str) -> list[ToolCall]:
    return [ToolCall("note", {"text": text}) for text in texts]


def limit_error(frames: list[dict[str, Any]]) -> dict[str, Any]:
    assert frames[-1]["event"] == "error", frames[-1]
    data: dict[str, Any] = frames[-1]["data"]
    assert data["type"] == "UsageLimitExceeded"
    return data


async def test_request_limit_allows_that_many_requests_and_stops_before_the_next(
    workspace: Path,
) -> None:
    runtime = ScriptedRuntime([notes("a"), notes("b"), "done"])
    frames = await run(workspace, [limited_agent(UsageLimits(request_limit=2))], runtime)

    assert limit_error(frames)["limit"] == "request_limit"
    assert len(runtime.requests) == 2
    assert CALLS == ["a", "b"]


async def test_tool_calls_limit_is_checked_before_the_call_that_would_pass_it(
    workspace: Path,
) -> None:
    runtime = ScriptedRuntime([notes("a", "b", "c"), "done"])
    frames = await run(workspace, [limited_agent(UsageLimits(tool_calls_limit=2))], runtime)

    assert limit_error(frames)["limit"] == "tool_calls_limit"
    assert CALLS == ["a", "b"]
    assert [f["data"]["arguments"]["text"] for f in of_type(frames, "tool-start")] == ["a", "b"]
    assert len(runtime.requests) == 1


@pytest.mark.parametrize("limit", ["input_tokens_limit", "total_tokens_limit"])
async def test_a_response_over_a_token_limit_runs_none_of_its_tool_calls(
    workspace: Path, limit: str
) -> None:
    runtime = ScriptedRuntime([notes("a"), "done"])
    limits = UsageLimits(**{limit: 1})
    frames = await run(workspace, [limited_agent(limits)], runtime)

    assert limit_error(frames)["limit"] == limit
    assert CALLS == []
    assert of_type(frames, "tool-start") == []
    assert len(runtime.requests) == 1


async def test_output_tokens_limit_counts_across_turns(workspace: Path) -> None:
    # the scripted model's usage: output tokens = len(text) // 4
    runtime = ScriptedRuntime([lambda _: [ToolCall("note", {"text": "x"})], "y" * 40, "z"])
    frames = await run(workspace, [limited_agent(UsageLimits(output_tokens_limit=9))], runtime)

    assert limit_error(frames)["limit"] == "output_tokens_limit"
    assert len(runtime.requests) == 2


async def test_app_wide_limits_come_from_the_environment(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_USAGE_LIMITS", json.dumps({"request_limit": 1}))
    assert HarnessSettings().groups.usage.limits == UsageLimits(request_limit=1)
    runtime = ScriptedRuntime([notes("a"), "done"])
    frames = await run(workspace, [limited_agent(None)], runtime)

    assert limit_error(frames)["limit"] == "request_limit"
    assert len(runtime.requests) == 1


async def test_an_agents_own_limits_win_over_the_app_wide_ones(workspace: Path) -> None:
    runtime = ScriptedRuntime([notes("a"), "done"])
    frames = await run(
        workspace,
        [limited_agent(UsageLimits(request_limit=5))],
        runtime,
        usage_limits=UsageLimits(request_limit=1),
    )
    assert frames[-1]["event"] == "complete"


def test_unknown_keys_in_the_environment_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_USAGE_LIMITS", '{"requests": 3}')
    with pytest.raises(ValueError, match="requests"):
        HarnessSettings()
    with pytest.raises(ValueError, match="request_limit"):
        UsageLimits(request_limit=-1)


async def test_a_fleet_members_requests_count_toward_its_coordinators_limit(
    workspace: Path,
) -> None:
    """request_limit=2: the coordinator's first request and its member's use both; the
    coordinator's second request is refused, and the member's reply never reaches a model."""
    member_model = ScriptedRuntime(["the member's answer"])
    registry = AgentRegistry()

    @registry.agent(name="member", harness=(), model=member_model)
    class Member:
        """Answers."""

        @prompt
        async def chat(self, message: str, session: StreamingSession) -> None:
            await session.stream(message)

    lead_model = ScriptedRuntime(
        [[ToolCall("delegate_task", {"agent": "member", "message": "hi"})], "done"]
    )
    lead = limited_agent(UsageLimits(request_limit=2), fleet=(Member,))
    frames = await run(workspace, [lead, Member], lead_model)

    assert limit_error(frames)["limit"] == "request_limit"
    assert len(lead_model.requests) == 1
    assert len(member_model.requests) == 1


async def test_a_task_sub_agent_spends_from_its_coordinators_budget(workspace: Path) -> None:
    def lead_turn(request: ModelRequest) -> Any:
        if request.system_prompt.startswith("You are limited"):
            if request.messages[-1].role == "user":
                return [ToolCall("task", {"description": "look around"})]
            return "done"
        return [ToolCall("ls", {})]  # the sub-agent keeps calling tools

    runtime = ScriptedRuntime(default=lead_turn)
    lead = limited_agent(UsageLimits(tool_calls_limit=3), coordinator=True)
    frames = await run(workspace, [lead], runtime)

    assert limit_error(frames)["limit"] == "tool_calls_limit"
    # the coordinator's `task` call and two of the sub-agent's: its third request's call is
    # refused, and the coordinator never asks the model again
    assert len(runtime.requests) == 1 + 3
