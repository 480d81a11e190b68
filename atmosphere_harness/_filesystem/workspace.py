"""`WorkspaceAgentFileSystem`: a bounded file store in one directory on disk.

What it guarantees, whatever the caller does:

- **Containment.** Every path is validated (`paths.check_path`), then resolved one segment at a
  time by `containment.resolve`: a symlink is followed only if its real target stays inside the
  store's real root, for existing and new targets alike. `ls`, `glob` and `grep` never follow
  links, and the usage count ignores them.
- **Bounds before bytes.** Per-file size, file count and total size are checked before a write
  or an edit touches the disk, with Atmosphere's messages; a rejected write changes nothing.
- **Atomic writes.** `atomic.write_atomic`: a temporary file in the target's directory, then
  `os.replace`, so readers (which take no lock) see the old or the new file and a crash never
  leaves a torn one; `fsync=True` also flushes the file and its directory.
- **Exact accounting, across processes.** The store's `UsageLedger` (`usage.py`; by default
  one per directory in the process, shared by every instance on it, and coordinated with other
  processes on the volume by an `flock`) serializes `write`, `edit`, `delete` and `rename` under
  its `hold()` and checks-and-reserves each change's files and bytes in one step, so the bounds
  check is O(1) instead of a walk per write. When another process changed the store since this
  one last held it, the ledger has dropped its figures and the store recounts under the lock
  first. The instance's `DiskTally` (`tally.py`) notices files changed on disk behind every
  store's back (a shell) and recounts by a walk; before rejecting a write the count is always
  redone, so a stale count never causes a wrong rejection. An edit reads, replaces and writes
  under the same hold, so concurrent edits from any number of processes never lose one.
- **Nothing is created by a read.** The root directory appears on the first write; `ls`,
  `read`, `glob` and `grep` of a store that was never written see an empty store.

Blocking work runs in a worker thread (`workers.run`), one hop per operation; a run of
consecutive reads can share one hop (`prefetch`, which the `read_file` tool calls for a
message's consecutive reads), and so can a run of writes (`write_many`, the `write_file` tool's
batch).

**Small operations on the event loop.** A `read`, `write`, `edit` or `write_many` of at most
`workers.ON_LOOP_BYTES` (a file's size, or a batch's total) runs right on the event loop when
nothing in it would wait, because the hop costs more than the operation itself (see
`workers`). It runs the same code as in the worker (the same validation, containment, bounds,
atomic write and messages); what differs is that every step that could wait gives up first and
the whole operation goes to the worker thread instead, having changed nothing:

- the store's hold is taken with `try_hold()`: a thread lock or `flock` held by anyone else (in
  this process or another sharing the volume), or a lease not yet claimed, is a busy store;
- a recount (a walk of the store: after another process changed it, after a change behind its
  back, every `FULL_RESYNC_SECONDS`; the count of a root that does not exist yet walks nothing
  and stays), a check of more than `ON_LOOP_DIRECTORIES` directories' mtimes, a path that deep,
  and the first write of a conversation (the provider's conversation cap) go to the worker;
- a file found larger than the bound (an edit's result too) goes to the worker;
- a store made with `fsync=True` writes and edits in the worker only: its flush waits for the
  disk (0.4 ms to tens of milliseconds), which is exactly what the loop must never do.

A write on the loop fills a temporary file made ahead of time by a worker (`spares`), when one
is ready: creating the file is most of a small write's cost. An operation on the loop returns
without a turn of the event loop, unless the operations run back to back since other tasks last
had one (a hop is one) took more than `workers.SLICE_SECONDS`: then it yields once.

The store's first operation always hops (it claims the store's lease, which may wait for an
eviction; a `private` store has none), and so does every small operation while
`workers.ON_LOOP` is cooling down after one that took longer than `workers.SLOW_SECONDS`. `ls`,
`glob`, `grep`, `delete`, `rename`, `usage` and `prefetch` always hop.
"""

from __future__ import annotations

import enum
import os
import re
import shutil
import stat
import threading
import time
import types
from collections.abc import Callable, Generator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import TypeVar

from .._errors import FileNotFoundInWorkspace, FileSystemError
from . import spares, workers
from .atomic import read_bytes, read_open, write_atomic
from .base import (
    FileInfo,
    FileSystemLimits,
    GrepHit,
    check_file_size,
    check_matches,
    encode_content,
)
from .containment import resolve
from .globbing import compile_glob, literal_prefix
from .paths import (
    TEMP_SUFFIX,
    check_dir,
    check_path,
    conversation_dir_name,
    is_under,
    shown,
    store_key,
)
from .search import Deadline, LinePattern, compile_pattern, grep_hits
from .tally import (
    DIR_CHECK_SECONDS,
    FULL_RESYNC_SECONDS,
    MAX_WALK_ENTRIES,
    ORPHAN_SECONDS,
    DiskTally,
    chain,
    mtime,
    walk,
)
from .usage import PROCESS_USAGE, InProcessLedger, StoreUsage, UsageLedger, WorkspaceUsage

__all__ = [
    "DIR_CHECK_SECONDS",
    "FULL_RESYNC_SECONDS",
    "MAX_WALK_ENTRIES",
    "ORPHAN_SECONDS",
    "TOUCH_SECONDS",
    "StoreUsage",
    "WorkspaceAgentFileSystem",
    "conversation_dir_name",
    "is_live",
    "store_key",
]

T = TypeVar("T")


class _Later(enum.Enum):
    LATER = enum.auto()


_LATER = _Later.LATER
"""`_now`'s answer when the operation must hop instead (it did nothing)."""

TOUCH_SECONDS = 1.0
"""Granularity of the root's mtime as the store's last-write time (the provider's LRU order)."""

PREFETCH_SECONDS = 1.0
"""How long prefetched texts may answer `read` (changes made through the store drop them at
once; this bounds how stale a change made behind the store's back can be)."""
PREFETCH_BYTES = 32 * 1024 * 1024
"""Most bytes one `prefetch` keeps in memory; the files past it are read when asked for."""

ON_LOOP_DIRECTORIES = 16
"""Most directories an operation on the event loop visits: a path deeper than this (a stat of
each directory on it) and, for a change, the tally's periodic check of every directory's mtime
(`DIR_CHECK_SECONDS`) in a store with more directories make the operation hop."""


class _Here(threading.local):
    on_loop = False
    """True while this thread runs a store operation on the event loop."""


_here = _Here()
"""`_here.on_loop`, read as an attribute rather than through a function: each Python call
costs an operation run cold (after a grep) about 1.5 us on a 2-core cloud VM."""


@types.coroutine
def _yield_once() -> Generator[None, None, None]:
    """Let the event loop run other tasks once: `asyncio.sleep(0)` without its wrapper."""
    yield


async def _give_turn() -> None:
    """Yield to the event loop once and note it (`workers.LoopBudget.turned`)."""
    await _yield_once()
    workers.ON_LOOP.turned()


class _Deferred(Exception):
    """Raised by a step of an on-loop operation that would wait or walk, before it changes
    anything: the operation runs in a worker thread instead."""


def is_live(root: str | os.PathLike[str], usage: WorkspaceUsage = PROCESS_USAGE) -> bool:
    """True while some `WorkspaceAgentFileSystem` on `root` (sharing `usage`) exists in this
    process."""
    return usage.is_live(store_key(root))


_HOLD_FLAGS = getattr(os, "O_PATH", os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)) | (
    os.O_NOFOLLOW | os.O_CLOEXEC
)


def _hold(path: str) -> int:
    """A descriptor on the file `path` that a write is about to replace, or -1: holding it
    across the rename leaves the freeing of the old file's blocks to its close, which then
    happens in a worker thread (`WorkspaceAgentFileSystem._store`). `O_PATH`: no read access
    is needed, and opening it can never block (a FIFO put in its place)."""
    try:
        return os.open(path, _HOLD_FLAGS)
    except OSError:
        return -1


def _failed(action: str, echo: str, exc: OSError) -> FileSystemError:
    """An I/O failure as a model-facing message (no host paths in it)."""
    reason = exc.strerror or type(exc).__name__
    return FileSystemError(f"Failed to {action} {echo}: {reason}")


class WorkspaceAgentFileSystem:
    """A bounded `AgentFileSystem` rooted at one directory.

    Example:
        ```python
        fs = WorkspaceAgentFileSystem("/tmp/scratch", FileSystemLimits(max_files=32))
        await fs.write("notes/todo.md", "- ship it\\n")
        ```

    `on_create` is called (in the worker thread, under the store's hold) just before the first
    write creates the root directory; the provider uses it to apply its conversation cap.
    `usage` is where the store finds its ledger (default: the process-wide in-memory one).

    `private=True` is for a store only this instance ever uses and that its owner removes when
    done (a `task` sub-agent's temporary workspace): no other process knows the directory and
    no conversation cap can evict it, so its count is kept in memory (`InProcessLedger`: no lock
    or lease files beside it, no claim before the first operation, which may then run on the
    event loop like any other small one), and it keeps no named spare files (nothing is made
    for later writes that would be removed with it). Containment, the bounds and atomic
    writes are the same. It cannot be given `usage`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        limits: FileSystemLimits | None = None,
        *,
        fsync: bool = False,
        on_create: Callable[[], None] | None = None,
        usage: WorkspaceUsage | None = None,
        private: bool = False,
    ) -> None:
        if private and usage is not None:
            raise ValueError("a private store keeps its own count: it takes no usage")
        self._root = store_key(root)
        self.root = Path(self._root)
        self.limits = limits or FileSystemLimits()
        self.fsync = fsync
        self.private = private
        self._on_create = on_create
        self._ledger: UsageLedger = (
            InProcessLedger() if private else (usage or PROCESS_USAGE).ledger(self._root)
        )
        # A ledger that can take its hold without waiting lets small changes run on the loop.
        self._try_hold: Callable[[], bool] | None = getattr(self._ledger, "try_hold", None)
        self._release: Callable[[], None] | None = getattr(self._ledger, "release", None)
        if self._release is None:
            self._try_hold = None
        self._tally = DiskTally()
        self._real_root: str | None = None
        self._real_parent: str | None = None  # the root's parent's real path (see `_real`)
        self._device: int | None = None  # the root's filesystem (`st_dev`), once known
        self._prefetched: dict[str, str | FileSystemError] = {}
        self._prefetched_at = 0.0
        self._changes = 0  # changes begun through this store (a prefetch spanning one is void)
        # The ledger marks the store in use (see `UsageLedger.claim`); a private one needs not.
        self._claimed = private

    @classmethod
    def for_conversation(
        cls,
        agent_root: str | os.PathLike[str],
        conversation_id: str,
        limits: FileSystemLimits | None = None,
        *,
        fsync: bool = False,
        on_create: Callable[[], None] | None = None,
        usage: WorkspaceUsage | None = None,
    ) -> WorkspaceAgentFileSystem:
        """The store of one conversation: `{agent_root}/files/{conversation_id}/`."""
        name = conversation_dir_name(conversation_id)
        return cls(
            Path(agent_root) / "files" / name,
            limits,
            fsync=fsync,
            on_create=on_create,
            usage=usage,
        )

    def __repr__(self) -> str:
        return f"WorkspaceAgentFileSystem({self._root!r})"

    @property
    def max_grep_hits(self) -> int:
        return self.limits.max_grep_hits

    def exists(self) -> bool:
        """Whether the root directory exists yet (it is created by the first write)."""
        return os.path.isdir(self._root)

    # --- the AgentFileSystem protocol ------------------------------------------------------

    async def ls(self, dir: str | None = None) -> list[FileInfo]:
        rel = check_dir(dir)
        return await self._run("list", dir or ".", self._ls, rel)

    async def read(self, path: str) -> str:
        rel = check_path(path)
        if self._prefetched:
            found = self._take_prefetched(rel)
            if isinstance(found, FileSystemError):
                raise found
            if found is not None:
                return found
        echo = shown(path)
        return await self._run_small("read", echo, 0, rel, self._read, rel, echo)

    async def write(self, path: str, content: str) -> None:
        rel = check_path(path)
        echo = shown(path)
        data = encode_content(content, echo, self.limits)
        self.drop_prefetched()
        await self._run_small(
            "write", echo, len(data), rel, self._locked, self._write, rel, echo, data
        )

    async def edit(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        rel = check_path(path)
        echo = shown(path)
        if not isinstance(old_text, str) or old_text == "":
            raise FileSystemError("old_text must not be empty")
        if not isinstance(new_text, str):
            raise FileSystemError("new_text must be a string")
        self.drop_prefetched()
        return await self._run_small(
            "edit",
            echo,
            0,
            rel,
            self._locked,
            self._edit,
            rel,
            echo,
            old_text,
            new_text,
            replace_all,
        )

    async def glob(self, pattern: str) -> list[str]:
        if not isinstance(pattern, str):
            raise FileSystemError("pattern must not be blank")
        matcher = compile_glob(pattern)
        return await self._run("search", pattern, self._glob, pattern, matcher)

    async def grep(self, pattern: str, dir: str | None = None) -> list[GrepHit]:
        compiled = compile_pattern(pattern)
        rel = check_dir(dir)
        return await self._run("search", dir or ".", self._grep, compiled, rel)

    async def delete(self, path: str) -> None:
        rel = check_path(path)
        echo = shown(path)
        self.drop_prefetched()
        await self._run("delete", echo, self._locked, self._delete, rel, echo)

    async def rename(self, old_path: str, new_path: str) -> None:
        old_rel, new_rel = check_path(old_path), check_path(new_path)
        old_echo, new_echo = shown(old_path), shown(new_path)
        self.drop_prefetched()
        await self._run(
            "rename",
            old_echo,
            self._locked,
            self._rename,
            old_rel,
            old_echo,
            new_rel,
            new_echo,
        )

    # --- beyond the protocol ---------------------------------------------------------------

    async def write_many(self, items: Sequence[tuple[str, str]]) -> list[Exception | None]:
        """`write(path, content)` for each item in order, all in one worker-thread hop; returns
        each write's error (`None` when it wrote), in order.

        Each write is exactly what `write` would have done at its turn: validated, admitted
        against the bounds after the writes before it (under its own hold of the ledger, so
        other processes interleave between writes, never inside one), and written atomically.
        One that fails changes nothing and the others go on, as they would one by one (its
        error is a `FileSystemError`, or whatever else `write` would have raised). The
        `write_file` tool's batch uses it for a message's consecutive writes.
        """
        errors: list[Exception | None] = [None] * len(items)
        wanted: list[tuple[int, str, str, bytes]] = []
        for position, (path, content) in enumerate(items):
            try:
                rel = check_path(path)
                echo = shown(path)
                wanted.append((position, rel, echo, encode_content(content, echo, self.limits)))
            except FileSystemError as exc:
                errors[position] = exc
        if wanted:
            self.drop_prefetched()
            size = sum(len(data) for *_, data in wanted)
            deepest = max(wanted, key=lambda item: item[1].count("/"))[1]
            now = self._now("write", ".", size, deepest, self._write_many, wanted)
            written = [] if now is _LATER else now
            if len(written) < len(wanted):  # the rest (all, or from a busy store on) hop
                written += await self._run("write", ".", self._write_many, wanted[len(written) :])
            elif workers.ON_LOOP.owes_turn():
                await _give_turn()  # as in `_run_small`
            for (position, *_), error in zip(wanted, written, strict=True):
                errors[position] = error
        return errors

    async def prefetch(self, paths: Sequence[str]) -> int:
        """Read `paths` in one worker-thread hop, so that the `read` of each that follows soon
        answers on the event loop without a hop of its own; returns how many were read.

        Each `read` still answers exactly what it would have (the text, or the same error), as
        of the prefetch: a prefetched text is used once, and only within `PREFETCH_SECONDS`;
        any write, edit, delete or rename through this store drops them all first, so a read
        never misses a change made through the store. `drop_prefetched` frees them. Invalid
        paths and files past `PREFETCH_BYTES` are left for `read` to handle.
        """
        wanted: list[tuple[str, str]] = []
        for path in dict.fromkeys(paths):
            try:
                wanted.append((check_path(path), shown(path)))
            except FileSystemError:
                continue
        if not wanted:
            return 0
        changes = self._changes
        read = await self._run("read", ".", self._read_many, wanted)
        if changes != self._changes:
            return 0  # a change began meanwhile: what was read may predate it
        self._prefetched = read
        self._prefetched_at = time.monotonic()
        return len(read)

    def drop_prefetched(self) -> None:
        """Forget what `prefetch` read (the next `read` of those files goes to the disk)."""
        self._prefetched = {}
        self._changes += 1

    def _take_prefetched(self, rel: str) -> str | FileSystemError | None:
        if time.monotonic() - self._prefetched_at > PREFETCH_SECONDS:
            self._prefetched = {}
            return None
        return self._prefetched.pop(rel, None)

    def known_files(self) -> list[str] | None:
        """A private store's files (relative paths, sorted: what `glob("**")` lists) from its own
        count, on the spot: no walk, no hop. `[]` when its root does not exist; the count's
        files when it holds one and none of the store's directories changed since (a `stat` of
        each, at most `ON_LOOP_DIRECTORIES`); else, and for a store that is not private, or one
        a change is running in, `None`: ask `glob`."""
        if not self.private or self._try_hold is None or self._release is None:
            return None
        if not self._try_hold():
            return None  # a change is under way (in a worker thread)
        try:
            tally = self._tally
            if tally.sizes is None:
                return None if os.path.lexists(self._root) else []
            if len(tally.dirs) > ON_LOOP_DIRECTORIES:
                return None
            for directory, stamp in tally.dirs.items():
                if mtime(directory) != stamp:
                    return None  # changed behind the count: the walk says what is there
            return sorted(tally.sizes)
        finally:
            self._release()

    async def usage(self) -> StoreUsage:
        """Files and bytes the store holds now (a fresh walk)."""

        def measure() -> StoreUsage:
            self._sync()
            counted = self._ledger.current()
            assert counted is not None
            return counted

        return await self._run("measure", ".", self._locked, measure)

    # --- machinery -------------------------------------------------------------------------

    async def _run_small(
        self, action: str, echo: str, size: int, rel: str, fn: Callable[..., T], *args: object
    ) -> T:
        """`_run`, or right here on the event loop when that is allowed (see the module
        docstring): `size` is the bytes the operation writes, known before it starts, and `rel`
        the (deepest) path it works on."""
        done = self._now(action, echo, size, rel, fn, *args)
        if done is _LATER:
            return await self._run(action, echo, fn, *args)
        if workers.ON_LOOP.owes_turn():  # a long run of calls lets other tasks in, as hops do
            await _give_turn()
        return done

    def _now(
        self, action: str, echo: str, size: int, rel: str, fn: Callable[..., T], *args: object
    ) -> T | _Later:
        """`fn(*args)` on the event loop, or `_LATER` (nothing done) when it must hop."""
        budget = workers.ON_LOOP
        if (
            not self._claimed
            or (self.fsync and action != "read")  # a flush waits for the disk itself
            or size > workers.ON_LOOP_BYTES
            or rel.count("/") >= ON_LOOP_DIRECTORIES  # a stat per directory on its path
            or not budget.allows()
        ):
            return _LATER
        started = budget.start()
        _here.on_loop = True
        try:
            return fn(*args)
        except _Deferred:
            return _LATER
        except FileSystemError:
            raise
        except OSError as exc:
            raise _failed(action, echo, exc) from None
        finally:
            _here.on_loop = False
            budget.spent(started, action)

    async def _run(self, action: str, echo: str, fn: Callable[..., T], *args: object) -> T:
        try:
            if self._claimed:
                return await workers.run(fn, *args)
            return await workers.run(self._claim_then, fn, *args)
        except FileSystemError:
            raise
        except OSError as exc:
            raise _failed(action, echo, exc) from None

    def _claim_then(self, fn: Callable[..., T], *args: object) -> T:
        """Mark the store in use (its lease, once it exists) before the first operations; a
        first write claims it on its way, which is noted after it."""
        claimed = self._ledger.claim()
        try:
            return fn(*args)
        finally:
            self._claimed = claimed or self._ledger.claim()

    def _locked(self, fn: Callable[..., T], *args: object) -> T:
        if not _here.on_loop:
            with self._ledger.hold():
                return self._changing(fn, *args)
        if self._try_hold is None or self._release is None or not self._try_hold():
            raise _Deferred  # the store is busy: the worker waits for it
        try:
            return self._changing(fn, *args)
        finally:
            self._release()

    def _changing(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)`, a change under the store's hold."""
        try:
            return fn(*args)
        except OSError:
            self._tally.forget()  # the disk may differ from the count now
            self._ledger.recount(None)
            raise

    def _real(self) -> str:
        """The root's real path (symlinks of its ancestors resolved), cached once it exists.

        While the root is missing (a conversation's store before its first write), and when it
        is a directory, that is the real path of the root's parent, resolved until it exists
        and then kept, and the root's name: `os.path.realpath` of the missing root
        would `lstat` every ancestor on each of the first write's calls (35 system calls for a
        store six levels deep). A root that is a symlink is resolved whole."""
        if self._real_root is not None:
            return self._real_root
        try:
            info = os.lstat(self._root)
        except OSError:
            return self._real_beside()  # missing: not kept, the first write makes it
        if stat.S_ISDIR(info.st_mode):
            real = self._real_root = self._real_beside()
            return real
        real = os.path.realpath(self._root)
        if os.path.isdir(real):
            self._real_root = real
        return real

    def _real_beside(self) -> str:
        """The real path of the root's parent (kept once it exists), joined with its name."""
        parent, name = os.path.split(self._root)
        real_parent = self._real_parent
        if real_parent is None:
            real_parent = os.path.realpath(parent)
            if os.path.isdir(real_parent):
                self._real_parent = real_parent
        return os.path.join(real_parent, name)

    def _key(self, real_path: str) -> str:
        return real_path[len(self._real()) + 1 :]

    def _resolve(
        self, rel: str, echo: str, *, follow: bool, mtimes: dict[str, int] | None = None
    ) -> tuple[str, os.stat_result | None]:
        """The real path of `rel` and its `lstat` (`None` when missing), proven to stay inside;
        `mtimes` receives those of the directories on the way (see `containment.resolve`)."""
        return resolve(self._real(), rel, echo, follow=follow, mtimes=mtimes)

    def _chain(self, real_path: str) -> list[str]:
        """The directories from `real_path`'s parent up to the root (those a write changes)."""
        return chain(self._real(), real_path)

    def _sync(self) -> None:
        """Count the store from the disk into the tally and the ledger (under the hold). On the
        event loop only while the root does not exist (nothing to walk: a fresh private store's
        first write)."""
        if _here.on_loop and os.path.lexists(self._real()):
            self._tally.forget()  # `stale` may have moved its clock: the worker walks for sure
            raise _Deferred
        self._make_spares_dir()  # (a store made before this process, or by an older version)
        self._ledger.recount(self._tally.rebuild(self._real()))

    def _trust(self, chain: list[str], seen: dict[str, int] | None = None) -> bool:
        """Make the tally match the disk; True when the store was just counted by a walk.
        `seen`: directory mtimes read under this hold (`_resolve`), not `stat`ed again."""
        tally = self._tally
        if _here.on_loop and len(tally.dirs) > ON_LOOP_DIRECTORIES and tally.all_due():
            raise _Deferred
        if tally.stale(chain, seen):
            self._sync()
            return True
        return False

    def _admit(
        self,
        key: str,
        echo: str,
        new_size: int,
        old_size: int | None,
        chain: list[str],
        seen: dict[str, int] | None = None,
    ) -> tuple[int, int]:
        """Reserve the change of writing `new_size` bytes at `key` in the ledger, or raise if it
        would break a bound. Returns the reserved `(files, bytes)`."""
        fresh = self._trust(chain, seen)
        sizes = self._tally.sizes
        assert sizes is not None
        if not fresh and sizes.get(key) != old_size:
            self._sync()
            fresh = True
        files = 1 if old_size is None else 0
        delta = new_size - (old_size or 0)
        try:
            blocked = self._ledger.reserve(files, delta, self.limits)
        except LookupError:  # the ledger dropped its figures (an I/O failure elsewhere)
            self._sync()
            fresh = True
            blocked = self._ledger.reserve(files, delta, self.limits)
        if blocked is not None and not fresh:
            self._sync()
            blocked = self._ledger.reserve(files, delta, self.limits)
        if blocked is not None:
            raise FileSystemError(self._over(echo, blocked, files, delta))
        return files, delta

    def _over(self, echo: str, usage: StoreUsage, files: int, delta: int) -> str:
        limits = self.limits
        if files > 0 and usage.files + files > limits.max_files:
            return (
                f"Write rejected: the store already holds {usage.files} files, "
                f"at the {limits.max_files}-file limit"
            )
        return (
            f"Write rejected: {echo} would bring the store to {usage.bytes + delta} bytes, "
            f"over the {limits.max_total_bytes}-byte total limit"
        )

    def _make_dirs(self, directory: str, echo: str) -> None:
        root_missing = not os.path.isdir(self._root)
        if self._on_create is not None and root_missing:
            if _here.on_loop:
                raise _Deferred  # the conversation cap may walk and evict other stores
            self._on_create()
        self._tally.made_dirs = True
        try:
            os.makedirs(directory, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise FileSystemError(f"Cannot write {echo}: a parent of it is a file") from None
        if root_missing:
            self._make_spares_dir()

    def _make_spares_dir(self) -> None:
        """Make the root's hidden `spares.SPARES_DIR` (named spares for the writes that replace
        a file), if it is missing and the store writes without flushing. Only with the root
        itself or in a recount: it changes the root's mtime, which the tally then records. A
        private store has none."""
        if not self.fsync and not self.private:
            home = self._real()
            try:
                os.mkdir(f"{home}/{spares.SPARES_DIR}")
            except FileExistsError:
                spares.SPARES.made_directory(home)  # (this process's, from before a release)
            except OSError:
                pass  # the root is not there (nothing is made)
            else:
                spares.SPARES.made_directory(home)

    def _store(
        self,
        target: str,
        data: bytes,
        echo: str,
        reserved: tuple[int, int],
        *,
        new: bool,
        old: int = -1,
        parent_missing: bool = False,
    ) -> None:
        """Write `data` to `target` atomically, releasing the reservation if that fails. `new`:
        the target did not exist when resolved (`parent_missing`: nor did its directory, made
        first). `old`, when not -1, is a descriptor open on the file this write replaces: its
        last close frees that file's blocks (on ext4, as costly as the rest of the write), so
        it is closed in a worker thread after the write (`spares.SpareFiles.retire`), and at
        once if the write failed (nothing was freed)."""
        try:
            write_atomic(
                target,
                data,
                fsync=self.fsync,
                make_parent=lambda parent: self._make_dirs(parent, echo),
                spare=self._spare,
                new=new,
                parent_missing=parent_missing,
            )
        except BaseException as exc:
            if old >= 0:
                os.close(old)
            self._ledger.adjust(-reserved[0], -reserved[1])
            if isinstance(exc, NotADirectoryError):
                raise FileSystemError(f"Cannot write {echo}: a parent of it is a file") from None
            raise
        if old >= 0:
            spares.SPARES.retire(old, workers.later)

    def _spare(self, temp: str, data: bytes, target: str | None) -> str | None:
        """Put `data` in a file made ahead of time (`spares`), if one is ready, named `temp`
        (or `target` itself, for a new file): creating the file is most of a small write's
        cost, on the loop or in a worker. The next ones are made after the write
        (`workers.later`)."""
        device = self._device
        if device is None:
            try:
                device = self._device = os.stat(self._real()).st_dev
            except OSError:
                return None
        return spares.SPARES.place(
            device, self._real(), temp, data, workers.later, target=target, named=not self.private
        )

    def _touch(self, *targets: str) -> None:
        """After this store changed `targets`: record the mtimes of the directories that changed,
        and mark the store as written (the root's mtime, at most once per `TOUCH_SECONDS`)."""
        tally = self._tally
        changed = {target.rsplit("/", 1)[0] for target in targets}
        if tally.made_dirs:
            changed.update(directory for target in targets for directory in self._chain(target))
            tally.made_dirs = False
        now = time.monotonic()
        if now - tally.touched_at > TOUCH_SECONDS:
            try:
                os.utime(self._root)
            except OSError:
                pass
            tally.touched_at = now
            changed.add(self._real())
        tally.settle(changed)

    def _text(self, target: str, info: os.stat_result, echo: str) -> str:
        """The text of the regular file `target`, whose `lstat` is `info`."""
        data, fd = self._open_bytes(target, info, echo)
        os.close(fd)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise FileSystemError(f"Cannot read {echo}: it is not UTF-8 text") from None

    def _open_utf8(self, target: str, info: os.stat_result, echo: str) -> tuple[bytes, int]:
        """The bytes of `_text`, checked to be UTF-8 (not decoded), and the descriptor they
        were read from, still open (the caller closes it)."""
        data, fd = self._open_bytes(target, info, echo)
        if not data.isascii():  # (ASCII is UTF-8: checked 8 bytes at a time, no copy)
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                os.close(fd)
                raise FileSystemError(f"Cannot read {echo}: it is not UTF-8 text") from None
        return data, fd

    def _open_bytes(self, target: str, info: os.stat_result, echo: str) -> tuple[bytes, int]:
        """The bytes of the regular file `target` within the bounds (the per-file limit; on the
        event loop, `workers.ON_LOOP_BYTES`), and the descriptor they were read from, still
        open (the caller closes it)."""
        on_loop = _here.on_loop
        if on_loop and info.st_size > workers.ON_LOOP_BYTES:
            raise _Deferred
        limit = self.limits.max_file_bytes
        reads = min(limit, workers.ON_LOOP_BYTES) if on_loop else limit
        if info.st_size > limit:
            data, fd = None, -1
        else:
            data, fd = read_open(target, reads, size=info.st_size)
        try:
            if data is None:
                if on_loop:
                    raise _Deferred  # it grew past the bound since the stat: the worker reads it
                size = max(info.st_size, limit + 1)
                raise FileSystemError(
                    f"File too large to read: {echo} is {size} bytes (limit {limit})"
                )
            return data, fd
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise

    # --- operations (worker thread) --------------------------------------------------------

    def _ls(self, rel: str) -> list[FileInfo]:
        if rel:
            directory, info = self._resolve(rel, rel, follow=True)
            if info is None:
                return []
            if not stat.S_ISDIR(info.st_mode):
                raise FileSystemError(f"Not a directory: {rel}")
        else:
            directory = self._real()
        try:
            listing = os.scandir(directory)
        except FileNotFoundError:
            return []
        directories: list[FileInfo] = []
        files: list[FileInfo] = []
        with listing:
            for entry in listing:
                name = entry.name
                if name.endswith(TEMP_SUFFIX):
                    continue
                path = f"{rel}/{name}" if rel else name
                if entry.is_dir(follow_symlinks=False):
                    directories.append(FileInfo(path, 0, True))
                elif entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    files.append(FileInfo(path, size, False))
        directories.sort(key=lambda item: item.path)
        files.sort(key=lambda item: item.path)
        return directories + files

    def _read(self, rel: str, echo: str) -> str:
        target, info = self._resolve(rel, echo, follow=True)
        if info is None or not stat.S_ISREG(info.st_mode):
            raise FileNotFoundInWorkspace(f"File not found: {echo}")
        return self._text(target, info, echo)

    def _read_many(self, wanted: list[tuple[str, str]]) -> dict[str, str | FileSystemError]:
        read: dict[str, str | FileSystemError] = {}
        budget = PREFETCH_BYTES
        for rel, echo in wanted:
            try:
                text = self._read(rel, echo)
            except FileSystemError as exc:
                read[rel] = exc
                continue
            except OSError as exc:
                read[rel] = _failed("read", echo, exc)
                continue
            budget -= len(text)
            if budget < 0:
                break
            read[rel] = text
        return read

    def _write_many(self, wanted: list[tuple[int, str, str, bytes]]) -> list[Exception | None]:
        """Each write's error, in order; on the event loop, possibly only the first few (the
        rest must hop)."""
        errors: list[Exception | None] = []
        for _, rel, echo, data in wanted:
            try:
                self._locked(self._write, rel, echo, data)
            except _Deferred:
                break
            except FileSystemError as exc:
                errors.append(exc)
            except OSError as exc:
                errors.append(_failed("write", echo, exc))
            except Exception as exc:  # a bug: this write's call fails, the others go on
                errors.append(exc)
            else:
                errors.append(None)
        return errors

    def _write(self, rel: str, echo: str, data: bytes) -> None:
        seen: dict[str, int] = {}
        target, info = self._resolve(rel, echo, follow=True, mtimes=seen)
        if info is not None and stat.S_ISDIR(info.st_mode):
            raise FileSystemError(f"Cannot write {echo}: it is a directory")
        old_size = info.st_size if info is not None and stat.S_ISREG(info.st_mode) else None
        key = self._key(target)
        chain = self._chain(target)
        reserved = self._admit(key, echo, len(data), old_size, chain, seen)
        old = -1 if old_size is None else _hold(target)
        parent = target.rsplit("/", 1)[0]
        missing = info is None and parent not in seen and parent != self._real()
        self._store(target, data, echo, reserved, new=info is None, old=old, parent_missing=missing)
        self._tally.put(key, len(data))
        self._touch(target)

    def _edit(self, rel: str, echo: str, old: str, new: str, replace_all: bool) -> int:
        seen: dict[str, int] = {}
        target, info = self._resolve(rel, echo, follow=True, mtimes=seen)
        if info is None or not stat.S_ISREG(info.st_mode):
            raise FileNotFoundInWorkspace(f"File not found: {echo}")
        # The edit is made on the UTF-8 bytes: in valid UTF-8 a character's encoding matches only
        # where that character starts, so the bytes hold exactly the text's matches, and the
        # text is neither decoded nor encoded again (two copies of the file, a fifth of an
        # edit's instructions at 50 KiB).
        data, fd = self._open_utf8(target, info, echo)  # held open until it is replaced
        try:
            try:
                needle: bytes | None = old.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate, which no UTF-8 text holds
                needle = None
            count = 0 if needle is None else data.count(needle)
            check_matches(echo, count, replace_all)
            assert needle is not None
            replacement = new.encode("utf-8")
            updated = (
                data.replace(needle, replacement)
                if replace_all
                else data.replace(needle, replacement, 1)
            )
            if updated != data:
                if len(updated) > workers.ON_LOOP_BYTES and _here.on_loop:
                    raise _Deferred
                check_file_size(echo, len(updated), self.limits)
                key = self._key(target)
                chain = self._chain(target)
                reserved = self._admit(key, echo, len(updated), info.st_size, chain, seen)
                held, fd = fd, -1
                self._store(target, updated, echo, reserved, new=False, old=held)
                self._tally.put(key, len(updated))
                self._touch(target)
        finally:
            if fd >= 0:
                os.close(fd)
        return count if replace_all else 1

    def _glob(self, pattern: str, matcher: re.Pattern[str]) -> list[str]:
        prefix = literal_prefix(pattern)
        top = self._real()
        if prefix:
            try:
                top, info = self._resolve(check_path(prefix), prefix, follow=True)
            except FileSystemError:
                prefix, info = "", None
                top = self._real()
            else:
                if info is None or not stat.S_ISDIR(info.st_mode):
                    return []
        return sorted(path for path, _ in walk(top, prefix) if matcher.fullmatch(path))

    def _grep(self, pattern: LinePattern, rel: str) -> list[GrepHit]:
        deadline = Deadline(pattern.source)
        top = self._real()
        if rel:
            top, info = self._resolve(rel, rel, follow=True)
            if info is None or not stat.S_ISDIR(info.st_mode):
                return []
        limit = self.limits.max_grep_hits
        max_bytes = self.limits.max_file_bytes
        hits: list[GrepHit] = []
        for path, entry in sorted(walk(top, rel), key=itemgetter(0)):
            deadline.remaining()
            try:
                data = read_bytes(entry.path, max_bytes)
            except OSError:
                continue
            found = (
                None
                if data is None
                else grep_hits(pattern, path, data, limit - len(hits), deadline)
            )
            if found:
                hits.extend(found)
            if len(hits) >= limit:
                break
        return hits

    def _delete(self, rel: str, echo: str) -> None:
        target, info = self._resolve(rel, echo, follow=False)
        if info is None:
            raise FileNotFoundInWorkspace(f"Not found: {echo}")
        chain = self._chain(target)
        self._trust(chain)
        key = self._key(target)
        directory = stat.S_ISDIR(info.st_mode)
        if directory:
            sizes = [entry.stat(follow_symlinks=False).st_size for _, entry in walk(target, key)]
            shutil.rmtree(target)
            self._tally.drop_dirs_under(target)
            self._ledger.adjust(-len(sizes), -sum(sizes))
        else:
            os.unlink(target)
            if stat.S_ISREG(info.st_mode):
                self._ledger.adjust(-1, -info.st_size)
        self._tally.drop_under(key, directory=directory)
        self._touch(target)

    def _rename(self, old_rel: str, old_echo: str, new_rel: str, new_echo: str) -> None:
        source, info = self._resolve(old_rel, old_echo, follow=False)
        if info is None:
            raise FileNotFoundInWorkspace(f"Not found: {old_echo}")
        destination, existing = self._resolve(new_rel, new_echo, follow=False)
        if existing is not None:
            raise FileSystemError(
                f"Destination already exists: {new_echo} — delete it first if you want to "
                "replace it"
            )
        old_key, new_key = self._key(source), self._key(destination)
        if is_under(new_key, old_key):
            raise FileSystemError(f"Cannot move {old_echo} into itself ({new_echo})")
        chains = self._chain(source) + self._chain(destination)
        self._trust(chains)
        parent = destination.rsplit("/", 1)[0]
        if not os.path.isdir(parent):
            self._make_dirs(parent, new_echo)
        os.rename(source, destination)
        if stat.S_ISDIR(info.st_mode):
            self._tally.forget()  # a moved tree: the next write re-walks (the count is unchanged)
        else:
            self._tally.move(old_key, new_key)
        self._touch(source, destination)
