"""The bounds on one model message (`tools.bounds`): how many calls, how large their arguments.

Found by the reliability suite's hostile model: 10,000 calls in one message all ran (20,000
frames, 10,000 stored results replayed to the model on every later turn), and a 50 MB argument
was kept in the history in full and streamed back in its `tool-start` frame.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, ClassVar

import pytest

from atmosphere_harness import (
    ScriptedRuntime,
    ToolCall,
    agent,
)
from atmosphere_harness._durable import SqliteRunStore
from atmosphere_harness._tools.bounds import (
    DEFAULT_MAX_ARGUMENT_CHARS,
    DEFAULT_MAX_TOOL_CALLS,
    MAX_ARGUMENT_DEPTH,
    argument_size,
    screen_calls,
)
from tests.agents import echo
from tests.support import client_for, make_app, of_type, parse_sse
from tests.support import prompt as post_prompt

Bounded = echo(agent(name="bounded"), "Bounded")


PATH = "/atmosphere/agent/bounded"


def writes(count: int) -> list[ToolCall]:
    return [ToolCall("write_file", {"path": f"f{i}.txt", "content": "x"}) for i in range(count)]


def stored_payloads(workspace: Path) -> list[bytes]:
    with sqlite3.connect(workspace / "atmosphere.db") as db:
        return [row[0] for row in db.execute("SELECT payload FROM memory_messages")]


def test_a_message_at_the_bound_passes_untouched() -> None:
    calls = writes(DEFAULT_MAX_TOOL_CALLS)
    screened = screen_calls(calls, max_calls=DEFAULT_MAX_TOOL_CALLS, max_argument_chars=1024)
    assert screened.calls == tuple(calls)
    assert screened.answers == {}


def test_one_call_over_the_bound_runs_none_and_keeps_only_the_first() -> None:
    calls = writes(DEFAULT_MAX_TOOL_CALLS + 1)
    screened = screen_calls(calls, max_calls=DEFAULT_MAX_TOOL_CALLS, max_argument_chars=1024)
    assert screened.calls == (calls[0],)
    answer = json.loads(screened.answers[calls[0].id])
    assert answer["error"] == "too_many_tool_calls"
    assert f"asked for {DEFAULT_MAX_TOOL_CALLS + 1} tool calls" in answer["message"]
    assert "none of them ran" in answer["message"]


def test_oversized_and_over_nested_arguments_are_dropped_and_answered() -> None:
    big = ToolCall("write_file", {"path": "a", "content": "x" * 2000})
    fits = ToolCall("write_file", {"path": "b", "content": "x" * 900})
    nested: object = "leaf"
    for _ in range(MAX_ARGUMENT_DEPTH + 1):
        nested = [nested]
    deep = ToolCall("write_file", {"path": "c", "content": nested})
    screened = screen_calls([big, fits, deep], max_calls=8, max_argument_chars=1024)
    assert [call.id for call in screened.calls] == [big.id, fits.id, deep.id]
    assert screened.calls[1] is fits
    assert set(screened.answers) == {big.id, deep.id}
    assert "more than 1024 characters" in screened.answers[big.id]
    assert "nested more than" in screened.answers[deep.id]
    assert list(screened.calls[0].arguments) == ["omitted"]
    assert len(json.dumps(screened.calls[2].arguments)) < 200


def test_names_and_ids_cannot_carry_a_payload() -> None:
    call = ToolCall("n" * 100_000, {}, "i" * 100_000)
    (screened,) = screen_calls([call], max_calls=8, max_argument_chars=1024).calls
    assert len(screened.name) <= 129
    assert len(screened.id) <= 128


def test_the_size_walk_counts_every_kind_of_value() -> None:
    assert argument_size({"a": "xyz"}, 1000)[0] >= 4
    assert argument_size({"items": list(range(10_000_000))}, 1000)[0] > 1000
    assert argument_size({"many": ["x" * 600, "y" * 600]}, 1000)[0] > 1000
    assert argument_size({"k" * 2000: 1}, 1000)[0] > 1000
    assert argument_size([[[["deep"]]]], 1000)[1] == 4


async def test_a_flood_of_calls_never_reaches_the_tools_the_stream_or_the_history(
    workspace: Path,
) -> None:
    runtime = ScriptedRuntime([writes(10_000), "ok"])
    async with client_for(make_app([Bounded], runtime=runtime, workspace=workspace)) as client:
        frames = await post_prompt(client, PATH, "flood")
    assert [f["event"] for f in frames if f["event"] != "text"] == [
        "tool-start",
        "tool-result",
        "complete",
    ]
    assert json.loads(of_type(frames, "tool-result")[0]["data"]["result"])["error"] == (
        "too_many_tool_calls"
    )
    assert not list(workspace.rglob("f*.txt")), "no call ran"
    second = runtime.requests[1].messages
    assert [m.role for m in second] == ["user", "assistant", "tool"]
    assert len(second[1].tool_calls) == 1
    assert len(stored_payloads(workspace)) == 4  # user, the trimmed request, its result, answer


async def test_a_huge_argument_is_neither_run_nor_streamed_nor_stored(workspace: Path) -> None:
    huge = "z" * (DEFAULT_MAX_ARGUMENT_CHARS + 1)
    runtime = ScriptedRuntime([[ToolCall("write_file", {"path": "a.txt", "content": huge})], "ok"])
    async with client_for(make_app([Bounded], runtime=runtime, workspace=workspace)) as client:
        response = await client.post(PATH, json={"message": "huge"})
    assert len(response.content) < 10_000, "the arguments were not streamed back"
    frames = parse_sse(response.text)
    result = json.loads(of_type(frames, "tool-result")[0]["data"]["result"])
    assert result["error"] == "invalid_arguments"
    assert "arguments are too large" in result["details"][0]
    assert frames[-1]["event"] == "complete"
    assert not list(workspace.rglob("a.txt"))
    assert max(len(payload) for payload in stored_payloads(workspace)) < 10_000


async def test_the_call_bound_is_a_setting(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_MAX_TOOL_CALLS_PER_MESSAGE", "3")
    runtime = ScriptedRuntime([writes(3), writes(4), "ok"])
    app = make_app([Bounded], runtime=runtime, workspace=workspace)
    async with client_for(app) as client:
        frames = await post_prompt(client, PATH, "batches")
    results = [f["data"]["result"] for f in of_type(frames, "tool-result")]
    assert results[:3] == ["Wrote f0.txt", "Wrote f1.txt", "Wrote f2.txt"]
    assert len(results) == 4
    assert "asked for 4 tool calls; at most 3 run" in results[3]


class RecordingRunStore(SqliteRunStore):
    """The embedded run store, noting every checkpoint a durable run journals."""

    checkpoints: ClassVar[list[tuple[str, Any]]] = []

    async def append(self, run_id: str, frames: Any, checkpoints: Any, **kwargs: Any) -> None:
        self.checkpoints.extend(checkpoints)
        await super().append(run_id, frames, checkpoints, **kwargs)

    def append_now(self, run_id: str, frames: Any, checkpoints: Any, **kwargs: Any) -> bool:
        written = super().append_now(run_id, frames, checkpoints, **kwargs)
        if written:
            self.checkpoints.extend(checkpoints)
        return written


async def test_a_durable_run_journals_a_refused_call_without_its_arguments(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model turn is journalled as screened: the huge argument is never encoded or stored
    (one copy per backend layer, 50 MB each, before), and a resumed run that replays the turn
    refuses the call with the same answer, without running it."""
    import atmosphere_harness._backends as backends
    from atmosphere_harness._durable.replay import load_response

    monkeypatch.setattr(backends, "SqliteRunStore", RecordingRunStore)
    monkeypatch.setattr(RecordingRunStore, "checkpoints", [])
    huge = "z" * (DEFAULT_MAX_ARGUMENT_CHARS + 1)
    runtime = ScriptedRuntime([[ToolCall("write_file", {"path": "a.txt", "content": huge})], "ok"])
    app = make_app([Bounded], runtime=runtime, workspace=workspace, durable_runs=True)
    async with client_for(app) as client:
        frames = await post_prompt(client, PATH, "huge")
    answer = of_type(frames, "tool-result")[0]["data"]["result"]
    assert "arguments are too large" in answer
    journalled = RecordingRunStore.checkpoints
    assert max(len(payload) for _key, payload in journalled) < 10_000
    turn = json.loads(next(payload for key, payload in journalled if key == "model:1"))
    replayed = load_response(turn)
    assert list(replayed.tool_calls[0].arguments) == ["omitted"]
    assert dict(replayed.refusals) == {replayed.tool_calls[0].id: answer}
    assert not list(workspace.rglob("a.txt"))
