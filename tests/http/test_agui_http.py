"""`POST P/ag-ui` over a real uvicorn server: every event parses as an `ag-ui-protocol` model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
from ag_ui.core import Event
from pydantic import TypeAdapter

from atmosphere_harness import ScriptedRuntime, StreamingSession, ToolCall, ai_endpoint, prompt
from tests.http.test_memory_http import KEEPER, Keeper
from tests.support import client_for, make_app

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)


def run_input(thread: str, *messages: str, state: Any = None, run: str = "run-1") -> dict:
    body: dict[str, Any] = {
        "threadId": thread,
        "runId": run,
        "messages": [
            {"id": f"m{index}", "role": "user", "content": text}
            for index, text in enumerate(messages)
        ],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    if state is not None:
        body["state"] = state
    return body


async def run_agui(client: httpx2.AsyncClient, path: str, body: dict) -> list[dict[str, Any]]:
    response = await client.post(f"{path}/ag-ui", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for line in response.text.replace("\r\n", "\n").split("\n"):
        if line.startswith("data: "):
            event = json.loads(line[len("data: ") :])
            EVENTS.validate_python(event)  # the protocol's own models accept it
            events.append(event)
    return events


def types(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


def demo_like() -> ScriptedRuntime:
    """Text, a plan, a file, a second plan, then the answer (the demo's shape)."""
    pending = {"todos": [{"content": "Write it", "status": "in_progress"}], "goal": "Ship"}
    done = {"todos": [{"content": "Write it", "status": "completed"}], "goal": "Ship"}
    return ScriptedRuntime(
        [
            [ToolCall("write_todos", pending, id="call-plan-1")],
            [ToolCall("write_file", {"path": "a.md", "content": "hello"}, id="call-file")],
            [ToolCall("write_todos", done, id="call-plan-2")],
            "All done.",
        ]
    )


async def test_a_tool_run_speaks_the_protocol(workspace: Path) -> None:
    app = make_app([Keeper], runtime=demo_like(), workspace=workspace)
    async with client_for(app) as client:
        events = await run_agui(client, KEEPER, run_input("thread-1", "go"))
    tool_call = ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"]
    assert types(events) == [
        "RUN_STARTED",
        *tool_call,
        "STATE_SNAPSHOT",
        "TOOL_CALL_RESULT",
        *tool_call,
        "TOOL_CALL_RESULT",
        *tool_call,
        "STATE_DELTA",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    started, finished = events[0], events[-1]
    assert started == {"type": "RUN_STARTED", "threadId": "thread-1", "runId": "run-1"}
    assert finished["threadId"] == "thread-1"
    assert finished["runId"] == "run-1"
    assert finished["result"] == "All done."
    assert finished["usage"][0]["inputTokens"] > 0
    assert events[1] == {
        "type": "TOOL_CALL_START",
        "toolCallId": "call-plan-1",
        "toolCallName": "write_todos",
    }
    assert json.loads(events[2]["delta"])["goal"] == "Ship"
    snapshot = events[4]["snapshot"]
    assert snapshot["plan"]["steps"] == [{"content": "Write it", "status": "in_progress"}]
    assert snapshot["plan"]["conversationId"] == "thread-1"
    assert events[5]["toolCallId"] == "call-plan-1"
    assert events[5]["content"].startswith("Goal: Ship")
    assert events[9]["content"] == "Wrote a.md"
    delta = events[13]["delta"]
    assert delta[0]["op"] == "add"
    assert delta[0]["path"] == "/plan"
    assert delta[0]["value"]["steps"][0]["status"] == "completed"
    message_ids = {e["messageId"] for e in events if e["type"].startswith("TEXT_MESSAGE")}
    assert len(message_ids) == 1
    assert "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT") == (
        "All done."
    )


async def test_the_thread_is_the_conversation(workspace: Path) -> None:
    runtime = ScriptedRuntime(default=lambda request: f"{len(request.messages)} messages")
    app = make_app([Keeper], runtime=runtime, workspace=workspace)
    async with client_for(app) as client:
        first = await run_agui(client, KEEPER, run_input("t-a", "one"))
        # A client resends its whole history; only the last user message is the prompt.
        second = await run_agui(client, KEEPER, run_input("t-a", "one", "two", run="run-2"))
        other = await run_agui(client, KEEPER, run_input("t-b", "solo"))
        response = await client.post(f"{KEEPER}/ag-ui", json=run_input("t-c", "x"))
    assert first[-1]["result"] == "1 messages"
    assert second[-1]["result"] == "3 messages", "the server kept the thread's history"
    assert other[-1]["result"] == "1 messages"
    assert response.headers["x-conversation-id"] == "t-c"
    assert runtime.requests[1].messages[-1].content == "two"


async def test_the_client_state_is_kept_and_the_plan_added(workspace: Path) -> None:
    app = make_app([Keeper], runtime=demo_like(), workspace=workspace)
    async with client_for(app) as client:
        events = await run_agui(client, KEEPER, run_input("t", "go", state={"theme": "dark"}))
    snapshot = next(e for e in events if e["type"] == "STATE_SNAPSHOT")["snapshot"]
    assert snapshot["theme"] == "dark"
    assert "plan" in snapshot


async def test_a_failed_run_ends_with_run_error(workspace: Path) -> None:
    app = make_app([Keeper], runtime=ScriptedRuntime([]), workspace=workspace)
    async with client_for(app) as client:
        events = await run_agui(client, KEEPER, run_input("t", "go"))
    assert types(events) == ["RUN_STARTED", "RUN_ERROR"]
    assert events[-1]["code"] == "ScriptExhausted"
    assert "no turn 1" in events[-1]["message"]


async def test_bad_run_inputs_are_422(workspace: Path) -> None:
    app = make_app([Keeper], runtime=ScriptedRuntime(default=lambda r: "ok"), workspace=workspace)
    async with client_for(app) as client:
        bad_thread = await client.post(f"{KEEPER}/ag-ui", json=run_input("../etc", "hi"))
        no_user = await client.post(f"{KEEPER}/ag-ui", json=run_input("t"))
        not_input = await client.post(f"{KEEPER}/ag-ui", json={"messages": "nope"})
        assistant_only = run_input("t")
        assistant_only["messages"] = [{"id": "a", "role": "assistant", "content": "hi"}]
        only_assistant = await client.post(f"{KEEPER}/ag-ui", json=assistant_only)
    for response in (bad_thread, no_user, not_input, only_assistant):
        assert response.status_code == 422, response.text
    assert "threadId" in bad_thread.json()["error"]


@ai_endpoint("/atmosphere/speaker")
class Speaker:
    """Emits the delegation and governance frames the console and AG-UI render."""

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.send("Delegating. ")
        await session.emit(
            "subagent-start",
            {"subagentId": "sub-1", "agentId": "researcher", "description": "look it up"},
        )
        await session.emit(
            "plan-update",
            {
                "steps": [{"content": "Search", "status": "in_progress"}],
                "goal": None,
                "conversationId": session.conversation_id,
                "agentId": "researcher",
                "subagentId": "sub-1",
            },
        )
        await session.emit(
            "subagent-end", {"subagentId": "sub-1", "status": "completed", "report": "found it"}
        )
        await session.emit(
            "subagent-start", {"subagentId": "sub-2", "agentId": "critic", "description": "x"}
        )
        await session.emit("subagent-end", {"subagentId": "sub-2", "status": "error", "error": "x"})
        await session.emit(
            "approval-required",
            {
                "approvalId": "ap-1",
                "toolCallId": "call-9",
                "tool": "send_email",
                "arguments": {"to": "a@b.c"},
                "expiresAt": "2030-01-01T00:00:00Z",
            },
        )
        await session.emit(
            "subagent-start", {"subagentId": "sub-3", "agentId": "late", "description": "y"}
        )
        await session.complete("summary")


async def test_subagents_sub_plans_and_approvals(workspace: Path) -> None:
    app = make_app([Speaker], runtime=ScriptedRuntime(), workspace=workspace)
    async with client_for(app) as client:
        events = await run_agui(client, "/atmosphere/speaker", run_input("t", "go"))
    assert types(events) == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "SUBAGENT_STARTED",
        "STATE_SNAPSHOT",
        "SUBAGENT_FINISHED",
        "SUBAGENT_STARTED",
        "SUBAGENT_ERROR",
        "CUSTOM",
        "SUBAGENT_STARTED",
        "TEXT_MESSAGE_END",
        "SUBAGENT_ERROR",
        "RUN_FINISHED",
    ]
    assert events[3]["subagentRunId"] == "sub-1"
    assert events[3]["name"] == "researcher"
    assert events[3]["description"] == "look it up"
    plans = events[4]["snapshot"]["subagentPlans"]
    assert plans["sub-1"]["steps"] == [{"content": "Search", "status": "in_progress"}]
    assert "plan" not in events[4]["snapshot"]
    assert events[5]["result"] == "found it"
    assert events[7]["message"] == "x"
    assert events[8]["name"] == "approval-required"
    assert events[8]["value"]["approvalId"] == "ap-1"
    assert events[11]["subagentRunId"] == "sub-3", "a sub-agent still running is closed"
    assert events[-1]["result"] == "summary"
