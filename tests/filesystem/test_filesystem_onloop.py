"""Small workspace operations run on the event loop, and fall back to a worker thread, with the
same results, errors and guarantees, whenever they could wait: a busy store (a thread or another
process holds it), a recount, a file past the bound, or a cool-down after a slow operation
(driven by a fake clock, never by timing)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import FileSystemLimits, WorkspaceAgentFileSystem
from atmosphere_harness._filelocks import LockFile
from atmosphere_harness._filesystem import spares, workers
from atmosphere_harness._filesystem import tally as tally_module
from atmosphere_harness._filesystem import workspace as workspace_module
from atmosphere_harness._filesystem.paths import store_key
from atmosphere_harness._filesystem.usage import (
    InProcessWorkspaceUsage,
    SharedVolumeWorkspaceUsage,
    StoreUsage,
    lock_path,
)
from tests.fs_support import Hops, rejects, tree


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.queued = 0.0  # how long the thread waited for a CPU

    def __call__(self) -> float:
        return self.now

    def waited(self) -> float:
        return self.queued


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(workers, "ON_LOOP", workers.LoopBudget(clock=fake, waited=fake.waited))
    return fake


async def written(tmp_path: Path, **limits: int) -> WorkspaceAgentFileSystem:
    """A store whose first write (which claims it, always in a worker) is done."""
    fs = WorkspaceAgentFileSystem(tmp_path / "store", FileSystemLimits(**limits))
    await fs.write("first.md", "one")
    return fs


async def test_small_operations_after_the_first_never_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    fs = await written(tmp_path)
    hops = Hops(monkeypatch)
    await fs.write("notes/a.md", "alpha beta")
    assert await fs.edit("notes/a.md", "beta", "gamma") == 1
    assert await fs.read("notes/a.md") == "alpha gamma"
    assert await fs.write_many([("b.md", "bee"), ("c.md", "sea")]) == [None, None]
    with rejects("File not found: missing.md"):
        await fs.read("missing.md")
    with rejects("old_text not found in b.md — nothing was changed"):
        await fs.edit("b.md", "zzz", "y")
    assert hops.count == 0
    assert tree(tmp_path / "store") == {
        "first.md": b"one",
        "notes/a.md": b"alpha gamma",
        "b.md": b"bee",
        "c.md": b"sea",
    }, "atomic writes leave no temporary file"
    assert await fs.usage() == StoreUsage(4, 3 + 11 + 3 + 3)


async def test_operations_past_the_bound_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    fs = await written(tmp_path)
    big = "A" + "x" * workers.ON_LOOP_BYTES
    hops = Hops(monkeypatch)
    await fs.write("big.md", big)
    assert hops.count == 1
    assert await fs.read("big.md") == big
    assert hops.count == 2, "a file found past the bound is read in a worker"
    assert await fs.edit("big.md", "A", "B") == 1
    assert hops.count == 3
    await fs.write("small.md", "abc")
    assert await fs.edit("small.md", "b", "y" * workers.ON_LOOP_BYTES) == 1
    assert hops.count == 4, "an edit whose result passes the bound writes in a worker"
    assert (tmp_path / "store" / "small.md").stat().st_size == 2 + workers.ON_LOOP_BYTES
    half = "z" * (workers.ON_LOOP_BYTES // 2 + 1)
    assert await fs.write_many([("h1.md", half), ("h2.md", half)]) == [None, None]
    assert hops.count == 5, "a batch past the bound in total hops"
    assert clock.now == 1000.0
    assert workers.ON_LOOP.trips == 0


async def test_a_store_that_flushes_writes_and_edits_in_the_worker_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    fs = WorkspaceAgentFileSystem(tmp_path / "store", fsync=True)
    await fs.write("first.md", "one")
    flushed: list[bool] = []
    real = workspace_module.write_atomic

    def watched(target: str, data: bytes, **options: Any) -> None:
        flushed.append(bool(options.get("fsync")) and not workspace_module._here.on_loop)
        real(target, data, **options)

    monkeypatch.setattr(workspace_module, "write_atomic", watched)
    hops = Hops(monkeypatch)
    await fs.write("a.md", "alpha")
    assert await fs.edit("a.md", "alpha", "beta") == 1
    assert await fs.write_many([("b.md", "bee"), ("c.md", "sea")]) == [None, None]
    assert hops.count == 3, "every change of a flushing store waits for the disk in a worker"
    assert flushed == [True] * 4, "each write flushed, never on the event loop"
    assert await fs.read("a.md") == "beta"
    assert hops.count == 3, "a read flushes nothing: it stays on the loop"
    assert workers.ON_LOOP.trips == 0


async def test_a_slow_operation_sends_small_ones_to_the_worker_for_a_cool_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    fs = await written(tmp_path)
    real = workspace_module.write_atomic

    def slow_disk(target: str, data: bytes, **options: Any) -> None:
        clock.now += workers.SLOW_SECONDS * 2  # the write took "4 ms"
        real(target, data, **options)

    monkeypatch.setattr(workspace_module, "write_atomic", slow_disk)
    hops = Hops(monkeypatch)
    caplog.set_level(logging.DEBUG, logger="atmosphere_harness._filesystem.workers")
    await fs.write("a0.md", "alpha")
    assert hops.count == 0, "it ran on the loop, and was slow"
    assert (workers.ON_LOOP.trips, workers.ON_LOOP.hiccups) == (0, 1), "alone: a hiccup"
    assert "slow once" in caplog.text
    clock.now += workers.HICCUP_SECONDS - 0.01
    await fs.write("a.md", "alpha")
    assert hops.count == 0, "it ran on the loop too, and was slow soon after the first"
    assert workers.ON_LOOP.trips == 1
    assert "small operations use the worker threads" in caplog.text
    assert "operation='write'" in caplog.text
    monkeypatch.setattr(workspace_module, "write_atomic", real)

    await fs.write("b.md", "beta")
    assert await fs.read("b.md") == "beta"
    assert await fs.edit("b.md", "beta", "BETA") == 1
    assert await fs.write_many([("c.md", "sea")]) == [None]
    assert hops.count == 4, "during the cool-down every small operation hops"
    assert tree(tmp_path / "store") == {
        "first.md": b"one",
        "a0.md": b"alpha",
        "a.md": b"alpha",
        "b.md": b"BETA",
        "c.md": b"sea",
    }

    clock.now += workers.COOL_DOWN_SECONDS
    await fs.write("d.md", "delta")
    assert hops.count == 4, "after the cool-down they run on the loop again"
    assert workers.ON_LOOP.trips == 1


def test_a_cool_down_doubles_while_the_disk_stays_slow_and_starts_over_after_a_quiet_spell(
    clock: Clock,
) -> None:
    budget = workers.LoopBudget(clock=clock, waited=clock.waited)

    def slow_operation() -> float:
        """Run one slow operation on the loop; the cool-down it started, in seconds."""
        assert budget.allows()
        started = budget.start()
        clock.now += workers.SLOW_SECONDS * 2
        budget.spent(started, "write")
        ended = clock.now
        while not budget.allows():
            clock.now += 0.25
        return round(clock.now - ended, 6)

    assert slow_operation() == 0.0, "a lone slow operation is a hiccup"
    assert slow_operation() == workers.FIRST_COOL_DOWN_SECONDS, "the second soon after"
    assert slow_operation() == 2.0, "the probe right after the cool-down was slow too"
    assert [slow_operation() for _ in range(4)] == [4.0, 8.0, 10.0, 10.0]
    clock.now += workers.COOL_DOWN_SECONDS - 0.5
    assert slow_operation() == 10.0, "still within the spell: no reset, no hiccup"
    clock.now += workers.COOL_DOWN_SECONDS + 0.5
    assert slow_operation() == 0.0, "a quiet spell starts over: a hiccup again"
    assert slow_operation() == workers.FIRST_COOL_DOWN_SECONDS
    assert (budget.trips, budget.hiccups) == (8, 2)


def test_only_a_lone_short_slow_operation_is_a_hiccup(clock: Clock) -> None:
    budget = workers.LoopBudget(clock=clock, waited=clock.waited)

    def operation(took: float) -> bool:
        """Run one operation of `took` seconds on the loop; whether the loop still allows."""
        started = budget.start()
        clock.now += took
        budget.spent(started, "edit")
        return budget.allows()

    assert operation(workers.SLOW_SECONDS * 1.5)
    clock.now += workers.HICCUP_SECONDS
    assert operation(workers.SLOW_SECONDS * 1.5), "long enough after: a hiccup again"
    clock.now += workers.HICCUP_SECONDS
    assert not operation(workers.STALL_SECONDS * 1.5), "a stall is never let pass"
    assert (budget.trips, budget.hiccups) == (1, 2)
    fresh = workers.LoopBudget(clock=clock, waited=clock.waited)
    budget = fresh
    assert operation(workers.SLOW_SECONDS * 1.5)
    assert operation(workers.SLOW_SECONDS / 2), "a quick one between changes nothing"
    assert not operation(workers.SLOW_SECONDS * 1.5), "the next slow one soon after trips"
    assert (fresh.trips, fresh.hiccups) == (1, 1)


def test_the_wait_for_a_cpu_is_read_again_only_after_a_slow_operation(clock: Clock) -> None:
    reads: list[float] = []

    def waited() -> float:
        reads.append(clock.queued)
        return clock.queued

    budget = workers.LoopBudget(clock=clock, waited=waited, stall=0.0)  # no hiccup let pass
    started = budget.start()
    clock.now += workers.SLOW_SECONDS / 2
    budget.spent(started, "write")
    assert len(reads) == 1, "a quick operation: one read (a system call), at its start"
    started = budget.start()
    clock.now += workers.SLOW_SECONDS * 3
    clock.queued += workers.SLOW_SECONDS * 3  # slow in wall time, all of it waiting for a CPU
    budget.spent(started, "write")
    assert len(reads) == 3
    assert budget.allows(), "not the disk's fault: no cool-down"
    started = budget.start()
    clock.now += workers.SLOW_SECONDS * 3
    budget.spent(started, "write")
    assert not budget.allows()


async def test_time_spent_waiting_for_a_cpu_does_not_trip_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    fs = await written(tmp_path)
    real = workspace_module.write_atomic

    def preempted(target: str, data: bytes, **options: Any) -> None:
        clock.now += 0.05  # 50 ms of wall time, all of it waiting for a CPU
        clock.queued += 0.05 - workers.SLOW_SECONDS / 2
        real(target, data, **options)

    monkeypatch.setattr(workspace_module, "write_atomic", preempted)
    hops = Hops(monkeypatch)
    await fs.write("a.md", "alpha")
    await fs.write("b.md", "beta")
    assert (hops.count, workers.ON_LOOP.trips) == (0, 0)
    assert workers.cpu_wait() >= 0.0  # the real source answers (0.0 where unknown)


async def test_a_store_held_by_another_thread_makes_the_write_wait_in_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    fs = await written(tmp_path, max_files=3)
    ledger = fs._ledger
    taken, release = threading.Event(), threading.Event()

    def holder() -> None:
        with ledger.hold():
            taken.set()
            release.wait(10)  # a loop blocked on the hold would be freed after this

    thread = threading.Thread(target=holder)
    thread.start()
    assert await asyncio.to_thread(taken.wait, 30)
    hops = Hops(monkeypatch)
    write = asyncio.create_task(fs.write("a.md", "alpha"))
    second = asyncio.create_task(fs.write("b.md", "beta"))
    await asyncio.sleep(0.05)  # the loop runs on: the writes wait in worker threads
    assert not write.done()
    assert not second.done()
    assert hops.count == 2
    release.set()
    await write
    await second
    thread.join()
    with rejects("Write rejected: the store already holds 3 files, at the 3-file limit"):
        await fs.write("c.md", "sea")
    assert tree(tmp_path / "store") == {"first.md": b"one", "a.md": b"alpha", "b.md": b"beta"}


async def test_a_store_locked_by_another_process_waits_in_a_worker_and_recounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """Another `LockFile` on the store's lock file stands for another process: its `flock` is
    held on a separate open file, so this one's non-blocking attempt is refused."""
    fs = await written(tmp_path, max_files=3)
    other = LockFile(lock_path(store_key(tmp_path / "store")))
    taken, release = threading.Event(), threading.Event()

    def holder() -> None:
        with other:  # it marks the lock file as its own
            (tmp_path / "store" / "behind.md").write_text("written by the other process")
            taken.set()
            release.wait(10)  # a loop blocked on the lock would be freed after this

    thread = threading.Thread(target=holder)
    thread.start()
    assert await asyncio.to_thread(taken.wait, 30)
    hops = Hops(monkeypatch)
    write = asyncio.create_task(fs.write("a.md", "alpha"))
    await asyncio.sleep(0.05)
    assert not write.done()
    assert hops.count == 1
    release.set()
    await write
    thread.join()
    await fs.write("a.md", "ALPHA")
    assert hops.count == 1, "once the lock is free again, writes run on the loop"
    with rejects("Write rejected: the store already holds 3 files, at the 3-file limit"):
        await fs.write("b.md", "beta")
    assert hops.count == 2, "a rejection is decided on a fresh count: a walk, in a worker"
    assert await fs.usage() == StoreUsage(3, 3 + 28 + 5)


async def test_a_change_by_another_process_makes_the_next_write_recount_in_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    limits = FileSystemLimits(max_files=3)
    first = WorkspaceAgentFileSystem(tmp_path / "s", limits, usage=SharedVolumeWorkspaceUsage())
    second = WorkspaceAgentFileSystem(tmp_path / "s", limits, usage=SharedVolumeWorkspaceUsage())
    await first.write("a.md", "alpha")
    await second.write("b.md", "beta")
    hops = Hops(monkeypatch)
    loop_thread = threading.get_ident()
    walks = 0
    rebuild = workspace_module.DiskTally.rebuild

    def counted(self: Any, root: str) -> StoreUsage:
        nonlocal walks
        assert threading.get_ident() != loop_thread, "never on the loop"
        walks += 1
        return rebuild(self, root)

    monkeypatch.setattr(workspace_module.DiskTally, "rebuild", counted)
    await first.write("c.md", "sea")
    assert (hops.count, walks) == (1, 1), "the other ledger's mark: a recount, in a worker"
    await first.write("c.md", "SEA")
    assert (hops.count, walks) == (1, 1), "its own mark again: on the loop, no walk"
    with rejects("Write rejected: the store already holds 3 files, at the 3-file limit"):
        await second.write("d.md", "delta")
    assert (hops.count, walks) == (2, 2)


async def test_a_tally_past_its_resync_age_walks_in_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    fs = await written(tmp_path)
    fs._tally.synced_at -= workspace_module.FULL_RESYNC_SECONDS + 1
    hops = Hops(monkeypatch)
    await fs.write("a.md", "alpha")
    assert hops.count == 1
    await fs.write("b.md", "beta")
    assert hops.count == 1, "walked: the next one runs on the loop"
    assert await fs.usage() == StoreUsage(3, 3 + 5 + 4)


async def test_many_directories_keep_the_periodic_check_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    monkeypatch.setattr(tally_module, "DIR_CHECK_SECONDS", 3600.0)  # only when told below
    fs = await written(tmp_path)
    many = workspace_module.ON_LOOP_DIRECTORIES + 1
    assert await fs.write_many([(f"d{n}/f.md", "x") for n in range(many)]) == [None] * many
    hops = Hops(monkeypatch)
    fs._tally.checked_at -= 3601.0
    await fs.write("a.md", "alpha")
    assert hops.count == 1, "the check of every directory is due: in a worker"
    await fs.write("b.md", "beta")
    assert hops.count == 1, "done: the next write checks its own path only, on the loop"


async def test_the_first_write_of_a_conversation_applies_the_cap_in_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    loop_thread = threading.get_ident()
    threads: list[bool] = []
    fs = WorkspaceAgentFileSystem(
        tmp_path / "c1",
        on_create=lambda: threads.append(threading.get_ident() == loop_thread),
        usage=InProcessWorkspaceUsage(),
    )
    await fs.write("a.md", "alpha")
    assert fs._claimed
    # The store directory disappears (as after an eviction by another process's cap).
    shutil.rmtree(tmp_path / "c1")
    await fs.write("b.md", "beta")
    assert threads == [False, False], "the cap ran in a worker thread both times"
    assert tree(tmp_path / "c1") == {"b.md": b"beta"}


async def test_a_ledger_that_cannot_try_its_hold_always_hops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    class Plain:
        """A usage whose ledgers offer `hold()` only (the protocol's minimum)."""

        def __init__(self) -> None:
            self.inner = InProcessWorkspaceUsage()

        def ledger(self, store: str) -> Any:
            real = self.inner.ledger(store)

            class Ledger:
                hold = real.hold
                claim = real.claim
                current = real.current
                recount = real.recount
                reserve = real.reserve
                adjust = real.adjust

            return Ledger()

    fs = WorkspaceAgentFileSystem(tmp_path / "p", usage=Plain())  # type: ignore[arg-type]
    await fs.write("a.md", "alpha")
    hops = Hops(monkeypatch)
    await fs.write("b.md", "beta")
    assert await fs.read("b.md") == "beta"
    assert hops.count == 1, "the write hops; a read takes no hold and stays on the loop"


def test_try_enter_never_waits_and_leaves_the_lock_free_when_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "x.lock")
    mine, theirs = LockFile(path), LockFile(path)
    assert mine.try_enter() is True, "the first holder marks the file"
    assert theirs.try_enter() is None, "held by another open file: refused at once"
    mine.__exit__(None, None, None)
    assert mine.try_enter() is False, "nobody else came between"
    mine.__exit__(None, None, None)
    assert theirs.try_enter() is True
    assert mine.try_enter() is None
    theirs.__exit__(None, None, None)
    with mine as foreign:  # a refused attempt released its thread lock
        assert foreign is True


async def test_a_run_of_on_loop_operations_gives_other_tasks_a_turn_every_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    fs = await written(tmp_path)
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(other_task())
    await asyncio.sleep(0)
    hops = Hops(monkeypatch)
    started = turns
    for number in range(5):
        await fs.write(f"f{number}.md", "x")
        await fs.read(f"f{number}.md")
    assert await fs.write_many([("g.md", "y"), ("h.md", "z")]) == [None, None]
    assert hops.count == 0
    assert turns == started, "a run shorter than the slice keeps the loop"
    clock.now += workers.SLICE_SECONDS * 1.5  # (less than `IDLE_SECONDS`: still back to back)
    assert await fs.read("g.md") == "y"
    assert turns == started + 1, "the operation that ends past the slice yields once"
    assert await fs.read("h.md") == "z"
    assert turns == started + 1, "and the slice starts again"
    clock.now += workers.SLICE_SECONDS * 1.5
    assert await fs.write_many([("i.md", "i")]) == [None]
    assert turns == started + 2, "a batch too"
    clock.now += workers.SLICE_SECONDS * 1.5
    await fs.ls()  # a hop: the loop ran other tasks while it waited
    started = turns
    assert await fs.read("i.md") == "i"
    assert turns == started, "right after a hop, no turn is owed"
    clock.now += workers.IDLE_SECONDS * 2
    assert await fs.read("g.md") == "y"
    clock.now += workers.SLICE_SECONDS * 0.9
    assert await fs.read("h.md") == "z"
    assert turns == started, "a lone operation after a pause starts a new run"
    ticker.cancel()


async def test_a_deep_path_hops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    fs = await written(tmp_path)
    deep = "/".join(["d"] * workspace_module.ON_LOOP_DIRECTORIES) + "/f.md"
    hops = Hops(monkeypatch)
    await fs.write(deep, "deep")
    assert await fs.read(deep) == "deep"
    assert await fs.write_many([("a.md", "x"), (deep, "deeper")]) == [None, None]
    assert hops.count == 3, "a stat per directory on the path: in a worker"
    await fs.write("d/" * (workspace_module.ON_LOOP_DIRECTORIES - 1) + "g.md", "shallower")
    assert hops.count == 3


async def test_a_private_store_needs_no_hop_keeps_nothing_beside_it_and_lists_its_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    with pytest.raises(ValueError, match="takes no usage"):
        WorkspaceAgentFileSystem(tmp_path / "x", private=True, usage=InProcessWorkspaceUsage())
    root = tmp_path / "scratch" / "files"
    root.parent.mkdir()
    fs = WorkspaceAgentFileSystem(root, FileSystemLimits(max_files=3), private=True)
    assert fs.known_files() == [], "nothing written: an empty list, no walk"
    hops = Hops(monkeypatch)
    await fs.write("a.md", "alpha")
    await fs.write("notes/b.md", "beta")
    await fs.write("a.md", "alpha two")  # a replacing write: no named spare is asked for
    assert await fs.edit("notes/b.md", "beta", "gamma") == 1
    assert await fs.read("a.md") == "alpha two"
    assert hops.count == 0, "no lease to claim: even the first write runs on the loop"
    errors = await fs.write_many([("c.md", "c"), ("d.md", "d")])
    assert errors[0] is None
    assert "at the 3-file limit" in str(errors[1]), "bounds as usual"
    assert hops.count == 1, "a rejection recounts first, as in any store: in a worker"
    assert sorted(p.name for p in root.parent.iterdir()) == ["files"], "no lock or lease file"
    assert tree(root) == {"a.md": b"alpha two", "notes/b.md": b"gamma", "c.md": b"c"}
    assert not (root / spares.SPARES_DIR).exists(), "no named spares"
    home = store_key(root)
    assert home not in spares.SPARES._homes
    assert spares.SPARES.named(home) == 0
    assert not workspace_module.is_live(root), "nothing registered in the process's usage"

    assert fs.known_files() == ["a.md", "c.md", "notes/b.md"], "from its count: no walk"
    assert hops.count == 1
    (root / "notes" / "behind.md").write_text("x")  # a change behind the store's back
    os.utime(root / "notes", ns=(1, 1))  # (whatever the clock's granularity)
    assert fs.known_files() is None, "a directory changed: only a walk can say"
    assert await fs.glob("**") == ["a.md", "c.md", "notes/b.md", "notes/behind.md"]
    assert WorkspaceAgentFileSystem(tmp_path / "shared").known_files() is None, "not private"
