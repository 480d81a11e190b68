"""The cross-process lock primitives (`atmosphere_harness._filelocks`) and the shared-volume usage.

Two lock objects on one file behave like two processes (each has its own open file description
and token), so these run in one interpreter; `test_filesystem_processes.py` runs real ones.
"""

from __future__ import annotations

import fcntl
import gc
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from atmosphere_harness import FileSystemLimits, WorkspaceAgentFileSystem
from atmosphere_harness._filelocks import Lease, LockFile, leased, retire
from atmosphere_harness._filesystem import AgentFileSystemProvider
from atmosphere_harness._filesystem.paths import store_key
from atmosphere_harness._filesystem.usage import (
    SharedVolumeWorkspaceUsage,
    StoreUsage,
    lease_path,
    lock_path,
)
from tests.fs_support import rejects


def exit_code(pid: int, patience: float = 60.0) -> int | None:
    """The child's exit code; a child stuck for `patience` seconds (a deadlock) is killed and
    reported as `None` rather than hanging the suite."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def taken(path: Path) -> bool:
    """Whether someone holds `path` exclusively or shared (a probe from a fresh descriptor)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_hold_says_whether_another_holder_came_between(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "x.lock"
    mine, theirs = LockFile(str(path)), LockFile(str(path))
    with mine as foreign:
        assert foreign, "a first hold knows nothing"
        assert taken(path), "exclusive while held"
    assert not taken(path)
    with mine as foreign:
        assert not foreign, "nobody else held it"
    with theirs as foreign:
        assert foreign
    with mine as foreign:
        assert foreign, "the other holder's mark is seen"


def test_a_shared_hold_excludes_the_exclusive_one_and_leaves_no_mark(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    lock = LockFile(str(path))
    with lock:
        pass
    with lock.shared():
        assert taken(path)
        with lock.shared():  # several at once
            pass
    with lock as foreign:
        assert not foreign


def test_a_lease_blocks_retire_until_released(tmp_path: Path) -> None:
    path = str(tmp_path / "s.live")
    removed: list[str] = []
    lease = Lease(path)
    assert not lease.claim(create=False), "no lease file yet: nothing claimed, nothing made"
    assert not os.path.exists(path)
    assert lease.claim(create=True)
    assert lease.held
    assert leased(path)
    assert not retire(path, lambda: removed.append("s"))
    assert removed == []
    lease.release()
    assert not leased(path)
    other = tmp_path / "s.lock"
    other.touch()
    assert retire(path, lambda: removed.append("s"), str(other))
    assert removed == ["s"]
    assert not os.path.exists(path)
    assert not other.exists(), "the store's lock files go with it"


def test_a_lease_claimed_during_a_retire_holds_the_new_file(tmp_path: Path) -> None:
    path = str(tmp_path / "s.live")
    lease = Lease(path)
    claimer = threading.Thread(target=lease.claim, kwargs={"create": True})

    def remove() -> None:
        claimer.start()  # waits for the retire's exclusive lock, then finds the file gone

    assert retire(path, remove)
    claimer.join()
    assert lease.held
    assert leased(path), "the lease is on the file that the path names now"


def test_a_lease_makes_its_directory_only_when_told_to(tmp_path: Path) -> None:
    lease = Lease(str(tmp_path / "missing" / "s.live"))
    assert not lease.claim(create=False)
    assert not (tmp_path / "missing").exists()
    assert lease.claim(create=True)
    assert (tmp_path / "missing" / "s.live").exists()


async def test_two_usages_on_one_store_keep_one_exact_count(tmp_path: Path) -> None:
    """Two `SharedVolumeWorkspaceUsage`s stand for two processes: each one's writes are seen by
    the other's bounds check."""
    limits = FileSystemLimits(max_files=8, max_total_bytes=10_000)
    first = WorkspaceAgentFileSystem(tmp_path / "s", limits, usage=SharedVolumeWorkspaceUsage())
    second = WorkspaceAgentFileSystem(tmp_path / "s", limits, usage=SharedVolumeWorkspaceUsage())
    for number in range(5):
        await first.write(f"a{number}.md", "x" * 10)
    for number in range(3):
        await second.write(f"b{number}.md", "y" * 10)
    with rejects("Write rejected: the store already holds 8 files, at the 8-file limit"):
        await second.write("b3.md", "y")
    with rejects("Write rejected: the store already holds 8 files, at the 8-file limit"):
        await first.write("a5.md", "x")
    await second.delete("a0.md")
    await first.write("a5.md", "x")
    assert first._ledger.current() == StoreUsage(8, 71)
    assert await second.usage() == StoreUsage(8, 71)


def test_lock_and_lease_files_sit_beside_the_store(tmp_path: Path) -> None:
    store = store_key(tmp_path / "files" / "c1")
    assert lock_path(store) == str(tmp_path / "files" / ".c1.lock")
    assert lease_path(store) == str(tmp_path / "files" / ".c1.live")


async def test_a_store_in_use_is_live_for_other_usages_and_not_retired(tmp_path: Path) -> None:
    mine, theirs = SharedVolumeWorkspaceUsage(), SharedVolumeWorkspaceUsage()
    store = WorkspaceAgentFileSystem(tmp_path / "s", usage=mine)
    key = store_key(tmp_path / "s")
    assert not theirs.is_live(key)
    await store.write("a.md", "x")
    assert theirs.is_live(key), "the lease is visible to another process"
    assert not theirs.retire(key, lambda: pytest.fail("must not remove a store in use"))
    del store
    gc.collect()
    assert not theirs.is_live(key), "the lease goes with the last store object"
    removed: list[str] = []
    assert theirs.retire(key, lambda: removed.append(key))
    assert removed == [key]


async def test_a_read_marks_a_written_store_in_use_and_creates_nothing(
    tmp_path: Path,
) -> None:
    reader = WorkspaceAgentFileSystem(tmp_path / "never", usage=SharedVolumeWorkspaceUsage())
    assert await reader.ls() == []
    assert list(tmp_path.iterdir()) == [], "a read of a store that was never written"
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "a.md").write_text("x")
    plain = WorkspaceAgentFileSystem(tmp_path / "plain", usage=SharedVolumeWorkspaceUsage())
    assert await plain.read("a.md") == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"], "a folder never written"
    writer = WorkspaceAgentFileSystem(tmp_path / "s", usage=SharedVolumeWorkspaceUsage())
    await writer.write("a.md", "x")
    del writer
    gc.collect()
    other = SharedVolumeWorkspaceUsage()
    assert not other.is_live(store_key(tmp_path / "s"))
    store = WorkspaceAgentFileSystem(tmp_path / "s", usage=SharedVolumeWorkspaceUsage())
    assert await store.read("a.md") == "x"
    assert other.is_live(store_key(tmp_path / "s")), "a read of a written store claims it"


async def test_lock_files_of_a_store_that_never_got_a_directory_are_swept(tmp_path: Path) -> None:
    provider = AgentFileSystemProvider(tmp_path / "agent", usage=SharedVolumeWorkspaceUsage())
    ghost = provider.workspace("ghost")
    with rejects("File not found: a.md"):
        await ghost.edit("a.md", "x", "y")
    files = provider.files_root
    assert sorted(p.name for p in files.iterdir()) == [".ghost.live", ".ghost.lock"]
    kept = provider.workspace("kept")
    with rejects("File not found: b.md"):
        await kept.edit("b.md", "x", "y")  # in use: its files stay
    del ghost
    gc.collect()
    await provider.workspace("real").write("a.md", "x")  # the first creation scans
    assert sorted(p.name for p in files.iterdir()) == [
        ".conversations.lock",
        ".kept.live",
        ".kept.lock",
        ".real.live",
        ".real.lock",
        "real",
    ]


def test_a_forked_child_gets_its_own_lock_even_if_a_thread_held_it_at_the_fork(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x.lock"
    lock = LockFile(str(path))
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # the child: the holder thread does not exist here
        code = 1
        try:
            with lock as foreign:  # waits for the parent's flock, never for the stale mutex
                code = 0 if foreign else 2
        finally:
            os._exit(code)
    release.set()
    thread.join()
    assert exit_code(pid) == 0

    with lock as foreign:
        assert foreign, "the child's hold left its own mark"
