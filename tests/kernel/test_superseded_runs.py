"""A resumed durable run whose conversation went on without it is ended, not resumed.

Store-independent: the run's journal is a stand-in `LiveRunHandle` holding what a first life
journalled, the history a real `InMemoryHistory` behind the memory primitive. The real-process
versions (SQLite, PostgreSQL, Redis) are in `tests/durable` and `tests/scaleout`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from atmosphere_harness import HarnessSettings, ScriptedRuntime, agent
from atmosphere_harness._durable.replay import ENDED, SUPERSEDED, DurableReplay
from atmosphere_harness._events import Frame
from atmosphere_harness._kernel.endpoint import HostedEndpoint
from atmosphere_harness._kernel.host import HarnessHost
from atmosphere_harness._kernel.run import execute_prompt
from atmosphere_harness._memory.history import ConversationKey, InMemoryHistory
from atmosphere_harness._memory.primitive import MemoryPrimitive
from atmosphere_harness._registry import spec_of
from tests.agents import echo

Chat = echo(agent(name="chat"), "Chat")


class Journal:
    """A durable run's journal as the kernel sees it (`contracts.LiveRunHandle`)."""

    path = "/atmosphere/agent/chat"
    conversation_id = "c"
    user_id: str | None = None
    session_id: str | None = "first-life"
    task: asyncio.Task[Any] | None = None
    finished = False
    held = False
    durable = True
    suspended = False

    def __init__(self, checkpoints: Mapping[str, Any], start_seq: int = 0) -> None:
        self.checkpoints = dict(checkpoints)
        self.start_seq = start_seq
        self.written: dict[str, Any] = {}
        self.sink: Any = None

    async def checkpoint(self, key: str, value: Any, *, wait: bool = False) -> None:
        self.written[key] = value

    def note(self, key: str, value: Any) -> None:
        self.written[key] = value

    async def publish(self, frame: Frame) -> None:
        await self.sink(frame)

    def bind(self, run: Any) -> Any:
        return REPLAY.bind(run, self)


REPLAY = DurableReplay()


@asynccontextmanager
async def hosted(
    workspace: Path, runtime: ScriptedRuntime, history: InMemoryHistory
) -> AsyncIterator[tuple[HarnessHost, HostedEndpoint]]:
    host = HarnessHost(
        HarnessSettings(workspace_root=workspace),
        runtime=runtime,
        specs=[spec_of(Chat)],
        primitives=[MemoryPrimitive(history=history)],
        hooks=[REPLAY],
    )
    await host.start()
    try:
        (endpoint,) = host.endpoints.values()
        yield host, endpoint
    finally:
        await host.stop()


async def run(
    host: HarnessHost, endpoint: HostedEndpoint, message: str, journal: Journal | None = None
) -> list[Frame]:
    frames: list[Frame] = []

    async def sink(frame: Frame) -> None:
        frames.append(frame)

    if journal is not None:
        journal.sink = sink

    await execute_prompt(
        host,
        endpoint,
        message=message,
        conversation_id="c",
        user_id=None,
        sink=sink,
        live=journal,  # type: ignore[arg-type]
    )
    return frames


def key() -> ConversationKey:
    return ConversationKey("/atmosphere/agent/chat", None, "c")


async def test_a_first_life_journals_where_the_history_stands(workspace: Path) -> None:
    history = InMemoryHistory()
    runtime = ScriptedRuntime(["one", "two"])
    async with hosted(workspace, runtime, history) as (host, endpoint):
        await run(host, endpoint, "turn 1")
        journal = Journal({})
        frames = await run(host, endpoint, "turn 2", journal)
    assert frames[-1].event == "complete"
    assert journal.written["since:1"] == 2  # turn 1's two messages, before turn 2's
    assert journal.written["history:1"] == 1


async def test_a_resumed_run_whose_conversation_went_on_is_ended(workspace: Path) -> None:
    history = InMemoryHistory()
    runtime = ScriptedRuntime(["one", "two again", "three"])
    first_life = {
        "since:1": 2,  # turn 1 was stored when the first life of turn 2 started
        "model:1": {"text": "", "calls": [["call-1", "write_todos", {"todos": []}]]},
    }
    async with hosted(workspace, runtime, history) as (host, endpoint):
        await run(host, endpoint, "turn 1")
        await run(host, endpoint, "turn 2")  # re-sent by the client, answered elsewhere
        await run(host, endpoint, "turn 3")
        asked = len(runtime.requests)
        journal = Journal(first_life, start_seq=3)
        frames = await run(host, endpoint, "turn 2", journal)
        stored = await history.messages(key())
    assert [(f.event, f.data, f.seq) for f in frames] == [
        ("error", {"message": SUPERSEDED, "type": "RunSuperseded"}, 4)
    ]
    assert len(runtime.requests) == asked  # the model was not called
    assert [m.content for m in stored if m.role == "user"] == ["turn 1", "turn 2", "turn 3"]
    assert journal.written[ENDED] == "superseded"
    assert "history:1" not in journal.written


async def test_a_resumed_run_whose_conversation_stood_still_resumes(workspace: Path) -> None:
    history = InMemoryHistory()
    runtime = ScriptedRuntime(["one", "two"])
    first_life = {
        "since:1": 2,
        "model:1": {"text": "", "calls": [["call-1", "write_todos", {"todos": []}]]},
    }
    async with hosted(workspace, runtime, history) as (host, endpoint):
        await run(host, endpoint, "turn 1")
        asked = len(runtime.requests)
        journal = Journal(first_life, start_seq=1)
        frames = await run(host, endpoint, "turn 2", journal)
        stored = await history.messages(key())
    assert frames[-1].event == "complete", frames
    assert len(runtime.requests) == asked + 1  # only the turn the first life had not got
    assert [m.content for m in stored if m.role == "user"] == ["turn 1", "turn 2"]
    assert ENDED not in journal.written
    assert journal.written["history:1"] == 1


async def test_a_resumed_run_of_a_cleared_conversation_is_ended(workspace: Path) -> None:
    history = InMemoryHistory()
    runtime = ScriptedRuntime(["one", "two", "other"])
    async with hosted(workspace, runtime, history) as (host, endpoint):
        await run(host, endpoint, "turn 1")
        await run(host, endpoint, "turn 2")
        await history.clear(key())
        await run(host, endpoint, "new start")  # seqs start again: 2 once more, a new history
        journal = Journal({"since:1": 4}, start_seq=0)
        frames = await run(host, endpoint, "turn 3", journal)
    assert frames[-1].data["type"] == "RunSuperseded"
