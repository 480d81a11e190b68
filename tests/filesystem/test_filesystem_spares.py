"""Spare files (`filesystem.spares`): writes (on the event loop or in a worker) fill a nameless
file made ahead of time instead of creating one, with the same results; every refusal of the
system falls back to creating the file, and a failed write leaves the target and the directory
as they were."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import FileSystemError, WorkspaceAgentFileSystem
from atmosphere_harness._filesystem import spares, workers
from atmosphere_harness._filesystem.paths import TEMP_SUFFIX
from atmosphere_harness._filesystem.tally import ORPHAN_SECONDS
from tests.fs_support import Hops, makes_tmpfiles, tree

pytestmark = pytest.mark.skipif(
    not getattr(os, "O_TMPFILE", 0) or not os.path.isdir("/proc/self/fd"),
    reason="spare files need Linux's O_TMPFILE and /proc",
)


@pytest.fixture
def pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> spares.SpareFiles:
    """A fresh pool of spares for the test (closed after it), and no on-loop cool-down."""
    if not makes_tmpfiles(tmp_path):
        pytest.skip(f"the filesystem of {tmp_path} makes no O_TMPFILE files")
    fresh = spares.SpareFiles()
    monkeypatch.setattr(spares, "SPARES", fresh)
    monkeypatch.setattr(workers, "ON_LOOP", workers.LoopBudget(slow=float("inf")))
    yield fresh
    fresh.close()


async def ready(pool: spares.SpareFiles, device: int) -> None:
    """Wait until the background refill made the device's spares."""
    for _ in range(500):
        if pool.ready(device) == pool.per_device:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the spares were never made")


async def named_ready(pool: spares.SpareFiles, fs: WorkspaceAgentFileSystem) -> str:
    """Wait until the store's named spares are made; returns their directory."""
    home = fs._real()
    for _ in range(500):
        if pool.named(home) == spares.NAMED_PER_STORE:
            return f"{home}/{spares.SPARES_DIR}"
        await asyncio.sleep(0.01)
    raise AssertionError("the named spares were never made")


async def started(tmp_path: Path) -> tuple[WorkspaceAgentFileSystem, int]:
    """A store whose first writes (the claim, in a worker; then one on the loop, which asks
    for spares) are done, and its filesystem's device."""
    fs = WorkspaceAgentFileSystem(tmp_path / "store")
    await fs.write("first.md", "one")
    await fs.write("second.md", "two")
    return fs, os.stat(tmp_path / "store").st_dev


async def test_writes_and_edits_on_the_loop_fill_spares_with_the_same_result(
    tmp_path: Path, pool: spares.SpareFiles
) -> None:
    fs, device = await started(tmp_path)
    await ready(pool, device)
    await named_ready(pool, fs)
    await fs.write("notes/a.md", "alpha beta")  # a new directory: made first, then the spare
    await fs.write("second.md", "TWO")  # over an existing file
    assert await fs.edit("notes/a.md", "beta", "gamma") == 1
    assert await fs.write_many([("b.md", "bee"), ("c.md", "sea")]) == [None, None]
    assert pool.used == 5, "every write, the one that had to create its directory too"
    assert pool.named_used == 2, "the two that replaced a file took the store's named spares"
    assert tree(tmp_path / "store") == {
        "first.md": b"one",
        "second.md": b"TWO",
        "notes/a.md": b"alpha gamma",
        "b.md": b"bee",
        "c.md": b"sea",
    }, "no temporary file is left, and every file holds exactly its content"
    mode = os.stat(tmp_path / "store" / "b.md").st_mode & 0o777
    assert mode == 0o666 & ~current_umask(), "the same permissions as a created file"
    assert pool.ready(device) == spares.PER_DEVICE - 3, "a few taken: no refill asked yet"
    quarter = spares.PER_DEVICE // 4
    assert await fs.write_many([(f"m{n}.md", "m") for n in range(quarter - 2)]) == [None] * (
        quarter - 2
    )
    await ready(pool, device)
    assert pool.ready(device) == spares.PER_DEVICE, "a quarter taken: refilled, never past it"
    assert spares.PER_DEVICE * spares.DEVICES <= 300, "descriptors: far under the usual 1024"


async def test_writes_and_edits_in_a_worker_take_spares_too(
    tmp_path: Path, pool: spares.SpareFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, device = await started(tmp_path)
    await ready(pool, device)
    monkeypatch.setattr(workers.ON_LOOP, "allows", lambda: False)  # a cool-down: all hop
    hops = Hops(monkeypatch)
    await fs.write("a.md", "alpha beta")
    assert await fs.edit("a.md", "beta", "gamma") == 1
    await fs.write("second.md", "TWO")
    assert hops.count == 3
    assert pool.used == 3, "the caller waits for a worker's file as for the loop's"
    assert tree(tmp_path / "store") == {
        "first.md": b"one",
        "second.md": b"TWO",
        "a.md": b"alpha gamma",
    }


async def test_a_burst_of_new_files_leaves_the_last_spares_to_the_edits_after_it(
    tmp_path: Path, pool: spares.SpareFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, device = await started(tmp_path)
    await ready(pool, device)
    await named_ready(pool, fs)
    monkeypatch.setattr(workers.POOL, "submit", lambda fn, *args: None)  # no refill from now
    burst = spares.PER_DEVICE - spares.RESERVED + 3
    assert await fs.write_many([(f"new{n}.md", "new") for n in range(burst)]) == [None] * burst
    assert pool.used == spares.PER_DEVICE - spares.RESERVED, "the burst stopped at the reserve"
    assert pool.ready(device) == spares.RESERVED > 0
    for number in range(spares.NAMED_PER_STORE + 2):
        assert await fs.edit(f"new{number}.md", "new", "edited") == 1
    taken = spares.PER_DEVICE - spares.RESERVED + spares.NAMED_PER_STORE + 2
    assert pool.used == taken, "replacing writes take the named ones, then the reserve"
    assert pool.named_used == spares.NAMED_PER_STORE
    assert pool.ready(device) == spares.RESERVED - 2
    for number in range(spares.NAMED_PER_STORE + 2):
        assert (tmp_path / "store" / f"new{number}.md").read_text() == "edited"
    assert len(tree(tmp_path / "store")) == burst + 2, "no temporary file left"


async def test_a_new_file_is_its_spare_linked_under_its_name_and_only_a_replaced_one_is_renamed(
    tmp_path: Path, pool: spares.SpareFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, device = await started(tmp_path)
    await ready(pool, device)
    renames: list[str] = []
    real_replace = os.replace

    def replace(source: str, target: str) -> None:
        renames.append(os.path.basename(target))
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace)
    await fs.write("new.md", "fresh")
    await fs.write("deep/er/new.md", "deeper")
    assert renames == [], "filled while nameless, then named: nothing to rename"
    await fs.write("new.md", "replaced")
    assert await fs.edit("deep/er/new.md", "deeper", "edited") == 1
    assert renames == ["new.md", "new.md"], "a replaced file is renamed over, atomically"
    assert pool.used == 4
    assert tree(tmp_path / "store") == {
        "first.md": b"one",
        "second.md": b"two",
        "new.md": b"replaced",
        "deep/er/new.md": b"edited",
    }


async def test_a_name_taken_behind_the_stores_back_is_replaced_as_usual(
    tmp_path: Path, pool: spares.SpareFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, device = await started(tmp_path)
    await ready(pool, device)
    real_link = spares._link
    target = str(tmp_path / "store" / "race.md")

    def raced(fd: int, path: str) -> None:
        if path == target:  # another program creates the file just before the link
            Path(path).write_text("theirs")
        real_link(fd, path)

    monkeypatch.setattr(spares, "_link", raced)
    await fs.write("race.md", "ours")
    assert pool.used == 1
    assert tree(tmp_path / "store") == {
        "first.md": b"one",
        "second.md": b"two",
        "race.md": b"ours",
    }, "the spare took the temporary name and replaced theirs; no temporary file is left"


def test_a_spare_filled_for_a_missing_directory_is_kept_empty(
    tmp_path: Path, pool: spares.SpareFiles
) -> None:
    small = spares.SpareFiles(per_device=1)
    device = os.stat(tmp_path).st_dev
    try:
        small._refill(device, str(tmp_path))
        assert small.ready(device) == 1
        jobs: list[Any] = []
        home, missing = str(tmp_path), str(tmp_path / "gone" / "a.md")
        with pytest.raises(FileNotFoundError):
            small.place(device, home, missing + ".t", b"first", jobs.append, target=missing)
        assert small.ready(device) == 1, "kept for the write once its directory is made"
        there = str(tmp_path / "b.md")
        assert small.place(device, str(tmp_path), there + ".t", b"two", jobs.append, target=there)
        assert Path(there).read_bytes() == b"two", "emptied and rewound: nothing of the first"
    finally:
        small.close()


async def test_a_system_that_cannot_link_them_falls_back_for_good(
    tmp_path: Path, pool: spares.SpareFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, device = await started(tmp_path)
    await ready(pool, device)
    links: list[str] = []

    def refused(source: str, target: str, **options: Any) -> None:
        links.append(target)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(spares.os, "link", refused)
    await fs.write("a.md", "alpha")
    await fs.write("b.md", "beta")
    assert len(links) == 1, "after the first refusal the device is given up"
    assert pool.used == 0
    assert pool.ready(device) == 0, "its spares are closed"
    assert tree(tmp_path / "store") == {
        "first.md": b"one",
        "second.md": b"two",
        "a.md": b"alpha",
        "b.md": b"beta",
    }


async def test_a_failed_write_into_a_spare_leaves_everything_as_it_was(
    tmp_path: Path, pool: spares.SpareFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, device = await started(tmp_path)
    await ready(pool, device)
    real_write = os.write

    def full_disk(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spares.os, "write", full_disk)
    with pytest.raises(FileSystemError, match="No space left on device"):
        await fs.write("second.md", "a longer second version")
    monkeypatch.setattr(spares.os, "write", real_write)
    assert tree(tmp_path / "store") == {"first.md": b"one", "second.md": b"two"}
    await fs.write("third.md", "three")
    assert (await fs.usage()).bytes == len("one" + "two" + "three"), "the reservation was undone"


async def test_without_spares_ready_a_write_creates_its_file(
    tmp_path: Path, pool: spares.SpareFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No refill ever: background work is never asked for (patching `POOL.submit` was not
    # enough: a batch of `later` jobs still running from an earlier test takes a new job
    # without a submit, and made this test's spares).
    monkeypatch.setattr(workers, "later", lambda job: None)
    fs, _ = await started(tmp_path)
    await fs.write("a.md", "alpha")
    assert pool.used == 0
    assert tree(tmp_path / "store") == {"first.md": b"one", "second.md": b"two", "a.md": b"alpha"}


def test_a_refill_stops_at_the_bound_and_on_a_filesystem_without_tmpfiles(
    tmp_path: Path, pool: spares.SpareFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = spares.SpareFiles(per_device=2)
    device = os.stat(tmp_path).st_dev
    try:
        pool._refill(device, str(tmp_path))
        pool._refill(device, str(tmp_path))
        assert pool.ready(device) == 2
        assert os.listdir(tmp_path) == [], "spares have no name"

        real_open = os.open

        def no_tmpfile(path: str, flags: int, *args: Any) -> int:
            if flags & spares._TMPFILE == spares._TMPFILE:
                raise OSError(errno.EOPNOTSUPP, "Operation not supported")
            return real_open(path, flags, *args)

        other = device + 1
        monkeypatch.setattr(spares.os, "open", no_tmpfile)
        pool._refill(other, str(tmp_path))
        assert pool.ready(other) == 0
        jobs: list[Any] = []
        assert not pool.place(other, str(tmp_path), str(tmp_path / "x"), b"x", jobs.append)
        assert len(jobs) == 1, "only the store's named spares are asked for"
        jobs.pop()()  # (none: the directory has no `SPARES_DIR`, which marks it)
        assert not pool.place(other, str(tmp_path), str(tmp_path / "x"), b"x", jobs.append)
        assert jobs == [], "a device given up asks for no refill, nor a store without the dir"
    finally:
        pool.close()
    assert pool.ready(device) == 0


async def test_background_work_that_fails_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def fails() -> None:
        loop.call_soon_threadsafe(done.set)
        raise RuntimeError("boom")

    workers.POOL.submit(fails)
    await asyncio.wait_for(done.wait(), 10)
    for _ in range(200):
        if "background workspace work failed" in caplog.text:
            break
        await asyncio.sleep(0.01)
    assert "background workspace work failed" in caplog.text
    assert "boom" in caplog.text


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_child_forked_while_the_pool_is_locked_starts_with_its_own(
    tmp_path: Path, pool: spares.SpareFiles
) -> None:
    device = os.stat(tmp_path).st_dev
    pool._refill(device, str(tmp_path))
    with pool._lock:  # as a worker thread of the parent may hold it at the fork
        pid = os.fork()
        if pid == 0:  # the child: its spares are its own, and its lock is free
            fresh = spares.SPARES is not pool and spares.SPARES.ready(device) == 0
            os._exit(0 if fresh else 1)
    for _ in range(1000):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child hung on the parent's lock")
    assert os.waitstatus_to_exitcode(status) == 0
    assert pool.ready(device) == spares.PER_DEVICE, "the parent's spares are untouched"


class Busy(workers.LoopBudget):
    """A budget whose event loop never pauses (or always does)."""

    def __init__(self, busy: bool) -> None:
        super().__init__()
        self.always = busy

    def busy(self, within: float = workers.IDLE_SECONDS) -> bool:
        return self.always


def test_spares_are_made_only_while_the_loop_pauses(
    tmp_path: Path, pool: spares.SpareFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = os.stat(tmp_path).st_dev
    monkeypatch.setattr(workers, "IDLE_WAIT_SECONDS", 0.05)
    monkeypatch.setattr(workers, "ON_LOOP", Busy(True))
    started = time.monotonic()
    pool._refilling.add(device)  # as `place` marks it when it asks for the refill
    pool._refill(device, str(tmp_path))
    assert pool.ready(device) == pool.per_device // 4, "a loop that never paused: a quarter"
    assert device not in pool._refilling, "the next write asks again"
    assert time.monotonic() - started >= 0.05, "it waited for a pause, without the GIL"
    monkeypatch.setattr(workers, "ON_LOOP", Busy(False))
    pool._refill(device, str(tmp_path))
    assert pool.ready(device) == pool.per_device


def test_a_loop_is_busy_for_a_moment_after_each_small_operation() -> None:
    now = [100.0]
    budget = workers.LoopBudget(clock=lambda: now[0], waited=lambda: 0.0)
    assert not budget.busy()
    budget.spent(budget.start(), "write")
    assert budget.busy()
    now[0] += workers.IDLE_SECONDS * 1.5
    assert not budget.busy()


def test_a_loop_is_busy_while_a_small_operation_runs() -> None:
    now = [100.0]
    budget = workers.LoopBudget(slow=1.0, clock=lambda: now[0], waited=lambda: 0.0)
    started = budget.start()  # after a long pause: an edit after a grep, say
    now[0] += workers.IDLE_SECONDS * 1.5
    assert budget.busy(), "background work does not start beside a running operation"
    budget.spent(started, "edit")
    assert budget.busy()
    now[0] += workers.IDLE_SECONDS * 1.5
    assert not budget.busy()


def test_beside_a_running_operation_only_the_first_quarter_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # (and beside a busy loop: the test above)
    small = spares.SpareFiles(per_device=8)
    device = os.stat(tmp_path).st_dev
    monkeypatch.setattr(workers, "IDLE_WAIT_SECONDS", 0.05)
    monkeypatch.setattr(workers, "ON_LOOP", Busy(False))
    monkeypatch.setattr(workers.POOL, "running", 1)  # a grep, say, holds a worker
    try:
        small._refill(device, str(tmp_path))
        assert small.ready(device) == 2, "enough for the next writes, no more beside the grep"
        monkeypatch.setattr(workers.POOL, "running", 0)
        small._refill(device, str(tmp_path))
        assert small.ready(device) == 8
    finally:
        small.close()


async def test_a_replacing_write_renames_a_named_spare_straight_over_its_target(
    tmp_path: Path, pool: spares.SpareFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, _ = await started(tmp_path)
    directory = await named_ready(pool, fs)
    renames: list[tuple[str, str]] = []
    real_replace = os.replace

    def replace(source: str, target: str) -> None:
        renames.append((os.path.dirname(source), os.path.basename(target)))
        real_replace(source, target)

    def no_link(fd: int, path: str) -> None:
        raise AssertionError("a named spare needs no link")

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(spares, "_link", no_link)
    assert await fs.edit("first.md", "one", "uno") == 1
    await fs.write("second.md", "TWO")
    assert renames == [(directory, "first.md"), (directory, "second.md")]
    assert pool.named_used == 2
    assert tree(tmp_path / "store") == {"first.md": b"uno", "second.md": b"TWO"}
    assert [info.path for info in await fs.ls()] == ["first.md", "second.md"]
    assert await fs.glob("**/*") == ["first.md", "second.md"]
    assert [hit.path for hit in await fs.grep("TWO")] == ["second.md"]
    assert (await fs.usage()).files == 2, "the spares are not the store's files"
    await named_ready(pool, fs)  # made again after use
    left = os.listdir(directory)
    assert len(left) == spares.NAMED_PER_STORE
    assert all(os.stat(f"{directory}/{name}").st_size == 0 for name in left)
    with pytest.raises(FileSystemError, match="reserved"):
        await fs.read(f"{spares.SPARES_DIR}/{left[0]}")


async def test_named_spares_removed_behind_the_pools_back_are_dropped(
    tmp_path: Path, pool: spares.SpareFiles
) -> None:
    fs, _ = await started(tmp_path)
    directory = await named_ready(pool, fs)
    for name in os.listdir(directory):
        os.unlink(f"{directory}/{name}")  # (a sweep by another process, a shell)
    assert await fs.edit("first.md", "one", "uno") == 1
    assert pool.named_used == 0, "a removed spare is not used"
    shutil.rmtree(directory)  # the whole directory now (the store's recount makes it again)
    for text in ("TWO", "2", "II"):
        await fs.write("second.md", text)
    assert tree(tmp_path / "store") == {"first.md": b"uno", "second.md": b"II"}
    assert await fs.edit("second.md", "II", "two") == 1
    assert (tmp_path / "store" / "second.md").read_text() == "two"


async def test_a_named_spare_the_system_cannot_rename_there_falls_back_to_creating_the_file(
    tmp_path: Path, pool: spares.SpareFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, _ = await started(tmp_path)
    directory = await named_ready(pool, fs)
    real_replace = os.replace

    taken: list[str] = []

    def replace(source: str, target: str) -> None:
        if os.path.dirname(source) == directory:
            taken.append(source)
            if len(taken) == 1:
                os.unlink(source)  # (a sweep by another process, right after the check)
            else:
                raise OSError(errno.EXDEV, "Invalid cross-device link")  # (a mount inside)
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace)
    assert await fs.edit("first.md", "one", "uno") == 1
    assert await fs.edit("first.md", "uno", "one") == 1
    assert tree(tmp_path / "store") == {"first.md": b"one", "second.md": b"two"}
    assert pool.named_used == len(taken) == 2, "both took a named spare, then created the file"
    assert not any(os.path.exists(path) for path in taken), "the refused spare removed"


def test_a_refill_sweeps_the_named_spares_other_processes_left_and_the_pool_is_bounded(
    tmp_path: Path,
) -> None:
    pool = spares.SpareFiles()
    homes = [tmp_path / f"s{number}" for number in range(spares.NAMED_STORES + 1)]
    for home in homes:
        (home / spares.SPARES_DIR).mkdir(parents=True)
    directory = homes[0] / spares.SPARES_DIR
    stale, fresh = directory / f"1-dead-0{TEMP_SUFFIX}", directory / f"2-live-0{TEMP_SUFFIX}"
    stale.touch()
    fresh.touch()
    old = time.time() - ORPHAN_SECONDS - 5
    os.utime(stale, (old, old))
    try:
        for home in homes:
            pool._make_named(str(home))
        assert not stale.exists(), "a left-over older than the orphan age is removed"
        assert fresh.exists(), "a recent one may be a live process's"
        assert pool.named(str(homes[0])) == 0, "past the bound, the oldest store's are dropped"
        assert sorted(os.listdir(directory)) == [fresh.name], "and their files removed"
        assert all(pool.named(str(home)) == spares.NAMED_PER_STORE for home in homes[1:])
    finally:
        pool.close()
    assert all(os.listdir(home / spares.SPARES_DIR) == [] for home in homes[1:])


async def test_a_store_made_before_this_process_gets_its_spares_directory_at_its_recount(
    tmp_path: Path, pool: spares.SpareFiles
) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "old.md").write_text("old")
    fs = WorkspaceAgentFileSystem(tmp_path / "store")
    await fs.write("new.md", "new")
    assert os.path.isdir(tmp_path / "store" / spares.SPARES_DIR)
    await named_ready(pool, fs)
    assert await fs.edit("old.md", "old", "older") == 1
    assert pool.named_used == 1
    flushed = WorkspaceAgentFileSystem(tmp_path / "durable", fsync=True)
    await flushed.write("a.md", "a")
    assert os.listdir(tmp_path / "durable") == ["a.md"], "a flushing store takes no spares"


async def test_release_leaves_each_store_with_only_its_files_and_writes_go_on(
    tmp_path: Path, pool: spares.SpareFiles
) -> None:
    fs, _ = await started(tmp_path)
    directory = await named_ready(pool, fs)
    assert len(os.listdir(directory)) == spares.NAMED_PER_STORE
    pool.release()
    assert sorted(os.listdir(tmp_path / "store")) == ["first.md", "second.md"]
    assert pool.named(fs._real()) == 0
    await fs.write("first.md", "again")  # a write after the release still works
    assert await fs.edit("second.md", "two", "2") == 1
    assert tree(tmp_path / "store") == {"first.md": b"again", "second.md": b"2"}


def test_named_spares_made_while_a_release_runs_are_not_kept(
    tmp_path: Path, pool: spares.SpareFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "store"
    (home / spares.SPARES_DIR).mkdir(parents=True)
    pool.made_directory(str(home))
    real_open = spares.os.open

    def releasing_meanwhile(*args: Any, **options: Any) -> int:
        fd = real_open(*args, **options)
        if options.get("dir_fd") is not None:  # a named spare was just made: release now
            monkeypatch.setattr(spares.os, "open", real_open)
            pool.release()
        return fd

    monkeypatch.setattr(spares.os, "open", releasing_meanwhile)
    pool._make_named(str(home))
    assert pool.named(str(home)) == 0
    assert os.listdir(home) == [], "the spares and their directory are gone"
