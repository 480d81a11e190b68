"""Cross-process locks on a shared volume: `flock(2)` on small lock files.

Several uvicorn processes (or replicas mounting one volume) share a workspace root. What one of
them counts or checks must not be made stale by another between the check and the write, so the
workspace stores, the conversation cap and the plan cap take these locks:

- `LockFile`: an exclusive lock, for a read-modify-write. Threads of one process queue on a
  `threading.Lock` first (one `flock` call per hold, never a poll), processes on `flock`. Each
  hold also says whether someone *else* held the lock since this holder last did (`foreign`):
  the lock file stores the token of its last holder, so a holder can keep figures in memory and
  recount only when another process may have changed what the lock guards.
- `Lease`: a shared lock held for as long as this process uses something (a conversation's
  store); `retire` takes it exclusively without waiting, so a cap never removes what any
  process has in use, and removes the lock files with it.

Why `fcntl.flock` directly rather than the `filelock` package: `filelock` acquires by polling
(`LOCK_NB` and a sleep of `poll_interval`, 50 ms by default), which would put tens of
milliseconds on a contended write; it has no shared mode for leases; and it does not handle a
lock file unlinked while someone waits on it, which eviction needs. `flock` rather than
`fcntl`/`lockf` record locks because record locks belong to the process (two threads never
exclude each other, and closing *any* descriptor of the file drops them all), while `flock`
locks belong to the open file description. On NFS, Linux emulates `flock` with record locks:
processes on different hosts still exclude each other (NFSv4 locking), and threads are covered
by the `threading.Lock`.

After `fork` a child reopens its lock files (an inherited descriptor would share the parent's
lock): each object remembers the fork generation it opened its file in (cheaper than `getpid`),
and gets a fresh mutex.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Iterator
from types import TracebackType

OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
TOKEN_BYTES = 8

_generation = 0
"""How many forks separate this process from the one that imported this module."""


_instances: weakref.WeakSet[LockFile | Lease] = weakref.WeakSet()
"""Every lock object of this process, so a forked child can give each a fresh mutex."""


def _forked() -> None:
    """In a forked child: every descriptor now belongs to the parent, and a mutex some other
    thread held at the fork would never be released."""
    global _generation
    _generation += 1
    for instance in list(_instances):
        instance._mutex = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def _open(path: str, *, create_parent: bool) -> int:
    try:
        return os.open(path, OPEN_FLAGS, 0o666)
    except FileNotFoundError:
        if not create_parent:
            raise
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, OPEN_FLAGS, 0o666)


def _same_file(fd: int, path: str) -> bool:
    """Whether `path` still names the file open as `fd` (a retired lock file is unlinked)."""
    try:
        now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class LockFile:
    """An exclusive cross-process lock on `path`, with a `foreign` flag per hold.

    Use it as a context manager (`with lock as foreign:`) from any thread; not reentrant. The
    file is opened at the first hold (its directory created when `create_parent`) and kept
    open; `close()` releases the descriptor. The lock file itself holds no data but the token
    of its last holder.
    """

    __slots__ = ("__weakref__", "_fd", "_gen", "_mutex", "_token", "create_parent", "path")

    def __init__(self, path: str, *, create_parent: bool = True) -> None:
        self.path = path
        self.create_parent = create_parent
        self._mutex = threading.Lock()
        self._fd = -1
        self._gen = -1
        self._token = secrets.token_bytes(TOKEN_BYTES)
        _instances.add(self)

    def __repr__(self) -> str:
        return f"LockFile({self.path!r})"

    def __del__(self) -> None:
        if self._fd >= 0 and self._gen == _generation:
            _close(self._fd)

    def __enter__(self) -> bool:
        foreign = self._enter(wait=True)
        assert foreign is not None
        return foreign

    def try_enter(self) -> bool | None:
        """`__enter__` if the lock is free now, without waiting for it: the `foreign` flag, or
        `None` (nothing held) when another thread or process holds it. Release with
        `__exit__`."""
        return self._enter(wait=False)

    def _enter(self, *, wait: bool) -> bool | None:
        if not self._mutex.acquire(blocking=wait):
            return None
        try:
            fd = self._fd
            if fd < 0 or self._gen != _generation:
                fd = self._reopen()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._mutex.release()
                return None
            try:
                if os.pread(fd, TOKEN_BYTES, 0) == self._token:
                    return False
                os.pwrite(fd, self._token, 0)
                return True
            except BaseException:
                fcntl.flock(fd, fcntl.LOCK_UN)
                raise
        except BaseException:
            self._mutex.release()
            raise

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._mutex.release()

    def _reopen(self) -> int:
        if self._fd >= 0 and self._gen == _generation:
            _close(self._fd)
        self._fd = -1  # an inherited descriptor is left to the parent: closing it frees nothing
        self._token = secrets.token_bytes(TOKEN_BYTES)
        fd = _open(self.path, create_parent=self.create_parent)
        self._fd, self._gen = fd, _generation
        return fd

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lock in shared mode: many shared holders (of any thread or process) at
        once, none while an exclusive hold runs. For work that must not overlap the exclusive
        bookkeeping but changes nothing it counts (so it leaves no mark). Each shared hold
        opens its own descriptor: an unlock on a shared descriptor would release the others."""
        fd = _open(self.path, create_parent=self.create_parent)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            _close(fd)

    def close(self) -> None:
        """Release the descriptor (the next hold opens the file again)."""
        with self._mutex:
            if self._fd >= 0 and self._gen == _generation:
                _close(self._fd)
            self._fd = -1


class Lease:
    """A shared lock on `path`, held from `claim()` until `release()` (or the object's end).

    Many processes hold a lease at once; `retire(path)` succeeds only when none does. A lease
    claimed while `retire` removes its file waits for it, notices the file is gone, and claims
    a fresh one, so a retired lease never protects a newly used store by accident.
    """

    __slots__ = ("__weakref__", "_fd", "_gen", "_mutex", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._mutex = threading.Lock()
        self._fd = -1
        self._gen = -1
        _instances.add(self)

    def __repr__(self) -> str:
        return f"Lease({self.path!r}, held={self.held})"

    def __del__(self) -> None:
        if self._fd >= 0 and self._gen == _generation:
            _close(self._fd)

    @property
    def held(self) -> bool:
        return self._fd >= 0 and self._gen == _generation

    def claim(self, *, create: bool) -> bool:
        """Hold the lease (blocking only while a `retire` of it runs). With `create`, the file
        (and its directory) is made if missing; without, a missing file is not claimed: returns
        False, holding nothing."""
        with self._mutex:
            if self._fd >= 0 and self._gen == _generation:
                return True
            while True:
                try:
                    if create:
                        fd = _open(self.path, create_parent=True)
                    else:
                        fd = os.open(self.path, OPEN_FLAGS & ~os.O_CREAT)
                except (FileNotFoundError, NotADirectoryError):
                    return False
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    if _same_file(fd, self.path):
                        self._fd, self._gen = fd, _generation
                        return True
                except BaseException:
                    _close(fd)
                    raise
                _close(fd)  # retired while we waited: claim the new file, if any

    def release(self) -> None:
        with self._mutex:
            if self._fd >= 0 and self._gen == _generation:
                _close(self._fd)
            self._fd = -1


def leased(path: str) -> bool:
    """Whether some process holds a lease on `path` now (a snapshot; `retire` is the safe
    way to act on it). Never creates the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        _close(fd)  # closing drops the probe's lock
    return False


def retire(path: str, remove: Callable[[], object], *also: str) -> bool:
    """Run `remove()` unless a lease on `path` is held; then unlink `path` and `also` (lock
    files of the removed thing). Returns whether it ran. Never waits."""
    try:
        fd = os.open(path, OPEN_FLAGS, 0o666)
    except (FileNotFoundError, NotADirectoryError):
        fd = -1  # no directory for a lease: nobody can hold one
    try:
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        remove()
        for name in (*also, path):
            try:
                os.unlink(name)
            except (FileNotFoundError, NotADirectoryError):
                pass
        return True
    finally:
        if fd >= 0:
            _close(fd)
