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

`InProcessWorkspaceUsage` is the default: a `threading.Lock` per store and its figures in memory,
for one process. It costs two uncontended lock acquisitions per write. Other implementations slot
in through `WorkspaceAgentFileSystem(usage=...)` / `AgentFileSystemProvider(usage=...)`: for N
processes on one shared volume, `hold()` can be an `fcntl.flock` on a lock file beside the store
and the figures a small ledger file read and rewritten under it; for PostgreSQL, `hold()` a
transaction-scoped advisory lock and `reserve()` one conditional
`UPDATE ... SET files = files + $1, bytes = bytes + $2 WHERE ... <= $max RETURNING ...`.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

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
        not reentrant."""
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
        """True while some caller in this process holds the ledger of `store` (a live store is
        never evicted)."""
        ...


class InProcessLedger:
    """`UsageLedger` for one process: a mutation lock, and the figures behind a second lock.

    `reserve` and `adjust` hold `_lock` for a few arithmetic operations only, so they are atomic
    even for a caller that skips `hold()`.
    """

    __slots__ = ("__weakref__", "_bytes", "_files", "_hold", "_lock")

    def __init__(self) -> None:
        self._hold = threading.Lock()
        self._lock = threading.Lock()
        self._files = -1  # -1: not counted
        self._bytes = 0

    def __repr__(self) -> str:
        return f"InProcessLedger({self.current()!r})"

    def hold(self) -> threading.Lock:
        return self._hold

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


class InProcessWorkspaceUsage:
    """The default `WorkspaceUsage`: one `InProcessLedger` per store directory, held weakly.

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


PROCESS_USAGE = InProcessWorkspaceUsage()
"""The usage every store and provider shares unless given its own (`usage=`)."""
