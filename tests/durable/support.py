"""What the durable-runs restart tests share: the files the test app writes, and SSE reading.

`tests.durable.app` (the server under test, in its own process) appends each model call and
tool run to JSON-lines files in `DURABLE_TEST_DIR`, and blocks a tool while a "hold" file
exists there; `ScenarioFiles` reads and sets those files for a test, whichever servers (one
restarted server, or replicas A and B) it runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2

from tests.reliability.server import ServerProcess

INTERRUPTED = (
    '{"status":"interrupted","message":"the server restarted while this tool ran; '
    'call it again if it is still needed"}'
)
WAIT = 60.0
"""Hang guard for anything the test waits on (not a speed expectation)."""

Frame = dict[str, Any]


class ScenarioFiles:
    """One test's directory: the holds it sets and the logs the app writes into it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "hold").mkdir()

    def hold(self, name: str) -> None:
        (self.root / "hold" / name).touch()

    def release(self, name: str) -> None:
        (self.root / "hold" / name).unlink(missing_ok=True)

    def log(self, name: str) -> list[dict[str, Any]]:
        path = self.root / name
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def calls(self, conversation: str) -> dict[int, int]:
        """Model calls per round of `conversation`'s first prompt (the scenario's), over every
        server that ran it."""
        counted: dict[int, int] = {}
        for entry in self.log("calls.jsonl"):
            if entry["conversation"] == conversation and entry["scenario"] != "followup":
                counted[entry["round"]] = counted.get(entry["round"], 0) + 1
        return counted

    def called_at(self, conversation: str, round_: int) -> float:
        """When `round_` of `conversation`'s first prompt was asked for (its last call)."""
        times = [
            entry["at"]
            for entry in self.log("calls.jsonl")
            if entry["conversation"] == conversation
            and entry["scenario"] != "followup"
            and entry["round"] == round_
        ]
        assert times, f"round {round_} of {conversation} was never asked for"
        return float(times[-1])

    def tool_runs(self, conversation: str) -> list[str]:
        return [e["tool"] for e in self.log("tools.jsonl") if e["conversation"] == conversation]

    def history(self, conversation: str) -> list[Any]:
        """What the model was sent on the follow-up prompt: the stored history, then it."""
        for entry in self.log("calls.jsonl"):
            if entry["conversation"] == conversation and entry["scenario"] == "followup":
                return list(entry["messages"])
        raise AssertionError(f"no follow-up prompt in {conversation}")


def sse_frames(response: httpx2.Response) -> Iterator[Frame]:
    """Each frame of an SSE response, as it arrives."""
    data: list[str] = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            yield json.loads("\n".join(data))
            data = []


def read(stream: Iterator[Frame], until: Callable[[Frame], bool], seen: list[Frame]) -> Frame:
    for frame in stream:
        seen.append(frame)
        if until(frame):
            return frame
    raise AssertionError(f"the stream ended before the awaited frame: {seen[-3:]}")


def terminal(frame: Frame) -> bool:
    return frame["event"] in ("complete", "error")


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def start_pair(root: Path, env: dict[str, str]) -> tuple[ServerProcess, ServerProcess]:
    """Replicas A and B of the durable test app (`tests.durable.app`) on `root`'s workspace,
    with `env`, each logging to `root/{a,b}.log` (a B that fails to start stops A)."""

    def server(name: str) -> ServerProcess:
        return ServerProcess(
            "durable",
            root / "workspace",
            root / f"{name}.log",
            {**env, "DURABLE_TEST_DIR": str(root)},
            module="tests.durable.app",
        ).start()

    a = server("a")
    try:
        return a, server("b")
    except BaseException:
        a.kill()
        raise
