"""A write that replaces a file keeps the old one open across the rename and closes it in a
worker thread afterwards (`spares.SpareFiles.retire`): the last close frees the old file's
blocks, which neither the event loop nor the write's own time then pays. And `workers.later`,
how such work is asked for: after the operation, in a worker, batched from the loop."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from atmosphere_harness import FileSystemError, WorkspaceAgentFileSystem
from atmosphere_harness._filesystem import spares, workers
from atmosphere_harness._filesystem.workers import WorkerPool
from tests.fs_support import tree


def open_on(path: Path) -> list[str]:
    """What this process's descriptors open on `path` (or on the file it named, now replaced:
    `<path> (deleted)`) point to."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target in (str(path), f"{path} (deleted)"):
            found.append(target)
    return found


pytestmark = pytest.mark.skipif(
    not os.path.isdir("/proc/self/fd"), reason="reads the process's descriptors in /proc"
)


@pytest.fixture
def later(monkeypatch: pytest.MonkeyPatch) -> list[Callable[[], object]]:
    """The jobs the workspace leaves for later, kept here instead of run (the test runs them)."""
    jobs: list[Callable[[], object]] = []
    monkeypatch.setattr(workers, "later", jobs.append, raising=False)
    fresh = spares.SpareFiles()
    monkeypatch.setattr(spares, "SPARES", fresh)
    yield jobs
    fresh.close()


@pytest.mark.usefixtures("on_loop_and_worker")
@pytest.mark.parametrize("how", ["edit", "write"])
async def test_the_replaced_file_is_closed_after_the_write_by_a_later_job(
    tmp_path: Path, later: list[Callable[[], object]], how: str
) -> None:
    fs = WorkspaceAgentFileSystem(tmp_path / "store")
    await fs.write("a.md", "old text")
    target = tmp_path / "store" / "a.md"
    for job in later:
        job()
    later.clear()
    if how == "edit":
        assert await fs.edit("a.md", "old", "new") == 1
    else:
        await fs.write("a.md", "new text")
    assert target.read_bytes() == b"new text"
    assert open_on(target) == [f"{target} (deleted)"], "the old file is still open, replaced"
    for job in later:
        job()
    assert open_on(target) == [], "closed by the job left for a worker"
    assert await fs.read("a.md") == "new text"


@pytest.mark.usefixtures("on_loop_and_worker")
async def test_a_write_that_fails_closes_the_old_file_at_once(
    tmp_path: Path, later: list[Callable[[], object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = WorkspaceAgentFileSystem(tmp_path / "store")
    await fs.write("a.md", "old text")
    target = tmp_path / "store" / "a.md"

    def full(source: str, destination: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(FileSystemError, match="No space left on device"):
        await fs.edit("a.md", "old", "new")
    with pytest.raises(FileSystemError, match="No space left on device"):
        await fs.write("a.md", "newer text")
    monkeypatch.undo()
    assert open_on(target) == [], "nothing was replaced: nothing is held"
    assert tree(tmp_path / "store") == {"a.md": b"old text"}


async def test_an_edit_that_changes_nothing_holds_nothing(
    tmp_path: Path, later: list[Callable[[], object]]
) -> None:
    fs = WorkspaceAgentFileSystem(tmp_path / "store")
    await fs.write("a.md", "same")
    assert await fs.edit("a.md", "same", "same") == 1
    with pytest.raises(FileSystemError, match="old_text not found"):
        await fs.edit("a.md", "other", "x")
    assert open_on(tmp_path / "store" / "a.md") == []


def test_a_forked_child_closes_the_retired_descriptors_it_inherited(tmp_path: Path) -> None:
    pool = spares.SpareFiles()
    path = tmp_path / "held"
    path.write_text("x")
    jobs: list[Callable[[], object]] = []
    original = spares.SPARES
    spares.SPARES = pool
    try:
        pool.retire(os.open(path, os.O_RDONLY), jobs.append)
        assert pool.retired() == 1
        assert len(jobs) == 1
        pid = os.fork()
        if pid == 0:  # the child: its copy of the descriptor is closed, its pool empty
            fresh = spares.SPARES is not pool and open_on(path) == []
            os._exit(0 if fresh else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert open_on(path) == [str(path)], "the parent's is untouched"
    finally:
        spares.SPARES = original
        pool.close()
    assert open_on(path) == []


# --- workers.later ---------------------------------------------------------------------


@pytest.fixture
def fresh_later(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A fresh `LATER` whose worker-job submissions are counted."""
    monkeypatch.setattr(workers, "LATER", workers.Later())
    submitted: list[int] = []
    real = workers.POOL.submit

    def counted(fn: Callable[..., object], /, *args: object) -> None:
        submitted.append(1)
        real(fn, *args)

    monkeypatch.setattr(workers.POOL, "submit", counted)
    return submitted


async def wait_for(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def test_jobs_asked_from_the_loop_run_in_one_worker_job_after_it(
    fresh_later: list[int],
) -> None:
    ran: list[tuple[int, int]] = []
    for n in range(5):
        workers.later(lambda n=n: ran.append((n, threading.get_ident())))
    assert ran == [], "nothing runs inside the operation that asked"
    await wait_for(lambda: len(ran) == 5)
    assert [n for n, _ in ran] == [0, 1, 2, 3, 4]
    assert threading.get_ident() not in {thread for _, thread in ran}
    assert fresh_later == [1], "one worker job (one wake-up) for the batch"


async def test_a_job_asked_while_a_batch_runs_joins_it_without_another_wake_up(
    fresh_later: list[int],
) -> None:
    begun, gate = threading.Event(), threading.Event()
    ran: list[tuple[str, int]] = []

    def long_job() -> None:  # a refill waiting for the loop to pause, say
        begun.set()
        gate.wait(5)
        ran.append(("first", threading.get_ident()))

    workers.later(long_job)
    await wait_for(begun.is_set)
    workers.later(lambda: ran.append(("joined", threading.get_ident())))
    await workers.run(lambda: None)  # another worker's job ends meanwhile: it leaves it there
    await asyncio.sleep(workers.LATER_SECONDS * 5)
    assert ran == [], "it waits for the running batch"
    gate.set()
    await wait_for(lambda: len(ran) == 2)
    assert [name for name, _ in ran] == ["first", "joined"]
    assert len({thread for _, thread in ran}) == 1, "run by the same worker job"
    assert fresh_later == [1], "no timer and no second wake-up of a worker"


async def test_a_job_asked_from_a_worker_runs_there_once_the_caller_has_its_result() -> None:
    pool = WorkerPool(1)
    gate = threading.Event()
    seen: list[tuple[bool, int]] = []

    def operation() -> int:
        workers.later(lambda: seen.append((gate.wait(5), threading.get_ident())))
        return threading.get_ident()

    worker = await asyncio.wait_for(pool.run(operation), 2)
    gate.set()  # the job waits for this: had it run before the result, the caller would not be here
    await wait_for(lambda: bool(seen))
    assert seen == [(True, worker)]


def test_jobs_left_by_a_loop_that_closed_run_with_the_next_worker_job(
    fresh_later: list[int],
) -> None:
    ran: list[int] = []

    async def ask() -> None:
        workers.later(lambda: ran.append(1))

    asyncio.run(ask())  # the loop closes at once: its timer may never fire
    asyncio.run(workers.run(lambda: None))
    for _ in range(500):
        if ran:
            break
        time.sleep(0.01)
    assert ran == [1]


def test_a_job_asked_outside_any_loop_or_worker_goes_to_a_worker(
    fresh_later: list[int],
) -> None:
    ran = threading.Event()
    workers.later(ran.set)
    assert ran.wait(5)
    assert fresh_later == [1]


async def test_background_work_waits_while_a_worker_runs_an_operation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers, "ON_LOOP", workers.LoopBudget())
    gate = threading.Event()
    running = asyncio.ensure_future(workers.run(gate.wait, 5))
    await wait_for(lambda: workers.POOL.running == 1)
    assert not workers.wait_for_idle(time.monotonic() + 0.05), "a grep or a batch is running"
    gate.set()
    assert await running is True
    assert workers.POOL.running == 0
    assert workers.wait_for_idle(time.monotonic() + 0.05)
