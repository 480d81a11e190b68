"""`SqliteRunStore` (the embedded `RunStore`) and the durable journal's ordering rule, in process.

The restart behaviour itself is tested over real processes in `test_durable_restart`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness._contracts import LiveRunHandle, StoredRun
from atmosphere_harness._durable import SqliteRunStore
from atmosphere_harness._durable import writer as durable_writer
from atmosphere_harness._durable.journal import DurableRuns
from atmosphere_harness._durable.replay import ENDED
from atmosphere_harness._durable.sqlite import INLINE_BYTES
from atmosphere_harness._events import Frame
from atmosphere_harness._kernel.remote import REFERENCE
from atmosphere_harness._kernel.remote import resolved as _resolved
from atmosphere_harness._kernel.writer import encode
from atmosphere_harness._memory.sqlite import SqliteDatabase

HOST = socket.gethostname()


def stored(run_id: str = "run-1") -> StoredRun:
    return StoredRun(run_id, "/p", "conv", "ann", "session", "hello", 1.0)


def frame(seq: int, text: str = "x") -> tuple[int, str, str]:
    return seq, "text", encode({"text": text})


def checkpoint(key: str, value: Any) -> tuple[str, str]:
    return key, encode(value)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteRunStore]:
    store = SqliteRunStore.under(tmp_path)
    await store.open()
    try:
        yield store
    finally:
        await store.aclose()


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


async def test_what_is_appended_is_loaded_back(store: SqliteRunStore) -> None:
    big = "line of model text\n" * 500  # compressed on disk
    odd = "lone \ud800 surrogate and é"  # not UTF-8 encodable: stored as ASCII escapes
    await store.append(
        "run-1",
        [frame(1), frame(2, big)],
        [checkpoint("model:1", {"text": odd}), checkpoint("tool:1:a", big)],
        create=stored(),
        owner="me",
        lease_seconds=60,
    )
    await store.append("run-1", [frame(3)], [checkpoint("model:1", {"text": "replaced"})])
    checkpoints, frames = await store.load("run-1", 2)
    assert checkpoints == {"model:1": {"text": "replaced"}, "tool:1:a": big}
    assert [(f.seq, f.data["text"]) for f in frames] == [(2, big), (3, "x")]
    assert frames[0].session_id == "session"
    _, every = await store.load("run-1", 10)
    assert [f.seq for f in every] == [1, 2, 3]
    await store.append("run-1", [], [checkpoint("odd", odd)])
    assert (await store.load("run-1", 0))[0]["odd"] == odd


async def test_a_small_append_is_written_now_a_large_one_by_the_thread(
    store: SqliteRunStore,
) -> None:
    # Up to `INLINE_BYTES` of payload on the loop, a first write (the run's row) or not.
    large = "model text\n" * (INLINE_BYTES // 10)
    assert not store.append_now("run-1", [frame(1, large)], [], create=stored(), owner="me")
    assert store.append_now("run-1", [frame(1)], [], create=stored(), owner="me")
    assert store.append_now("run-1", [frame(2, "y" * 1000)], [])
    assert not store.append_now("run-1", [frame(3, large)], [])  # nothing written
    assert [f.seq for f in (await store.load("run-1", 10))[1]] == [1, 2]
    await store.append("run-1", [frame(3, large)], [checkpoint("model:1", {"text": "x"})])
    checkpoints, frames = await store.load("run-1", 10)
    assert [(f.seq, f.data["text"]) for f in frames] == [(1, "x"), (2, "y" * 1000), (3, large)]
    assert checkpoints == {"model:1": {"text": "x"}}


async def test_a_payload_an_earlier_version_compressed_is_read(store: SqliteRunStore) -> None:
    await store.append("run-1", [], [], create=stored(), owner="me")
    packed = zlib.compress(encode({"text": "line\n" * 400}).encode("ascii"), 1)
    await store.database.run(
        lambda c: c.execute(
            "INSERT INTO durable_checkpoints (run, key, value) "
            "SELECT id, 'model:1', ? FROM durable_runs WHERE run_id = 'run-1'",
            (packed,),
        )
    )
    checkpoints, _ = await store.load("run-1", 10)
    assert checkpoints == {"model:1": {"text": "line\n" * 400}}


async def test_a_live_lease_is_not_taken_an_expired_or_dead_one_is(
    store: SqliteRunStore,
) -> None:
    await store.append("live", [], [], create=stored("live"), owner="far/1/x", lease_seconds=60)
    await store.append("expired", [], [], create=stored("expired"), owner="far/1/x")
    owner = f"{HOST}/{dead_pid()}/token"
    await store.append("dead", [], [], create=stored("dead"), owner=owner, lease_seconds=60)
    claimed = await store.claim("me", 60, 10)
    assert sorted(run.run_id for run in claimed) == ["dead", "expired"]
    assert claimed[0].message == "hello"
    assert await store.claim("someone-else", 60, 10) == []  # now held by "me"
    await store.release("me")
    assert sorted(r.run_id for r in await store.claim("someone-else", 60, 10)) == [
        "dead",
        "expired",
    ]


async def test_heartbeat_keeps_a_lease(store: SqliteRunStore) -> None:
    await store.append("run-1", [], [], create=stored(), owner="far/1/x", lease_seconds=0)
    await store.heartbeat("far/1/x", 60)
    assert await store.claim("me", 60, 10) == []


async def test_two_claimants_never_get_the_same_run(tmp_path: Path) -> None:
    # Two connections to one file, as two processes would have.
    path = tmp_path / "atmosphere.db"
    first = SqliteRunStore(path, database=SqliteDatabase(path))
    second = SqliteRunStore(path, database=SqliteDatabase(path))
    await first.open()
    await second.open()
    try:
        for index in range(20):
            await first.append(f"r{index}", [], [], create=stored(f"r{index}"), owner="gone")
        got = await asyncio.gather(
            *(store.claim(f"owner-{n}", 60, 100) for n, store in enumerate((first, second) * 3))
        )
        ids = [run.run_id for runs in got for run in runs]
        assert sorted(ids) == sorted(f"r{index}" for index in range(20))
    finally:
        await first.aclose()
        await second.aclose()


async def test_finish_compacts_and_expire_forgets(store: SqliteRunStore) -> None:
    await store.append("run-1", [frame(1)], [checkpoint("k", 1)], create=stored(), owner="gone")
    await store.finish("run-1")
    assert await store.load("run-1", 10) == ({}, [])
    assert await store.claim("me", 60, 10) == []
    assert await store.expire(before=0) == 0
    assert await store.expire(before=float("inf")) == 1


class GatedStore(SqliteRunStore):
    """Holds every append until the test opens the gate (none is written on the loop)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = asyncio.Event()

    def append_now(self, *args: Any, **more: Any) -> bool:
        return False

    async def append(
        self,
        run_id: str,
        frames: Sequence[tuple[int, str, str]],
        checkpoints: Sequence[tuple[str, str]],
        **more: Any,
    ) -> None:
        await self.gate.wait()
        await super().append(run_id, frames, checkpoints, **more)


async def test_a_reader_never_gets_a_frame_the_store_does_not_hold(tmp_path: Path) -> None:
    store = GatedStore(tmp_path / "atmosphere.db")
    runs = DurableRuns(store)
    published = asyncio.Event()

    value = {"text": "first"}

    async def work(live: LiveRunHandle) -> None:
        await live.publish(Frame("text", {"text": "first"}, "session", "conv", 1))
        await live.checkpoint("model:1", value)
        value["text"] = "changed after it was journalled"
        published.set()

    await store.open()
    try:
        live = runs.start(work, path="/p", conversation_id="conv", user_id=None, message="m")
        reader = live.follow(0)
        first = asyncio.ensure_future(reader.__anext__())
        await published.wait()
        await asyncio.sleep(0.05)
        assert not first.done()  # published, not stored yet: not readable
        store.gate.set()
        got = await first
        assert got.data == {"text": "first"}
        checkpoints, frames = await store.load(live_run_id(runs), 10)
        assert checkpoints == {"model:1": {"text": "first"}}
        assert [f.seq for f in frames] == [1]
        await reader.aclose()
    finally:
        await runs.aclose()
        await store.aclose()
    assert os.path.exists(tmp_path / "atmosphere.db")


async def test_what_a_run_waits_for_is_stored_with_everything_published_before_it(
    tmp_path: Path,
) -> None:
    store = SqliteRunStore.under(tmp_path)
    runs = DurableRuns(store)
    seen: list[tuple[list[int], list[str]]] = []

    async def journal() -> tuple[list[int], list[str]]:
        checkpoints, frames = await store.load(live_run_id(runs), 10)
        return [f.seq for f in frames], sorted(checkpoints)

    async def work(live: LiveRunHandle) -> None:
        await live.checkpoint("model:1", {"text": "", "calls": [["a", "tool", {}]]})
        await live.publish(Frame("tool-start", {"toolCallId": "a"}, "session", "conv", 1))
        seen.append(await journal())  # the run's first write is made at once
        await live.checkpoint("started:1:a", True, wait=True)  # a tool that must not run twice
        seen.append(await journal())
        await live.checkpoint("started:1:b", True)  # one that may: with the next write,
        await live.checkpoint("result:1:b", "done")  # and not at all once its result is there
        await live.publish(Frame("tool-result", {"toolCallId": "b"}, "session", "conv", 2))
        await live.checkpoint("history:1", 1, wait=True)
        seen.append(await journal())

    assert await run_to_end(store, runs, work) == [1, 2]
    assert seen == [
        ([1], ["model:1"]),
        ([1], ["model:1", "started:1:a"]),
        ([1, 2], ["history:1", "model:1", "result:1:b", "started:1:a"]),
    ]


async def test_a_started_mark_still_unwritten_when_its_result_comes_is_left_out(
    tmp_path: Path,
) -> None:
    # A restart replays a journalled result and never reads the call's `started` mark, and the
    # two would go in one record: the mark is one payload a model turn need not write. A mark
    # already written stays; one of another call stays.
    store = SqliteRunStore.under(tmp_path)
    runs = DurableRuns(store)

    async def work(live: LiveRunHandle) -> None:
        await live.checkpoint("model:1", {"text": "", "calls": [["a", "t", {}], ["b", "t", {}]]})
        await live.publish(Frame("tool-start", {"toolCallId": "a"}, "session", "conv", 1))
        await live.checkpoint("started:1:a", True, wait=True)  # written before its tool runs
        await live.checkpoint("started:1:b", {"edited": True})
        await live.checkpoint("started:1:c", True)
        await live.checkpoint("result:1:a", "done a")
        await live.checkpoint("result:1:b", "done b")
        await live.publish(Frame("tool-result", {"toolCallId": "b"}, "session", "conv", 2))
        await live.checkpoint("history:1", 1, wait=True)
        stored.update((await store.load(live_run_id(runs), 10))[0])

    stored: dict[str, Any] = {}
    assert await run_to_end(store, runs, work) == [1, 2]
    assert sorted(stored) == [
        "history:1",
        "model:1",
        "result:1:a",
        "result:1:b",
        "started:1:a",
        "started:1:c",
    ]
    assert stored["result:1:b"] == "done b"


async def test_a_burst_of_turns_arms_one_timer_and_never_cancels_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every group of writes (here each write: no grouping time) leaves its timer armed rather
    # than cancel it: a cancelled timer stays in the loop's heap, where each timer operation
    # compares it in Python. Twenty model turns in one step of the loop make one timer.
    monkeypatch.setattr(durable_writer, "GROUP_SECONDS", 0.0)
    armed: list[asyncio.TimerHandle] = []
    cancelled: list[asyncio.TimerHandle] = []
    call_at, cancel = asyncio.BaseEventLoop.call_at, asyncio.TimerHandle.cancel

    def counted_call_at(loop: Any, when: float, callback: Any, *args: Any, **kw: Any) -> Any:
        handle = call_at(loop, when, callback, *args, **kw)
        if getattr(callback, "__name__", "") == "_drain_soon":
            armed.append(handle)
        return handle

    def counted_cancel(handle: asyncio.TimerHandle) -> None:
        if handle in armed:
            cancelled.append(handle)
        cancel(handle)

    monkeypatch.setattr(asyncio.BaseEventLoop, "call_at", counted_call_at)
    monkeypatch.setattr(asyncio.TimerHandle, "cancel", counted_cancel)
    store = SqliteRunStore.under(tmp_path)
    runs = DurableRuns(store)
    journalled: dict[str, Any] = {}

    async def work(live: LiveRunHandle) -> None:
        for turn in range(1, 21):
            call = f"c{turn}"
            await live.checkpoint(f"model:{turn}", {"text": "", "calls": [[call, "t", {}]]})
            start = {"toolCallId": call, "tool": "t", "arguments": {}}
            await live.publish(Frame("tool-start", start, "session", "conv", 2 * turn - 1))
            await live.checkpoint(f"result:{turn}:{call}", "ok")
            result = {"toolCallId": call, "tool": "t", "result": "ok"}
            await live.publish(Frame("tool-result", result, "session", "conv", 2 * turn))
        await live.checkpoint("history:1", 1, wait=True)
        journalled.update((await store.load(live_run_id(runs), 100))[0])

    assert await run_to_end(store, runs, work) == list(range(1, 41))
    assert len(journalled) == 41  # every model turn, every result, the history mark
    assert len(armed) == 1
    assert cancelled == []


async def test_a_group_of_large_payloads_is_written_on_the_loop_as_it_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Model turns of 50 KiB arguments, faster than the group's time: the group is written as
    # it reaches `GROUP_BYTES`, on the loop, never as one append past `INLINE_BYTES`, which the
    # database thread would write (its write waits for the GIL while the run goes on).
    monkeypatch.setattr(durable_writer, "GROUP_SECONDS", 60.0)  # (never runs out here)
    store = SqliteRunStore.under(tmp_path)
    threaded: list[int] = []
    append = store.append

    async def counted_append(run_id: str, frames: Any, checkpoints: Any, **kw: Any) -> None:
        threaded.append(len(checkpoints))
        await append(run_id, frames, checkpoints, **kw)

    monkeypatch.setattr(store, "append", counted_append)
    runs = DurableRuns(store)
    content = "x" * (50 * 1024)
    journalled: dict[str, Any] = {}

    async def work(live: LiveRunHandle) -> None:
        for turn in range(1, 9):
            call, arguments = f"c{turn}", {"path": f"{turn}.txt", "content": content}
            await live.checkpoint(f"model:{turn}", {"calls": [[call, "write_file", arguments]]})
            start = {"toolCallId": call, "tool": "write_file", "arguments": arguments}
            await live.publish(Frame("tool-start", start, "session", "conv", turn))
        await live.checkpoint("history:1", 1, wait=True)
        journalled.update((await store.load(live_run_id(runs), 100))[0])

    assert await run_to_end(store, runs, work) == list(range(1, 9))
    assert sorted(journalled) == ["history:1"] + [f"model:{turn}" for turn in range(1, 9)]
    assert journalled["model:8"]["calls"][0][2]["content"] == content
    assert threaded == []


@pytest.mark.parametrize("call_id", ["call_1", 'odd "id" \\ é \x00 \ud800'])
async def test_a_tool_start_with_the_models_arguments_refers_to_them(
    tmp_path: Path, call_id: str
) -> None:
    # Stored once (in the model turn), and sent as they were; arguments the tool got changed
    # (an approval's edit) are stored as they are.
    store = SqliteRunStore.under(tmp_path)
    runs = DurableRuns(store)
    arguments = {"path": "a.txt", "content": "x" * 5000}
    start = {"toolCallId": call_id, "tool": "write_file", "arguments": dict(arguments)}
    edited = {"toolCallId": "other", "tool": "write_file", "arguments": {"path": "b.txt"}}
    loaded: list[Any] = []

    async def work(live: LiveRunHandle) -> None:
        calls = [[call_id, "write_file", arguments], ["other", "write_file", arguments]]
        await live.checkpoint("model:1", {"text": "", "calls": calls})
        await live.publish(Frame("tool-start", start, "session", "conv", 1))
        await live.publish(Frame("tool-start", edited, "session", "conv", 2))
        await live.checkpoint("history:1", 1, wait=True)
        loaded.extend(await store.load(live_run_id(runs), 10))

    assert await run_to_end(store, runs, work) == [1, 2]
    checkpoints, frames = loaded
    assert frames[0].data == {**start, "arguments": {REFERENCE: "model:1"}}
    assert frames[1].data == edited
    assert [f.data for f in _resolved(frames, checkpoints)] == [start, edited]


@pytest.mark.parametrize(
    "result", ["Wrote a.txt", 'odd "text" \\ é \x00 \ud800', "long " * 1000, "\x00lifted"]
)
async def test_a_tool_result_frame_is_stored_as_it_was_sent(tmp_path: Path, result: str) -> None:
    # Its payload reuses its result checkpoint's JSON when it can (`_tool_result`).
    store = SqliteRunStore.under(tmp_path)
    runs = DurableRuns(store)
    sent = [
        {"toolCallId": 'c "1" é', "tool": "write_file", "result": result},
        {"toolCallId": "c2", "tool": "write_file", "result": result + "?"},  # not the result
        {"toolCallId": "c3", "tool": "write_file", "result": result, "extra": 1},
    ]
    loaded: list[Any] = []

    async def work(live: LiveRunHandle) -> None:
        for seq, data in enumerate(sent, start=1):
            await live.checkpoint(f"result:1:{data['toolCallId']}", result)
            await live.publish(Frame("tool-result", data, "session", "conv", seq))
        await live.checkpoint("history:1", 1, wait=True)
        loaded.extend(await store.load(live_run_id(runs), 10))

    assert await run_to_end(store, runs, work) == [1, 2, 3]
    checkpoints, frames = loaded
    assert [f.data for f in frames] == sent
    assert set(checkpoints.values()) == {result, 1}


async def test_a_stopped_run_is_journalled_ended_before_it_unwinds(tmp_path: Path) -> None:
    store = SqliteRunStore.under(tmp_path)
    runs = DurableRuns(store)
    in_tool = asyncio.Event()
    seen_while_unwinding: list[str] = []

    async def work(live: LiveRunHandle) -> None:
        await live.publish(Frame("tool-start", {"toolCallId": "a"}, "session", "conv", 1))
        try:
            in_tool.set()
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            # What a stopped run writes as it unwinds (its history) comes after `ENDED`.
            checkpoints, _ = await store.load(live_run_id(runs), 10)
            seen_while_unwinding.extend(checkpoints)
            raise

    await store.open()
    try:
        live = runs.start(work, path="/p", conversation_id="conv", user_id=None, message="m")
        reader = live.follow(0)
        assert (await reader.__anext__()).seq == 1
        await in_tool.wait()
        await reader.aclose()  # the client leaves: the run is stopped
        assert live.task is not None
        with contextlib.suppress(asyncio.CancelledError):
            await live.task
    finally:
        await runs.aclose()
        await store.aclose()
    assert seen_while_unwinding == [ENDED]


async def run_to_end(
    store: SqliteRunStore, runs: DurableRuns, work: Callable[[LiveRunHandle], Awaitable[None]]
) -> list[int]:
    """Open `store`, run `work` as a live run read to its end, close both: the seqs read."""
    await store.open()
    try:
        live = runs.start(work, path="/p", conversation_id="conv", user_id=None, message="m")
        return [f.seq async for f in live.follow(0)]
    finally:
        await runs.aclose()
        await store.aclose()


def live_run_id(runs: DurableRuns) -> str:
    [[live]] = runs._runs.values()
    assert live._writer is not None
    return live._writer.run_id


async def test_a_run_that_ended_or_was_stopped_is_not_run_again(tmp_path: Path) -> None:
    store = SqliteRunStore.under(tmp_path)
    await store.open()
    ended = (2, "complete", encode({"summary": "done"}))
    await store.append("ended", [frame(1), ended], [], create=stored("ended"), owner="gone")
    await store.append("cut", [frame(1)], [], create=stored("cut"), owner="gone")
    stopped = [checkpoint(ENDED, "client-left")]  # its client stopped it
    await store.append("stopped", [frame(1)], stopped, create=stored("stopped"), owner="gone")
    await store.aclose()
    resumed: list[str] = []
    runs = DurableRuns(SqliteRunStore.under(tmp_path))

    async def resume(live: LiveRunHandle, run: StoredRun) -> None:
        resumed.append(run.run_id)
        assert live.start_seq == 1
        await live.publish(Frame("complete", {}, run.session_id, run.conversation_id, 2))

    await runs.open(resume)
    live = await runs.find("/p", "conv")
    assert live is not None
    assert [frame.seq async for frame in live.follow(0)] == [1, 2]
    await runs.aclose()
    assert resumed == ["cut"]
    check = SqliteRunStore.under(tmp_path)
    await check.open()
    try:
        assert await check.claim("anyone", 60, 10) == []  # all three finished now
    finally:
        await check.aclose()
