"""Usage accounting: how many files and bytes each store holds, and the bounds check on them.

The seam is `WorkspaceUsage`: it hands a store its `UsageLedger`, one per store directory, shared
by every `WorkspaceAgentFileSystem` (and, for another implementation, every process or replica)
that uses that directory. A workspace mutation goes:

    with ledger.hold():                      # one mutation of the store at a time
        ...  # recount from the disk if the ledger is unknown or the disk changed behind it
        blocked = ledger.reserve(files, bytes, limits)   # check-and-add, one atomic step
        ...  # write; on failure ledger.adjust(-files, -bytes)

`reserve` never reads-then-writes across a gap another writer could use: the check and the
addition are one step, so no two writers can pass a bound together even where `hold()` is only
advisory. A rejected reservation changes nothing and returns the figures that stood in the way
(the workspace turns them into the model-facing message).

Two implementations:

- `SharedVolumeWorkspaceUsage`, the default (`PROCESS_USAGE`): exact across every process that
  shares the workspace root (N uvicorn workers, replicas on one volume). `hold()` is a
  `threading.Lock` plus an `flock` on `.{store}.lock` beside the store directory; the figures
  stay in memory, and the lock file records which ledger held it last, so a ledger that finds
  another's mark drops its figures and the store recounts from the disk (under the lock, so the
  count is exact) before reserving. A process that writes alone never recounts. A store in use
  also holds a shared lease (`.{store}.live`), which the conversation cap's `retire` must take
  exclusively before removing the store: a store any process uses is never evicted. It costs
  one `flock` pair and an 8-byte `pread` per mutation over the in-process ledger (measured in
  `docs/filesystem.md`).
- `InProcessWorkspaceUsage`: a `threading.Lock` per store and its figures in memory, exact for
  one process only (the behaviour before the shared volume); for embedding, tests, or a root no
  other process touches.

Both also offer `try_hold()` and `release()`: the hold taken only if that needs no wait (the
thread lock free, the `flock` granted at once, the lease already claimed), which lets the store
run a small change on the event loop and send it to a worker thread when the store is busy
(`WorkspaceAgentFileSystem`). They are optional: a ledger without them always gets the worker.

A PostgreSQL implementation would make `hold()` a transaction-scoped advisory lock and
`reserve()` one conditional `UPDATE ... SET files = files + $1, bytes = bytes + $2 WHERE ... <=
$max RETURNING ...`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from .._filelocks import Lease, LockFile, leased, retire
from .base import FileSystemLimits


@dataclass(frozen=True, slots=True)
class StoreUsage:
    """How much of its bounds a store uses."""

    files: int
    bytes: int


class UsageLedger(Protocol):
    """The file count and byte total of one store."""

    def hold(self) -> AbstractContextManager[object]:
        """Exclusive use of the store for one mutation (a write, edit, delete, rename or recount);
        not reentrant. Also marks the store as in use (see `claim`). On entry the figures may
        have been dropped (`current()` is `None`) when another process changed the store."""
        ...

    def claim(self) -> bool:
        """Mark the store as in use by this process if it was ever written through a ledger (a
        read creates nothing: no lease file, no directory). True once marked: the caller need
        not call again while it keeps the ledger. Called in a worker thread; may wait for an
        eviction of the store that is under way."""
        ...

    def current(self) -> StoreUsage | None:
        """The figures, or `None` when nobody has counted the store yet (or they were dropped)."""
        ...

    def recount(self, usage: StoreUsage | None) -> None:
        """Replace the figures with a fresh count of the store; `None` drops them, so the next
        mutation counts again."""
        ...

    def reserve(self, files: int, bytes: int, limits: FileSystemLimits) -> StoreUsage | None:
        """Add a change of `files` files and `bytes` bytes unless the result breaks a bound, as one
        atomic step. Returns `None` when it was added; otherwise the unchanged figures that stand
        in the way.

        Refused: a change adding files when the count would pass `limits.max_files`, and any
        change that would leave the total over `limits.max_total_bytes` (even a shrinking one: a
        store pushed over its bounds from outside takes no write until it is back under).
        Raises `LookupError` while the ledger has no figures (`current()` is `None`).
        """
        ...

    def adjust(self, files: int, bytes: int) -> None:
        """Add a change unconditionally: a delete, or the release of a reservation whose write
        failed. No-op while the ledger has no figures."""
        ...


class WorkspaceUsage(Protocol):
    """Where stores find their ledgers."""

    def ledger(self, store: str) -> UsageLedger:
        """The ledger of the store directory `store` (a `paths.store_key`). Every caller asking
        for one store shares its state; a caller keeps the ledger as long as it uses the store."""
        ...

    def is_live(self, store: str) -> bool:
        """True while some caller holds the ledger of `store` (in this process, or, for a
        cross-process usage, in any process sharing the volume)."""
        ...

    def retire(self, store: str, remove: Callable[[], object]) -> bool:
        """Call `remove()` (which deletes the store directory) unless the store is live, as one
        step no caller can slip into; returns whether it ran. Never waits for a live store."""
        ...

    def section(self, lock_path: str) -> AbstractContextManager[bool]:
        """A fresh exclusive section for bookkeeping over many stores (the conversation cap),
        named by a lock file. Entering it yields True when another holder (another process, or
        another section object) may have changed what it guards since this one last held it,
        so the caller must count again. Keep the object: each one remembers its last hold."""
        ...


class Figures:
    """A ledger's file count and byte total in memory, behind a lock of their own.

    `reserve` and `adjust` hold `_lock` for a few arithmetic operations only, so they are atomic
    even for a caller that skips `hold()`.
    """

    __slots__ = ("__weakref__", "_bytes", "_files", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files = -1  # -1: not counted
        self._bytes = 0

    def current(self) -> StoreUsage | None:
        with self._lock:
            return None if self._files < 0 else StoreUsage(self._files, self._bytes)

    def recount(self, usage: StoreUsage | None) -> None:
        with self._lock:
            if usage is None:
                self._files, self._bytes = -1, 0
            else:
                self._files, self._bytes = usage.files, usage.bytes

    def reserve(self, files: int, bytes: int, limits: FileSystemLimits) -> StoreUsage | None:
        with self._lock:
            now_files, now_bytes = self._files, self._bytes
            if now_files < 0:
                raise LookupError("the store must be counted before a reservation")
            if (files > 0 and now_files + files > limits.max_files) or (
                now_bytes + bytes > limits.max_total_bytes
            ):
                return StoreUsage(now_files, now_bytes)
            self._files = now_files + files
            self._bytes = now_bytes + bytes
            return None

    def adjust(self, files: int, bytes: int) -> None:
        with self._lock:
            if self._files >= 0:
                self._files = max(0, self._files + files)
                self._bytes = max(0, self._bytes + bytes)


class InProcessLedger(Figures):
    """`UsageLedger` for one process: a mutation lock, and the figures in memory."""

    __slots__ = ("_hold",)

    def __init__(self) -> None:
        super().__init__()
        self._hold = threading.Lock()

    def __repr__(self) -> str:
        return f"InProcessLedger({self.current()!r})"

    def hold(self) -> threading.Lock:
        return self._hold

    def try_hold(self) -> bool:
        """Take `hold()` if it is free now (never waits); True when taken: `release()` it."""
        return self._hold.acquire(blocking=False)

    def release(self) -> None:
        self._hold.release()

    def claim(self) -> bool:
        return True


class InProcessWorkspaceUsage:
    """`WorkspaceUsage` for one process: one `InProcessLedger` per store directory, held weakly.

    A ledger lives while some store instance keeps it; when the last one goes, its figures go
    too, and the next instance on that directory counts it again from the disk.
    """

    def __init__(self) -> None:
        self._ledgers: weakref.WeakValueDictionary[str, InProcessLedger] = (
            weakref.WeakValueDictionary()
        )
        self._lock = threading.Lock()

    def ledger(self, store: str) -> InProcessLedger:
        with self._lock:
            found = self._ledgers.get(store)
            if found is None:
                found = InProcessLedger()
                self._ledgers[store] = found
            return found

    def is_live(self, store: str) -> bool:
        with self._lock:
            return store in self._ledgers

    def retire(self, store: str, remove: Callable[[], object]) -> bool:
        if self.is_live(store):
            return False
        remove()
        return True

    def section(self, lock_path: str) -> AbstractContextManager[bool]:
        return contextlib.nullcontext(False)


def lock_path(store: str) -> str:
    """The mutation lock of a store: `.{name}.lock` beside its directory (a hidden file, so a
    listing of conversation directories never sees it; conversation ids never start with a
    dot)."""
    parent, name = os.path.split(store)
    return os.path.join(parent, f".{name}.lock")


def lease_path(store: str) -> str:
    """The in-use lease of a store: `.{name}.live` beside its directory."""
    parent, name = os.path.split(store)
    return os.path.join(parent, f".{name}.live")


class SharedVolumeLedger(Figures):
    """`UsageLedger` exact across processes: the in-process figures, kept only while no other
    ledger (of any process) held the store's lock file since this one did.

    `hold()` claims the store's lease, takes the lock file, and drops the figures when the lock
    file carries another holder's mark; the store then recounts under the lock.
    """

    __slots__ = ("_lease", "_lock_file", "_store")

    def __init__(self, store: str) -> None:
        super().__init__()
        self._store = store
        self._lock_file = LockFile(lock_path(store))
        self._lease = Lease(lease_path(store))

    def __repr__(self) -> str:
        return f"SharedVolumeLedger({self._store!r}, {self.current()!r})"

    def hold(self) -> SharedVolumeLedger:
        return self

    def __enter__(self) -> SharedVolumeLedger:
        if not self._lease.held:
            self._lease.claim(create=True)
        if self._lock_file.__enter__():
            self.recount(None)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock_file.__exit__(kind, value, traceback)

    def try_hold(self) -> bool:
        """Take `hold()` if that needs no wait: the lease already claimed and the lock file free
        in this process and every other. True when taken (the figures dropped, as `hold()`
        does, if another ledger held it since): `release()` it."""
        if not self._lease.held:
            return False
        foreign = self._lock_file.try_enter()
        if foreign is None:
            return False
        if foreign:
            self.recount(None)
        return True

    def release(self) -> None:
        self._lock_file.__exit__(None, None, None)

    def claim(self) -> bool:
        if self._lease.held:
            return True
        try:
            return self._lease.claim(create=False)
        except OSError:  # unreadable lease: read on without one
            return True


class SharedVolumeWorkspaceUsage:
    """The default `WorkspaceUsage`: one `SharedVolumeLedger` per store directory in this
    process (held weakly, like `InProcessWorkspaceUsage`), coordinated with every other process
    on the volume through the stores' lock and lease files."""

    def __init__(self) -> None:
        self._ledgers: weakref.WeakValueDictionary[str, SharedVolumeLedger] = (
            weakref.WeakValueDictionary()
        )
        self._lock = threading.Lock()

    def ledger(self, store: str) -> SharedVolumeLedger:
        with self._lock:
            found = self._ledgers.get(store)
            if found is None:
                found = SharedVolumeLedger(store)
                self._ledgers[store] = found
            return found

    def is_live(self, store: str) -> bool:
        with self._lock:
            if store in self._ledgers:
                return True
        return leased(lease_path(store))

    def retire(self, store: str, remove: Callable[[], object]) -> bool:
        with self._lock:
            if store in self._ledgers:  # live here (the lease may not be claimed yet)
                return False
        return retire(lease_path(store), remove, lock_path(store))

    def section(self, lock_path: str) -> LockFile:
        return LockFile(lock_path)


PROCESS_USAGE: WorkspaceUsage = SharedVolumeWorkspaceUsage()
"""The usage every store and provider shares unless given its own (`usage=`)."""
