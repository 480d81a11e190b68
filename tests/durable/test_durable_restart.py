"""Durable runs across real restarts: a uvicorn server in a subprocess, SIGKILLed mid-run.

Each scenario runs a prompt to its end once (the baseline), then runs it again in another
conversation and kills the server (SIGKILL: no shutdown code runs) at the chosen moment:
waiting for an approval, inside a sleeping user tool, with a model turn in flight after a tool
result, in the middle of a streamed answer. A new server on the same workspace resumes the run;
the client re-attaches with `Last-Event-ID` and reads it to its end. Then:

- the model was asked for each turn exactly as often as the unfinished work needs (a journalled
  turn never again, the turn cut off once more), counted in a file across both servers;
- each user tool ran at most once (the sleeping one is answered `interrupted`), an idempotent
  one ran again;
- the conversation's history (what the model is sent on the next prompt) equals the
  reference's, except for the documented `interrupted` result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from atmosphere_harness._tools.bounds import MAX_ARGUMENT_DEPTH
from atmosphere_harness._tools.results import invalid_arguments
from tests.durable.app import PATH, STREAMED
from tests.durable.support import (
    INTERRUPTED,
    WAIT,
    Frame,
    ScenarioFiles,
    read,
    sse_frames,
    terminal,
    wait_for,
)
from tests.reliability.server import ServerProcess


class Harness(ScenarioFiles):
    """One test's directory (see `ScenarioFiles`) and its server, restarted as the test says."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.server: ServerProcess | None = None
        self.lives = 0

    def start(self, **env: str) -> ServerProcess:
        self.lives += 1
        self.server = ServerProcess(
            "durable",
            self.root / "workspace",
            self.root / f"server-{self.lives}.log",
            {
                "ATMOSPHERE_DURABLE_RUNS_ENABLED": "true",
                "DURABLE_TEST_DIR": str(self.root),
                **env,
            },
            module="tests.durable.app",
        ).start()
        return self.server

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url + PATH

    def close(self) -> None:
        if self.server is not None:
            self.server.kill()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()


# --- reading a stream ---------------------------------------------------------------------


def is_event(name: str) -> Callable[[Frame], bool]:
    return lambda frame: frame["event"] == name


def prompt(harness: Harness, conversation: str, message: str) -> list[Frame]:
    """One prompt read to its end (approving every approval it raises)."""
    seen: list[Frame] = []
    with httpx2.stream(
        "POST",
        harness.url,
        json={"message": message, "conversationId": conversation},
        timeout=WAIT,
    ) as response:
        assert response.status_code == 200
        stream = sse_frames(response)
        while True:
            frame = read(stream, lambda f: terminal(f) or f["event"] == "approval-required", seen)
            if terminal(frame):
                break
            answer(harness, frame["data"]["approvalId"])
    assert seen[-1]["event"] == "complete", seen[-3:]
    return seen


def answer(harness: Harness, approval_id: str) -> None:
    response = httpx2.post(
        f"{harness.url}/approvals/{approval_id}", json={"approve": True}, timeout=WAIT
    )
    assert response.status_code == 200, response.text


def follow(harness: Harness, conversation: str, last_seq: int) -> list[Frame]:
    """Re-attach after the restart with `Last-Event-ID` and read the run to its end."""
    seen: list[Frame] = []
    with httpx2.stream(
        "GET",
        f"{harness.url}/conversations/{conversation}/events",
        headers={"Last-Event-ID": str(last_seq)},
        timeout=WAIT,
    ) as response:
        assert response.status_code == 200, response.read()
        stream = sse_frames(response)
        while True:
            frame = read(stream, lambda f: terminal(f) or f["event"] == "approval-required", seen)
            if terminal(frame):
                break
            answer(harness, frame["data"]["approvalId"])
    return seen


def wait_for_true(condition: Callable[[], bool]) -> bool:
    wait_for(condition, "the model's next call")
    return True


def cut(
    harness: Harness, conversation: str, message: str, until: Callable[[Frame], bool]
) -> list[Frame]:
    """Start a prompt, read until `until`, and SIGKILL the server there."""
    seen: list[Frame] = []
    with httpx2.stream(
        "POST",
        harness.url,
        json={"message": message, "conversationId": conversation},
        timeout=WAIT,
    ) as response:
        # Held until the kill: a generator dropped here would close the connection first,
        # and the server would stop the run as a client-left one.
        stream = sse_frames(response)
        read(stream, until, seen)
        assert harness.server is not None
        harness.server.kill()
        stream.close()
    return seen


def check_continues(before: list[Frame], after: list[Frame]) -> None:
    """The resumed run's frames go on from the seq the client had, one run, no gap."""
    seqs = [frame["seq"] for frame in after]
    assert seqs == list(range(before[-1]["seq"] + 1, before[-1]["seq"] + 1 + len(after)))
    assert {frame["sessionId"] for frame in before + after} == {before[0]["sessionId"]}
    assert after[-1]["event"] == "complete"


def started(harness: Harness, tool: str) -> Callable[[Frame], bool]:
    """At the tool's `tool-start` frame, wait until its handler has started (it logs that)."""

    def check(frame: Frame) -> bool:
        if frame["event"] != "tool-start":
            return False
        wait_for(lambda: harness.tool_runs("cut") == [tool], f"{tool} to start")
        return True

    return check


def without_interrupted(history: list[Any]) -> list[Any]:
    return [message for message in history if message[1] != INTERRUPTED]


# --- the scenarios ------------------------------------------------------------------------


def test_killed_while_waiting_for_an_approval(harness: Harness) -> None:
    harness.start()
    prompt(harness, "ref", "approval please")
    prompt(harness, "ref", "followup")

    before = cut(harness, "cut", "approval please", is_event("approval-required"))
    approval_id = before[-1]["data"]["approvalId"]
    expires_at = before[-1]["data"]["expiresAt"]
    harness.start()

    # Listed again, under the same id and deadline, before anyone re-attaches.
    def listed() -> list[dict[str, Any]]:
        response = httpx2.get(f"{harness.url}/approvals", params={"conversationId": "cut"})
        return list(response.json()["approvals"])

    wait_for(lambda: bool(listed()), "the approval to be pending again")
    [pending] = listed()
    assert (pending["approvalId"], pending["expiresAt"]) == (approval_id, expires_at)

    after = follow(harness, "cut", before[-1]["seq"])
    check_continues(before, after)
    announced = [f for f in after if f["event"] == "approval-required"]
    assert [f["data"]["approvalId"] for f in announced] == [approval_id]
    prompt(harness, "cut", "followup")

    assert harness.calls("cut") == {0: 1, 1: 1}
    assert harness.tool_runs("cut") == ["approve_me"]
    assert harness.history("cut") == harness.history("ref")


def test_killed_inside_a_sleeping_user_tool(harness: Harness) -> None:
    harness.start()
    prompt(harness, "ref", "sleep now")
    prompt(harness, "ref", "followup")

    harness.hold("cut-tool")
    before = cut(
        harness,
        "cut",
        "sleep now",
        started(harness, "sleepy"),
    )
    harness.release("cut-tool")
    harness.start()
    after = follow(harness, "cut", before[-1]["seq"])
    check_continues(before, after)
    results = [f["data"]["result"] for f in after if f["event"] == "tool-result"]
    assert results == [INTERRUPTED]
    prompt(harness, "cut", "followup")

    assert harness.calls("cut") == {0: 1, 1: 1}
    assert harness.tool_runs("cut") == ["sleepy"]  # at most once
    cut_history, ref_history = harness.history("cut"), harness.history("ref")
    assert [m for m in ref_history if m[1] == "rested"] != []
    assert [m[1] for m in cut_history if m[0] == "tool"] == [INTERRUPTED]
    assert without_interrupted(cut_history) == [m for m in ref_history if m[1] != "rested"]


def test_an_idempotent_tool_cut_off_runs_again(harness: Harness) -> None:
    harness.start()
    prompt(harness, "ref", "idem now")
    prompt(harness, "ref", "followup")

    harness.hold("cut-tool")
    before = cut(
        harness,
        "cut",
        "idem now",
        started(harness, "sleepy_idempotent"),
    )
    harness.release("cut-tool")
    harness.start()
    after = follow(harness, "cut", before[-1]["seq"])
    check_continues(before, after)
    prompt(harness, "cut", "followup")

    assert harness.calls("cut") == {0: 1, 1: 1}
    assert harness.tool_runs("cut") == ["sleepy_idempotent", "sleepy_idempotent"]
    assert harness.history("cut") == harness.history("ref")


def test_killed_between_two_model_turns(harness: Harness) -> None:
    harness.start()
    prompt(harness, "ref", "between turns")
    prompt(harness, "ref", "followup")

    harness.hold("cut-model")
    before = cut(
        harness,
        "cut",
        "between turns",
        lambda f: (
            f["event"] == "tool-result" and wait_for_true(lambda: harness.calls("cut").get(1) == 1)
        ),
    )
    harness.release("cut-model")
    harness.start()
    after = follow(harness, "cut", before[-1]["seq"])
    check_continues(before, after)
    prompt(harness, "cut", "followup")

    # Turn 0 and its tool result were journalled: never asked again, never run again. Turn 1
    # was in flight: asked once more. Turn 2 once.
    assert harness.calls("cut") == {0: 1, 1: 2, 2: 1}
    assert harness.tool_runs("cut") == ["quick", "quick"]
    assert harness.history("cut") == harness.history("ref")


def test_killed_during_a_streamed_answer(harness: Harness) -> None:
    harness.start()
    prompt(harness, "ref", "stream it")
    prompt(harness, "ref", "followup")

    harness.hold("cut-stream")
    seen_text: list[str] = []

    def three_chunks(frame: Frame) -> bool:
        if frame["event"] == "text":
            seen_text.append(frame["data"]["text"])
        return len(seen_text) == 3

    before = cut(harness, "cut", "stream it", three_chunks)
    harness.release("cut-stream")
    harness.start()
    after = follow(harness, "cut", before[-1]["seq"])
    check_continues(before, after)
    # The answer that was cut off is asked for again and streamed whole after what was sent.
    assert "".join(f["data"]["text"] for f in after if f["event"] == "text") == "".join(STREAMED)
    prompt(harness, "cut", "followup")

    assert harness.calls("cut") == {0: 2}
    assert harness.history("cut") == harness.history("ref")


def test_sigterm_ends_the_stream_with_an_error_and_the_run_resumes(harness: Harness) -> None:
    harness.start()
    prompt(harness, "ref", "idem now")
    prompt(harness, "ref", "followup")

    harness.hold("cut-tool")
    seen: list[Frame] = []
    with httpx2.stream(
        "POST", harness.url, json={"message": "idem now", "conversationId": "cut"}, timeout=WAIT
    ) as response:
        stream = sse_frames(response)
        read(stream, started(harness, "sleepy_idempotent"), seen)
        assert harness.server is not None
        server = harness.server
        assert server.process is not None
        server.process.terminate()
        last = read(stream, terminal, seen)
    assert last["event"] == "error"
    assert last["data"]["message"] == "server is restarting; the run resumes"
    assert server.stopped_cleanly()
    harness.release("cut-tool")

    harness.start()
    after = follow(harness, "cut", seen[-2]["seq"])
    check_continues(seen[:-1], after)
    prompt(harness, "cut", "followup")
    assert harness.calls("cut") == {0: 1, 1: 1}
    # History never kept half a turn: the whole turn was written once, by the resumed run.
    assert harness.history("cut") == harness.history("ref")


def test_truth_reports_the_journal(harness: Harness) -> None:
    server = harness.start()
    info = httpx2.get(server.url + "/api/console/info", timeout=WAIT).json()
    assert info["harness"]["durable-runs"] == "ACTIVE(sqlite)"
    server.stop()
    server = harness.start(ATMOSPHERE_DURABLE_RUNS_ENABLED="false")
    info = httpx2.get(server.url + "/api/console/info", timeout=WAIT).json()
    assert info["harness"]["durable-runs"] == "INACTIVE(disabled)"


def test_a_run_whose_conversation_went_on_is_not_resumed(harness: Harness) -> None:
    """The client gave up on a cut-off turn 2, re-sent it and sent turn 3 while the
    run was not claimed (here: a server without durable runs on the same workspace stands in
    for another replica, or for a restart slower than the client); the run, claimed at last,
    is ended with a `RunSuperseded` error, not resumed: no model call, and turn 2 is not
    appended again after turn 3."""
    harness.start()
    prompt(harness, "cut", "stream one")
    harness.hold("cut-tool")
    before = cut(harness, "cut", "sleep now", started(harness, "sleepy"))
    harness.release("cut-tool")

    harness.start(ATMOSPHERE_DURABLE_RUNS_ENABLED="false")
    prompt(harness, "cut", "sleep now")
    prompt(harness, "cut", "stream three")
    assert harness.server is not None
    harness.server.kill()

    harness.start()  # claims the dead server's run at once
    after = follow(harness, "cut", before[-1]["seq"])
    assert [f["event"] for f in after] == ["error"]
    assert after[-1]["data"]["type"] == "RunSuperseded"
    assert "superseded" in after[-1]["data"]["message"]
    assert after[-1]["seq"] == before[-1]["seq"] + 1
    prompt(harness, "cut", "followup")

    sleep_rounds = [
        e["round"]
        for e in harness.log("calls.jsonl")
        if e["conversation"] == "cut" and e["scenario"] == "sleep"
    ]
    assert sorted(sleep_rounds) == [0, 0, 1]  # the cut-off one, then the re-sent one's two
    history = harness.history("cut")
    assert [m[1] for m in history if m[0] == "user"] == [
        "stream one",
        "sleep now",
        "stream three",
        "followup",
    ]
    assert [m[1] for m in history if m[0] == "tool"] == ["rested"]


def test_a_call_nested_too_deep_is_refused_as_without_durable_runs(harness: Harness) -> None:
    # The model's call nests its arguments 1,200 levels deep: the run refuses it (invalid
    # arguments) and goes on, whether its journal must hold the answer or not.
    refused = invalid_arguments(
        "quick", [f"arguments are nested more than {MAX_ARGUMENT_DEPTH} levels deep"]
    )
    results: dict[str, list[Any]] = {}
    for durable in ("false", "true"):
        harness.start(ATMOSPHERE_DURABLE_RUNS_ENABLED=durable)
        frames = prompt(harness, f"deep-{durable}", "deep please")
        results[durable] = [f["data"]["result"] for f in frames if f["event"] == "tool-result"]
        assert frames[-1]["data"]["summary"] == "deep done."
        harness.close()
    assert results["true"] == results["false"] == [refused]
    assert harness.tool_runs("deep-true") == harness.tool_runs("deep-false") == []
