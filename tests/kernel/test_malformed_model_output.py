"""Model output that is valid JSON but awkward must never break a run or lose its turn.

Found by the reliability suite's hostile model:

- tool-call arguments that are not an object (a runtime keeps malformed JSON as text, for the
  executor to reject) made storing the turn raise, so the run ended in an `error` frame about
  "dictionary update sequence" and the turn was lost from the history;
- a lone surrogate (`"\\ud800"` is valid JSON; UTF-8 cannot carry it) in any argument made the
  SSE response fail while encoding its frame, and the AG-UI encoder refuse the event: the
  client's stream broke with no terminal frame.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atmosphere_harness import ScriptedRuntime, ToolCall, agent
from atmosphere_harness._events import Frame
from atmosphere_harness._memory import codec
from atmosphere_harness._runtimes.base import Message
from tests.agents import echo
from tests.http.test_agui_http import run_agui, run_input
from tests.support import client_for, make_app, of_type
from tests.support import prompt as post_prompt

Awkward = echo(agent(name="awkward"), "Awkward")


PATH = "/atmosphere/agent/awkward"


@pytest.mark.parametrize("arguments", ["{not json", [1, 2, 3], None, 7])
async def test_non_object_arguments_are_answered_and_the_turn_is_kept(
    workspace: Path, arguments: object
) -> None:
    bad = ToolCall("write_file", arguments)  # type: ignore[arg-type]
    runtime = ScriptedRuntime([[bad], "sorry", "second answer"])
    async with client_for(make_app([Awkward], runtime=runtime, workspace=workspace)) as client:
        first = await post_prompt(client, PATH, "go")
        second = await post_prompt(client, PATH, "again", first[0]["conversationId"])
    result = json.loads(of_type(first, "tool-result")[0]["data"]["result"])
    assert result["error"] == "invalid_arguments"
    assert first[-1]["event"] == "complete", first[-1]
    assert second[-1]["event"] == "complete", second[-1]
    history = runtime.requests[-1].messages
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant", "user"]
    assert history[1].tool_calls[0].arguments == arguments


@pytest.mark.parametrize("arguments", ["{not json", [1, 2], {"a": 1}])
def test_the_stored_form_keeps_arguments_as_sent(arguments: object) -> None:
    message = Message.assistant("", [ToolCall("t", arguments, "c1")])  # type: ignore[arg-type]
    assert codec.decode(codec.PLAIN, codec.encode(message)) == message


async def test_a_lone_surrogate_reaches_the_client_and_the_history(workspace: Path) -> None:
    odd = "lone \ud800 surrogate"
    runtime = ScriptedRuntime(
        [[ToolCall("write_file", {"path": "odd.txt", "content": odd})], "done", "next"]
    )
    async with client_for(make_app([Awkward], runtime=runtime, workspace=workspace)) as client:
        frames = await post_prompt(client, PATH, "go")
        again = await post_prompt(client, PATH, "again", frames[0]["conversationId"])
    assert frames[-1]["event"] == "complete"
    assert of_type(frames, "tool-start")[0]["data"]["arguments"]["content"] == odd
    assert "not valid Unicode" in of_type(frames, "tool-result")[0]["data"]["result"]
    assert again[-1]["event"] == "complete"
    assert runtime.requests[-1].messages[1].tool_calls[0].arguments["content"] == odd


def test_frames_stay_unescaped_unless_they_must_not() -> None:
    plain = Frame("text", {"text": "héllo ✓"}, "s", "c", 1).to_json()
    assert "héllo ✓" in plain
    odd = Frame("text", {"text": "a\udc00b"}, "s", "c", 2).to_json()
    odd.encode("utf-8")
    assert json.loads(odd)["data"]["text"] == "a\udc00b"


async def test_a_lone_surrogate_reaches_an_ag_ui_client(workspace: Path) -> None:
    odd = "lone \ud800 surrogate"
    runtime = ScriptedRuntime([[ToolCall("write_file", {"path": "x.txt", "content": odd})], odd])
    async with client_for(make_app([Awkward], runtime=runtime, workspace=workspace)) as client:
        events = await run_agui(client, PATH, run_input("t-1", "go"))
    assert events[-1]["type"] == "RUN_FINISHED", events[-1]
    args = [event["delta"] for event in events if event["type"] == "TOOL_CALL_ARGS"]
    assert json.loads("".join(args))["content"] == odd
    text = [event["delta"] for event in events if event["type"] == "TEXT_MESSAGE_CONTENT"]
    assert "".join(text) == odd


async def test_line_separators_in_text_never_split_a_frame(workspace: Path) -> None:
    """U+2028, U+2029 and U+0085 are not SSE line breaks, but `str.splitlines` (and so
    `httpx`'s `aiter_lines`, which SSE clients commonly read with) breaks lines there."""
    odd = "one\u2028two\u2029three\x85four"
    plan = {"todos": [{"content": odd, "status": "pending"}]}
    runtime = ScriptedRuntime([[ToolCall("write_todos", plan)], odd])
    async with client_for(make_app([Awkward], runtime=runtime, workspace=workspace)) as client:
        body = {"message": "go"}
        async with client.stream("POST", PATH, json=body) as response:
            data = [line async for line in response.aiter_lines() if line.startswith("data:")]
        frames = [json.loads(line[5:]) for line in data]
        cid = frames[0]["conversationId"]
        params = {"conversationId": cid}
        async with client.stream("GET", f"{PATH}/plan/events", params=params) as response:
            async for line in response.aiter_lines():  # the stream never ends: its snapshot
                if line.startswith("data:"):
                    snapshot = json.loads(line[5:])
                    break
        events = await run_agui(client, PATH, run_input("t-2", "go"))
    assert frames[-1]["event"] == "complete"
    assert "".join(f["data"]["text"] for f in of_type(frames, "text")) == odd
    assert of_type(frames, "plan-update")[0]["data"]["steps"][0]["content"] == odd
    assert snapshot["steps"][0]["content"] == odd
    assert events[-1]["type"] == "RUN_FINISHED"
