"""Runs over real HTTP, traced into the SDK's in-memory exporter: spans, nesting, attributes,
the incoming `traceparent`, error status, content capture, metrics, the switch and the truth."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from websockets.asyncio.client import connect

from atmosphere_harness import (
    HarnessSettings,
    ModelRequest,
    ScriptedRuntime,
    StreamingSession,
    ToolApprovalPolicy,
    ToolCall,
    agent,
    coordinator,
    create_harness_router,
    prompt,
    tool,
)
from tests.agents import echo
from tests.delegation_support import open_prompt
from tests.http.test_agui_http import run_input
from tests.http.test_websocket import run_over, ws_url
from tests.support import make_app, of_type, parse_sse, serve
from tests.tracing.conftest import Telemetry

Scout = echo(agent(name="scout"), "Scout")
SCOUT = "/atmosphere/agent/scout"

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def writes_then_answers() -> ScriptedRuntime:
    return ScriptedRuntime(
        [[ToolCall("write_file", {"path": "notes.md", "content": "tides"}, "call-1")], "saved"]
    )


async def post(
    base: str, path: str, message: str, headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(base_url=base, timeout=30) as client:
        response = await client.post(
            path, json={"message": message, "conversationId": "conv-1"}, headers=headers
        )
    assert response.status_code == 200, response.text
    return parse_sse(response.text)


def only(spans: list[ReadableSpan]) -> ReadableSpan:
    assert len(spans) == 1, [span.name for span in spans]
    return spans[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def root_of(telemetry: Telemetry, span: ReadableSpan) -> ReadableSpan:
    """The first span of `span`'s trace that this process recorded (its parent, if any, came
    with the request)."""
    recorded = {each.context.span_id: each for each in telemetry.spans()}
    while span.parent is not None and span.parent.span_id in recorded:
        span = recorded[span.parent.span_id]
    return span


def served(telemetry: Telemetry) -> ReadableSpan:
    """The application's HTTP server span (FastAPI's telemetry), child of the `traceparent`."""
    server = only([span for span in telemetry.spans() if span.kind is SpanKind.SERVER])
    assert server.parent is not None
    assert f"{server.parent.span_id:016x}" == PARENT_ID
    return server


async def test_without_a_server_span_the_traceparent_is_the_run_parent(
    workspace: Path, telemetry: Telemetry
) -> None:
    app = FastAPI(telemetry={"tracing": False})
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace),
            agents=[Scout],
            runtime=ScriptedRuntime(["hi"]),
        )
    )
    async with serve(app) as base:
        frames = await post(base, SCOUT, "hello", {"traceparent": TRACEPARENT})
    assert frames[-1]["event"] == "complete"
    run = only(telemetry.named("invoke_agent"))
    assert f"{run.context.trace_id:032x}" == TRACE_ID
    assert run.parent is not None
    assert run.parent.is_remote
    assert f"{run.parent.span_id:016x}" == PARENT_ID
    assert [span.name for span in telemetry.spans() if span.kind is SpanKind.SERVER] == []


async def test_a_prompt_is_one_agent_span_over_its_chat_and_tool_spans(
    workspace: Path, telemetry: Telemetry
) -> None:
    app = make_app([Scout], runtime=writes_then_answers(), workspace=workspace)
    async with serve(app) as base:
        frames = await post(base, SCOUT, "note the tides", {"traceparent": TRACEPARENT})
    assert frames[-1]["event"] == "complete"

    run = only(telemetry.named("invoke_agent"))
    assert run.name == "invoke_agent scout"
    # FastAPI's own server span took the incoming W3C trace context; the run is its child.
    assert f"{run.context.trace_id:032x}" == TRACE_ID
    assert parent_of(run) == served(telemetry).context.span_id
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.agent.name"] == "scout"
    assert run.attributes["gen_ai.conversation.id"] == "conv-1"

    chats = telemetry.named("chat ")
    assert [span.name for span in chats] == ["chat scripted", "chat scripted"]
    for chat in chats:
        assert parent_of(chat) == run.context.span_id
        assert chat.context.trace_id == run.context.trace_id
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.agent.name"] == "scout"
        assert chat.attributes["gen_ai.conversation.id"] == "conv-1"

    tool = only(telemetry.named("execute_tool"))
    assert tool.name == "execute_tool write_file"
    assert parent_of(tool) == run.context.span_id
    assert tool.attributes["gen_ai.tool.name"] == "write_file"
    assert tool.attributes["gen_ai.tool.call.id"] == "call-1"
    assert tool.status.status_code is StatusCode.UNSET

    # The chat spans' tokens add up to the run's `complete` usage.
    usage = frames[-1]["data"]["usage"]
    assert usage["inputTokens"] > 0
    assert (
        sum(int(c.attributes["gen_ai.usage.input_tokens"]) for c in chats) == usage["inputTokens"]
    )
    assert (
        sum(int(c.attributes["gen_ai.usage.output_tokens"]) for c in chats) == usage["outputTokens"]
    )
    assert run.attributes["gen_ai.usage.input_tokens"] == usage["inputTokens"]

    # Contents are not recorded unless asked for.
    for span in telemetry.spans():
        assert not any(
            key in span.attributes
            for key in (
                "gen_ai.input.messages",
                "gen_ai.output.messages",
                "gen_ai.tool.call.arguments",
                "gen_ai.tool.call.result",
            )
        ), span.name
    assert "tides" not in json.dumps([dict(span.attributes) for span in telemetry.spans()])


async def test_without_a_traceparent_a_run_starts_its_own_trace(
    workspace: Path, telemetry: Telemetry
) -> None:
    app = make_app([Scout], runtime=ScriptedRuntime(["hi"]), workspace=workspace)
    async with serve(app) as base:
        await post(base, SCOUT, "hello")
    run = only(telemetry.named("invoke_agent"))
    assert f"{run.context.trace_id:032x}" != TRACE_ID
    assert root_of(telemetry, run).kind is SpanKind.SERVER  # a new trace, from the request


async def test_a_denied_tool_call_sets_the_error_status(
    workspace: Path, telemetry: Telemetry
) -> None:
    Guarded = echo(agent(name="guarded"), "Guarded", approval_policy=ToolApprovalPolicy.deny_all())
    app = make_app([Guarded], runtime=writes_then_answers(), workspace=workspace)
    async with serve(app) as base:
        frames = await post(base, "/atmosphere/agent/guarded", "note the tides")
    assert "denied" in of_type(frames, "tool-result")[0]["data"]["result"]
    tool = only(telemetry.named("execute_tool"))
    assert tool.status.status_code is StatusCode.ERROR
    assert tool.attributes["atmosphere.tool.outcome"] == "denied"
    assert tool.attributes["error.type"] == "denied"
    run = only(telemetry.named("invoke_agent"))
    assert run.status.status_code is StatusCode.UNSET  # the run itself went on and answered


async def test_an_unknown_tool_and_a_failing_model_set_the_error_status(
    workspace: Path, telemetry: Telemetry
) -> None:
    runtime = ScriptedRuntime([[ToolCall("no_such_tool", {}, "call-x")]])  # then exhausted
    app = make_app([Scout], runtime=runtime, workspace=workspace)
    async with serve(app) as base:
        frames = await post(base, SCOUT, "go")
    assert frames[-1]["event"] == "error"
    tool = only(telemetry.named("execute_tool"))
    assert tool.status.status_code is StatusCode.ERROR
    assert tool.attributes["atmosphere.tool.outcome"] == "unknown"
    failed = telemetry.named("chat ")[-1]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "ScriptExhausted"
    run = only(telemetry.named("invoke_agent"))
    assert run.status.status_code is StatusCode.ERROR
    assert run.attributes["atmosphere.run.status"] == "error"


def delegating(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if request.system_prompt == "You write drafts.":
        return "a draft"
    if last.role == "user" and last.content == "sub job":
        return "sub report"
    if last.role == "user":
        return [
            ToolCall("task", {"description": "sub job"}, "call-task"),
            ToolCall("delegate_task", {"agent": "drafter", "message": "a haiku"}, "call-fleet"),
        ]
    return "done"


@agent(name="drafter", system_prompt="You write drafts.")
class Drafter:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


Chief = echo(coordinator("chief", fleet=[Drafter]), "Chief")


async def test_sub_agent_and_fleet_runs_nest_under_their_tool_spans(
    workspace: Path, telemetry: Telemetry
) -> None:
    runtime = ScriptedRuntime((), default=delegating)
    app = make_app([Chief, Drafter], runtime=runtime, workspace=workspace)
    async with serve(app) as base:
        frames = await post(base, "/atmosphere/agent/chief", "go", {"traceparent": TRACEPARENT})
    assert frames[-1]["event"] == "complete", frames[-1]
    spans = {span.context.span_id: span for span in telemetry.spans()}
    task = only([s for s in telemetry.named("execute_tool") if s.name == "execute_tool task"])
    fleet = only(
        [s for s in telemetry.named("execute_tool") if s.name == "execute_tool delegate_task"]
    )
    runs = {span.name: span for span in telemetry.named("invoke_agent")}
    assert len(runs) == 3
    assert {"invoke_agent chief", "invoke_agent drafter"} < set(runs)
    sub = next(span for name, span in runs.items() if name.startswith("invoke_agent subagent-"))
    assert parent_of(sub) == task.context.span_id
    assert parent_of(runs["invoke_agent drafter"]) == fleet.context.span_id
    assert parent_of(task) == parent_of(fleet) == runs["invoke_agent chief"].context.span_id
    # Every span is in the one trace the request started, each sub-run's chat under its run.
    assert {span.context.trace_id for span in spans.values()} == {int(TRACE_ID, 16)}
    sub_chats = [s for s in telemetry.named("chat ") if parent_of(s) == sub.context.span_id]
    drafter_chats = [
        s
        for s in telemetry.named("chat ")
        if parent_of(s) == runs["invoke_agent drafter"].context.span_id
    ]
    assert len(sub_chats) == 1
    assert len(drafter_chats) == 1
    # Every model call (the sub-runs' too) is in the coordinator's `complete` usage.
    usage = frames[-1]["data"]["usage"]
    chats = telemetry.named("chat ")
    assert (
        sum(int(c.attributes["gen_ai.usage.input_tokens"]) for c in chats) == usage["inputTokens"]
    )


async def test_contents_are_recorded_when_asked_for(
    workspace: Path, telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    app = make_app([Scout], runtime=writes_then_answers(), workspace=workspace)
    async with serve(app) as base:
        await post(base, SCOUT, "note the tides")
    first = telemetry.named("chat ")[0]
    sent = json.loads(str(first.attributes["gen_ai.input.messages"]))
    assert sent[-1] == {"role": "user", "parts": [{"type": "text", "content": "note the tides"}]}
    answered = json.loads(str(first.attributes["gen_ai.output.messages"]))
    assert answered[0]["parts"][0]["name"] == "write_file"
    tool = only(telemetry.named("execute_tool"))
    assert json.loads(str(tool.attributes["gen_ai.tool.call.arguments"]))["content"] == "tides"
    assert "gen_ai.tool.call.result" in tool.attributes


async def test_websocket_and_ag_ui_runs_take_the_traceparent_too(
    workspace: Path, telemetry: Telemetry
) -> None:
    app = make_app([Scout], runtime=ScriptedRuntime((), default="hi"), workspace=workspace)
    async with serve(app) as base:
        url = ws_url(base, SCOUT, conversationId="ws-1")
        async with connect(url, additional_headers={"traceparent": TRACEPARENT}) as socket:
            frames = await run_over(socket, {"message": "hello"})
        assert frames[-1]["event"] == "complete"
        async with httpx2.AsyncClient(base_url=base, timeout=30) as client:
            response = await client.post(
                f"{SCOUT}/ag-ui",
                json=run_input("thread-1", "hello"),
                headers={"traceparent": TRACEPARENT},
            )
        assert response.status_code == 200
    runs = telemetry.named("invoke_agent")
    assert len(runs) == 2
    assert {run.attributes["gen_ai.conversation.id"] for run in runs} == {"ws-1", "thread-1"}
    for run in runs:
        assert f"{run.context.trace_id:032x}" == TRACE_ID
        first = root_of(telemetry, run)
        assert first.parent is not None
        assert first.parent.is_remote
        assert f"{first.parent.span_id:016x}" == PARENT_ID


def ours(telemetry: Telemetry) -> list[str]:
    """The GenAI spans (the application's own HTTP spans left out)."""
    return [span.name for span in telemetry.spans() if "gen_ai.operation.name" in span.attributes]


def points(telemetry: Telemetry, name: str) -> list[Any]:
    data = telemetry.reader.get_metrics_data()
    assert data is not None
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


async def test_metrics_count_tokens_durations_runs_and_tool_outcomes(
    workspace: Path, telemetry: Telemetry
) -> None:
    Counted = echo(agent(name="counted"), "Counted")
    app = make_app([Counted], runtime=writes_then_answers(), workspace=workspace)
    async with serve(app) as base:
        frames = await post(base, "/atmosphere/agent/counted", "note the tides")
    usage = frames[-1]["data"]["usage"]
    tokens = points(telemetry, "gen_ai.client.token.usage")
    by_type = {
        kind: sum(p.sum for p in tokens if p.attributes["gen_ai.token.type"] == kind)
        for kind in ("input", "output")
    }
    assert by_type["input"] >= usage["inputTokens"] > 0
    durations = points(telemetry, "gen_ai.client.operation.duration")
    assert any(p.attributes["gen_ai.operation.name"] == "chat" and p.count for p in durations)
    runs = [
        p
        for p in points(telemetry, "atmosphere.runs")
        if p.attributes["gen_ai.agent.name"] == "counted"
    ]
    assert [(p.attributes["atmosphere.run.status"], p.value) for p in runs] == [("completed", 1)]
    calls = [
        p
        for p in points(telemetry, "atmosphere.tool.calls")
        if p.attributes["gen_ai.tool.name"] == "write_file"
    ]
    assert any(p.attributes["atmosphere.tool.outcome"] == "ok" and p.value >= 1 for p in calls)
    assert points(telemetry, "atmosphere.approvals.waiting")


async def test_tracing_false_traces_nothing_and_the_truth_says_why(
    workspace: Path, telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app([Scout], runtime=ScriptedRuntime((), default="hi"), workspace=workspace)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base) as client:
        info = (await client.get("/api/console/info")).json()
    assert info["harness"]["tracing"] == "ACTIVE(otel)"

    monkeypatch.setenv("ATMOSPHERE_AI_TRACING", "false")
    app = make_app([Scout], runtime=ScriptedRuntime((), default="hi"), workspace=workspace)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base) as client:
        frames = await post(base, SCOUT, "hello", {"traceparent": TRACEPARENT})
        info = (await client.get("/api/console/info")).json()
    assert frames[-1]["event"] == "complete"
    assert ours(telemetry) == []
    assert info["harness"]["tracing"] == "INACTIVE(disabled)"

    monkeypatch.delenv("ATMOSPHERE_AI_TRACING")
    monkeypatch.setattr("atmosphere_harness._tracing.installed", lambda: False)
    app = make_app([Scout], runtime=ScriptedRuntime((), default="hi"), workspace=workspace)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base) as client:
        await post(base, SCOUT, "hello")
        info = (await client.get("/api/console/info")).json()
    assert ours(telemetry) == []
    assert info["harness"]["tracing"] == "INACTIVE(no-opentelemetry)"


@tool(requires_approval=True)
async def launch(target: str) -> str:
    """Launch something a person must approve.

    Args:
        target: What to launch.
    """
    return f"launched {target}"


async def test_the_approvals_gauge_counts_a_call_waiting_for_a_person(
    workspace: Path, telemetry: Telemetry
) -> None:
    Launcher = echo(agent(name="launcher"), "Launcher", tools=[launch])
    runtime = ScriptedRuntime([[ToolCall("launch", {"target": "probe"}, "call-l")], "ok"])
    app = make_app([Launcher], runtime=runtime, workspace=workspace)
    path = "/atmosphere/agent/launcher"
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        async with open_prompt(client, path, "launch it") as reader:
            asked = await reader.until("approval-required")
            waiting = points(telemetry, "atmosphere.approvals.waiting")
            assert [point.value for point in waiting] == [1]
            answered = await client.post(
                f"{path}/approvals/{asked['data']['approvalId']}", json={"approve": False}
            )
            assert answered.status_code == 200, answered.text
            await reader.rest()
        waiting = points(telemetry, "atmosphere.approvals.waiting")
        assert [point.value for point in waiting] == [0]
    tool_span = only(telemetry.named("execute_tool"))
    assert tool_span.attributes["atmosphere.tool.outcome"] == "denied"
