"""The usage-accounting seam: the in-process ledger on its own, and the workspace through it."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from atmosphere_harness import FileSystemLimits, WorkspaceAgentFileSystem
from atmosphere_harness._errors import FileSystemError
from atmosphere_harness._filesystem import (
    AgentFileSystemProvider,
    InProcessWorkspaceUsage,
    StoreUsage,
    UsageLedger,
    WorkspaceUsage,
    spares,
)
from atmosphere_harness._filesystem import workspace as workspace_module
from atmosphere_harness._filesystem.paths import store_key
from atmosphere_harness._filesystem.tally import DiskTally
from atmosphere_harness._filesystem.usage import (
    PROCESS_USAGE,
    InProcessLedger,
    SharedVolumeLedger,
    SharedVolumeWorkspaceUsage,
)
from tests.fs_support import rejects, tree

pytestmark = pytest.mark.usefixtures("on_loop_and_worker")


LIMITS = FileSystemLimits(max_files=10, max_total_bytes=1000)


def counted(files: int = 0, size: int = 0) -> InProcessLedger:
    ledger = InProcessLedger()
    ledger.recount(StoreUsage(files, size))
    return ledger


def on_disk(root: Path) -> StoreUsage:
    """What a fresh walk of the store counts (the truth the ledger must match)."""
    return DiskTally().rebuild(os.path.realpath(root))


# --- the in-process ledger ------------------------------------------------------------------


def test_a_reservation_within_the_bounds_is_added() -> None:
    ledger = counted(3, 300)
    assert ledger.reserve(1, 50, LIMITS) is None
    assert ledger.reserve(0, -20, LIMITS) is None  # an overwrite that shrinks a file
    assert ledger.current() == StoreUsage(4, 330)


@pytest.mark.parametrize(
    ("files", "size", "change"),
    [
        (10, 100, (1, 1)),  # one file too many
        (2, 990, (0, 11)),  # eleven bytes too many, no new file
        (2, 990, (1, 11)),
        (2, 1200, (0, -50)),  # over the total from outside: even a shrink waits
    ],
)
def test_a_refused_reservation_changes_nothing_and_says_what_stood_in_the_way(
    files: int, size: int, change: tuple[int, int]
) -> None:
    ledger = counted(files, size)
    assert ledger.reserve(*change, LIMITS) == StoreUsage(files, size)
    assert ledger.current() == StoreUsage(files, size)


def test_the_count_bound_only_stops_new_files() -> None:
    ledger = counted(12, 100)  # over the count from outside
    assert ledger.reserve(0, 10, LIMITS) is None  # overwriting an existing file is fine
    assert ledger.reserve(1, 10, LIMITS) == StoreUsage(12, 110)


def test_an_uncounted_ledger_takes_no_reservation_and_ignores_adjustments() -> None:
    ledger = InProcessLedger()
    assert ledger.current() is None
    with pytest.raises(LookupError):
        ledger.reserve(1, 1, LIMITS)
    ledger.adjust(-1, -10)
    assert ledger.current() is None
    ledger.recount(StoreUsage(2, 20))
    ledger.adjust(-5, -50)  # never below zero
    assert ledger.current() == StoreUsage(0, 0)
    ledger.recount(None)
    assert ledger.current() is None


def test_concurrent_reservations_stop_exactly_at_the_count_bound() -> None:
    ledger = counted()
    start = threading.Barrier(16)
    granted: list[int] = []

    def reserver() -> None:
        start.wait()
        for _ in range(200):
            if ledger.reserve(1, 1, LIMITS) is None:
                granted.append(1)

    threads = [threading.Thread(target=reserver) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(granted) == LIMITS.max_files
    assert ledger.current() == StoreUsage(LIMITS.max_files, LIMITS.max_files)


def test_concurrent_reservations_and_releases_never_pass_the_total() -> None:
    ledger = counted()
    limits = FileSystemLimits(max_files=10**6, max_total_bytes=1000)
    start = threading.Barrier(8)
    peaks: list[int] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        held = 0
        start.wait()
        for _ in range(2000):
            size = rng.randint(1, 97)
            if ledger.reserve(0, size, limits) is None:
                held += size
                now = ledger.current()
                assert now is not None
                peaks.append(now.bytes)
            if held and rng.random() < 0.5:
                ledger.adjust(0, -held)
                held = 0
        ledger.adjust(0, -held)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(peaks) <= 1000
    assert ledger.current() == StoreUsage(0, 0), "every reservation was released exactly"


def test_ledgers_are_shared_per_store_and_live_while_held(tmp_path: Path) -> None:
    usage = InProcessWorkspaceUsage()
    key = store_key(tmp_path / "s")
    first, second = usage.ledger(key), usage.ledger(key)
    assert first is second
    assert usage.ledger(store_key(tmp_path / "other")) is not first
    assert InProcessWorkspaceUsage().ledger(key) is not first, "usages share nothing"
    assert usage.is_live(key)
    del first, second
    gc.collect()
    assert not usage.is_live(key)


def test_the_usage_classes_satisfy_the_protocols() -> None:
    usage: WorkspaceUsage = InProcessWorkspaceUsage()
    ledger: UsageLedger = usage.ledger("/somewhere")
    assert isinstance(ledger, InProcessLedger)
    shared: WorkspaceUsage = SharedVolumeWorkspaceUsage()
    shared_ledger: UsageLedger = shared.ledger("/somewhere")
    assert isinstance(shared_ledger, SharedVolumeLedger)
    assert isinstance(PROCESS_USAGE, SharedVolumeWorkspaceUsage), "exact across processes"


# --- the workspace through the seam ---------------------------------------------------------


def test_stores_take_their_ledger_from_their_usage(tmp_path: Path) -> None:
    usage = InProcessWorkspaceUsage()
    mine = WorkspaceAgentFileSystem(tmp_path / "s", usage=usage)
    also_mine = WorkspaceAgentFileSystem(tmp_path / "s", usage=usage)
    default = WorkspaceAgentFileSystem(tmp_path / "s")
    assert mine._ledger is also_mine._ledger
    assert mine._ledger is not default._ledger
    assert usage.is_live(store_key(tmp_path / "s"))
    assert workspace_module.is_live(tmp_path / "s")  # the default usage sees `default`
    assert workspace_module.is_live(tmp_path / "s", usage)


async def test_a_rejected_write_leaves_the_usage_unchanged(tmp_path: Path) -> None:
    limits = FileSystemLimits(max_file_bytes=100, max_files=2, max_total_bytes=150)
    store = WorkspaceAgentFileSystem(tmp_path / "s", limits, usage=InProcessWorkspaceUsage())
    await store.write("a.md", "x" * 60)
    await store.write("b.md", "x" * 59 + "E")
    disk = tree(store.root)
    assert store._ledger.current() == StoreUsage(2, 120)
    for attempt, message in [
        (
            lambda: store.write("c.md", "x"),
            "Write rejected: the store already holds 2 files, at the 2-file limit",
        ),
        (
            lambda: store.write("a.md", "x" * 100),
            "Write rejected: a.md would bring the store to 160 bytes, "
            "over the 150-byte total limit",
        ),
        (
            lambda: store.write("a.md", "x" * 101),
            "Write rejected: a.md would be 101 bytes, over the 100-byte per-file limit",
        ),
        (
            lambda: store.edit("b.md", "E", "E" * 32),
            "Write rejected: b.md would bring the store to 151 bytes, "
            "over the 150-byte total limit",
        ),
    ]:
        with rejects(message):
            await attempt()
        assert store._ledger.current() == StoreUsage(2, 120)
        assert tree(store.root) == disk
    await store.edit("b.md", "E", "E" * 31)  # exactly at the bound
    assert store._ledger.current() == StoreUsage(2, 150) == on_disk(store.root)


async def test_a_write_that_fails_on_disk_releases_its_reservation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = WorkspaceAgentFileSystem(tmp_path / "s", usage=InProcessWorkspaceUsage())
    await store.write("a.md", "old")
    before = store._ledger.current()

    def refused(src: str, dst: str, **options: object) -> None:
        raise FileSystemError("refused by a test")  # not an OSError: the count is kept

    monkeypatch.setattr(workspace_module.os, "replace", refused)
    monkeypatch.setattr(spares.os, "link", refused)  # a new file's spare is linked, not renamed
    with rejects("refused by a test"):
        await store.write("b.md", "new file")
    with rejects("refused by a test"):
        await store.write("a.md", "a longer text")
    monkeypatch.undo()
    assert store._ledger.current() == before == StoreUsage(1, 3)
    assert tree(store.root) == {"a.md": b"old"}


async def test_concurrent_writers_on_instances_sharing_a_usage_hold_the_bounds_exactly(
    tmp_path: Path,
) -> None:
    usage = InProcessWorkspaceUsage()
    limits = FileSystemLimits(max_files=8, max_total_bytes=8 * 300)
    root = tmp_path / "race"
    stores = [WorkspaceAgentFileSystem(root, limits, usage=usage) for _ in range(3)]
    sizes = [random.Random(n).randint(100, 400) for n in range(48)]
    results = await asyncio.gather(
        *(stores[n % 3].write(f"d{n % 4}/f{n:02d}", "z" * size) for n, size in enumerate(sizes)),
        return_exceptions=True,
    )
    assert all(result is None or isinstance(result, FileSystemError) for result in results)
    truth = on_disk(root)
    assert truth.files <= 8
    assert truth.bytes <= 8 * 300
    assert stores[0]._ledger.current() == truth, "the ledger is exact, not merely safe"
    assert sum(result is None for result in results) == truth.files


@pytest.mark.parametrize("seed", [7, 11, 23])
async def test_the_ledger_follows_every_operation_exactly(tmp_path: Path, seed: int) -> None:
    usage = InProcessWorkspaceUsage()
    root = tmp_path / "s"
    limits = FileSystemLimits(max_files=40, max_total_bytes=4000)
    first = WorkspaceAgentFileSystem(root, limits, usage=usage)
    second = WorkspaceAgentFileSystem(root, limits, usage=usage)
    rng = random.Random(seed)
    paths = [f"{d}/{f}" for d in ("a", "b", "a/c") for f in ("x", "y", "z")]
    assert await first.usage() == StoreUsage(0, 0)  # counted (an empty store)
    outcomes: Counter[str] = Counter()
    for step in range(300):
        store = first if rng.random() < 0.5 else second
        path = rng.choice(paths)
        action = rng.choice(["write", "write", "write", "edit", "delete", "rename", "rmdir"])
        try:
            if action == "write":
                await store.write(path, "q" * rng.randint(0, 300))
            elif action == "edit":
                await store.edit(path, "q", "qq" * rng.randint(0, 2), replace_all=True)
            elif action == "delete":
                await store.delete(path)
            elif action == "rename":
                await store.rename(path, rng.choice(paths))
            else:
                await store.delete(rng.choice(["a", "b", "a/c"]))
        except FileSystemError:
            outcomes["refused"] += 1
        else:
            outcomes[action] += 1
        assert first._ledger.current() == on_disk(root), f"step {step}: {action} {path}"
    kinds = {"write", "edit", "delete", "rename", "rmdir", "refused"}
    assert set(outcomes) == kinds, outcomes  # every kind of change happened, and refusals


async def test_an_io_failure_drops_the_figures_and_the_next_writer_recounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = InProcessWorkspaceUsage()
    limits = FileSystemLimits(max_files=2)
    failing = WorkspaceAgentFileSystem(tmp_path / "s", limits, usage=usage)
    other = WorkspaceAgentFileSystem(tmp_path / "s", limits, usage=usage)
    await other.write("a", "x")

    def no_space(*args: object, **options: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(workspace_module.os, "replace", no_space)
    monkeypatch.setattr(workspace_module.os, "link", no_space)  # naming a spare file, too
    with rejects("Failed to write b: No space left on device"):
        await failing.write("b", "x")
    monkeypatch.undo()
    assert other._ledger.current() is None
    await other.write("b", "x")  # `other` trusts its own tally, the ledger asks for a count
    with rejects("Write rejected: the store already holds 2 files, at the 2-file limit"):
        await other.write("c", "x")
    assert other._ledger.current() == StoreUsage(2, 2)


class Refusing:
    """A `WorkspaceUsage` whose ledger refuses every change that adds bytes (a full quota)."""

    def __init__(self) -> None:
        self.inner = InProcessWorkspaceUsage()
        self.calls: list[tuple[str, int, int]] = []

    def ledger(self, store: str) -> UsageLedger:
        return RefusingLedger(self.inner.ledger(store), self.calls)

    def is_live(self, store: str) -> bool:
        return self.inner.is_live(store)

    def retire(self, store: str, remove: Callable[[], object]) -> bool:
        return self.inner.retire(store, remove)

    def section(self, lock_path: str) -> AbstractContextManager[bool]:
        return self.inner.section(lock_path)


class RefusingLedger:
    def __init__(self, inner: InProcessLedger, calls: list[tuple[str, int, int]]) -> None:
        self.inner, self.calls = inner, calls

    def hold(self) -> AbstractContextManager[object]:
        return self.inner.hold()

    def claim(self) -> bool:
        return self.inner.claim()

    def current(self) -> StoreUsage | None:
        return self.inner.current()

    def recount(self, usage: StoreUsage | None) -> None:
        self.inner.recount(usage)

    def reserve(self, files: int, bytes: int, limits: FileSystemLimits) -> StoreUsage | None:
        self.calls.append(("reserve", files, bytes))
        if bytes > 0:
            figures = self.inner.current()
            assert figures is not None
            return figures
        return self.inner.reserve(files, bytes, limits)

    def adjust(self, files: int, bytes: int) -> None:
        self.calls.append(("adjust", files, bytes))
        self.inner.adjust(files, bytes)


async def test_another_usage_implementation_slots_in_through_the_provider(
    tmp_path: Path,
) -> None:
    usage = Refusing()
    provider = AgentFileSystemProvider(tmp_path / "agent", usage=usage)
    fs = provider.workspace("c1")
    await fs.write("empty.md", "")  # adds no bytes: allowed
    with rejects("Write rejected: a.md would bring the store to 1 bytes", prefix=True):
        await fs.write("a.md", "x")
    await fs.delete("empty.md")
    first, *refused, last = usage.calls
    assert first == ("reserve", 1, 0)
    assert refused in ([("reserve", 1, 1)], [("reserve", 1, 1)] * 2)  # recounted, then asked again
    assert last == ("adjust", -1, 0)
    assert usage.is_live(store_key(provider.files_root / "c1"))
    assert not PROCESS_USAGE.is_live(store_key(provider.files_root / "c1"))
