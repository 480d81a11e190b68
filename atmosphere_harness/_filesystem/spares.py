"""Spare files: made ahead of time, so an atomic write skips creating one.

An atomic write (`atomic.write_atomic`) puts its data in a new temporary file and renames it
over the target. Creating that file (an inode, a directory entry) is the costly step of a small
write, and more so while the disk's journal is busy. Linux can make a file with no name
(`O_TMPFILE`) and give it one later (`linkat` through `/proc/self/fd`), so a worker thread makes
a few nameless files per filesystem ahead of time, and a write takes one. `benchmarks/on_loop.py`
and `benchmarks/filesystem.py` show what they save (docs/filesystem-speed.md).

A write over an existing file names the spare with the write's temporary name, fills it and
renames it over the target. A write of a new file fills the nameless spare first and then links
it under the target's own name: a reader finds no file, then the whole file, never a part of it
(should the name exist by then, the spare takes the temporary name and is renamed over it). What
a crash leaves is what it left before: a nameless file vanishes with the process; a named
temporary one is swept by the next walk. Where the system cannot do it (another OS, a filesystem
without `O_TMPFILE`, no `/proc`, a bind mount that refuses the link), the device is marked and
its writes create their files. Spares are bounded (`PER_DEVICE` open files for each of at most
`DEVICES` filesystems). The last `RESERVED` of a filesystem's spares are left to writes that
replace a file, so the edit that follows a burst of new files still finds one.

**Named spares, for writes that replace a file.** Naming a nameless file is itself a change of
the directory. A store also keeps `NAMED_PER_STORE` empty files made ahead *with* a name, in its
hidden `SPARES_DIR` (walks, listings, searches and the usage count skip it; a path into it is
refused), and a write that replaces a file fills one and renames it straight over the target.
The pool is kept for the `NAMED_STORES` stores whose spares were taken or made last. A named
spare found unlinked is dropped, one older than `tally.ORPHAN_SECONDS` that no live pool holds
is swept by the next refill, and a rename the system refuses (`EXDEV`, a mount inside the store)
falls back to creating the file. `release` (the application's shutdown) removes every named
spare and every `SPARES_DIR` this process made, so a conversation's folder then holds only the
user's files; a process that exits without it removes its named spares at exit, and one killed
leaves them to the next sweep.

Also here: `retire(fd)`, for the descriptor a write kept open on the file it replaced. The last
close of a replaced file frees its blocks and its inode; holding it open across the rename
leaves that work to a worker thread, after the write (`workers.later`).
"""

from __future__ import annotations

import atexit
import errno
import itertools
import os
import stat
import threading
import time
from collections.abc import Callable

from . import workers
from .atomic import remove_quietly, write_fully
from .paths import TEMP_SUFFIX
from .tally import ORPHAN_SECONDS

PER_DEVICE = 68
"""Spare files kept ready per filesystem (open descriptors of nameless files). Making them is
the same kernel work as creating the files (about 50 us each on a 2-core cloud VM), and in a
burst of writes the kernel does it no faster from another thread: what a burst gains is the
spares made before it, while the store was idle. 64 for any write (`RESERVED` more are kept for
replacing writes) cover a typical message's `write_file` calls; a longer burst creates the rest
of its files itself, while the refill catches up."""
RESERVED = 4
"""The last spares of a filesystem, which only a write that replaces a file (an edit, a write
over an existing file) takes. A burst of new files is what empties the pool (a `write_file`
batch, or 200 writes in a row), and the refill waits for the loop to pause; the next edit,
often of a file just written, would then create its temporary file on the loop (110-140 us of a
0.3 ms edit on a 2-core cloud VM). New files keep the `PER_DEVICE - RESERVED` others."""
NAMED_PER_STORE = 2
"""Named spares kept ready per store: a model edits one file at a time, and the refill makes the
next one after each use."""
NAMED_STORES = 8
"""Stores that keep named spares at most (the ones whose spares were taken or made last):
`NAMED_PER_STORE * NAMED_STORES` more open descriptors, and as many empty files on disk."""
SPARES_DIR = ".spares" + TEMP_SUFFIX
"""The hidden directory, in a store's root, that holds its named spares."""
DEVICES = 4
"""Filesystems that get spares at most (a process writes to one or two): at most
`PER_DEVICE * DEVICES` descriptors, well under the usual limit of 1024 a process."""

_TMPFILE = getattr(os, "O_TMPFILE", 0) if os.link in os.supports_dir_fd else 0
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.EXDEV}
"""What `O_TMPFILE` or the link answers where the system cannot do this at all."""

Later = Callable[[Callable[[], None]], None]
"""How background work is asked for: `workers.later` (a worker thread, after the write)."""


class SpareFiles:
    """Nameless files ready to be named, per filesystem (`st_dev`); thread-safe."""

    def __init__(
        self, per_device: int = PER_DEVICE, devices: int = DEVICES, reserved: int = RESERVED
    ) -> None:
        self.per_device = per_device
        self.devices = devices
        self.reserved = min(reserved, per_device // 4)
        """Spares left for writes that replace a file (`RESERVED`; at most a quarter)."""
        self._ready: dict[int, list[int]] = {}
        self._refilling: set[int] = set()
        self._unsupported: set[int] = set() if _TMPFILE else {-1}
        self._lock = threading.Lock()
        self._retired: list[int] = []  # descriptors of replaced files, to close in a worker
        # Named spares per store root, the one taken from or refilled last at the end; `None`:
        # the store has no usable `SPARES_DIR` (its replacing writes take nameless spares).
        self._named: dict[str, list[tuple[int, str]] | None] = {}
        self._naming: set[str] = set()  # stores whose named spares are being made
        self._swept: set[str] = set()  # stores whose `SPARES_DIR` this process swept once
        self._homes: set[str] = set()  # stores whose `SPARES_DIR` this process made
        self._epoch = 0  # counts `release` calls: named spares made across one are dropped
        self.used = 0
        """Writes that took a spare instead of creating their file (tests, benchmarks)."""
        self.named_used = 0
        """Of those, the writes that took a named spare."""

    def place(
        self,
        device: int,
        home: str,
        temp: str,
        data: bytes,
        refill: Later,
        *,
        target: str | None = None,
        named: bool = True,
    ) -> str | None:
        """Put `data` in a spare of `device` and give it a name: `target` itself when given (a
        new file), else `temp` (the caller renames it over the target). Returns the name
        given, or `None` (nothing done) when there is no spare to take (a new file leaves the
        last `reserved` to writes that replace one) or the system refuses the name. Raises
        `FileNotFoundError` (nothing done, the spare kept) when the name's directory does not
        exist. `home` is a directory on that filesystem to make the next spares in, with
        `refill(job)`, once a quarter of them has been taken (a lone write then asks for no
        background work: a burst asks once per quarter).

        `home` is also the store's root: a write that replaces a file (no `target`) takes one
        of the store's named spares first, and returns its name (the caller renames it over
        the target); any write asks for the store's named spares while it has none. With
        `named=False` (a private store, removed when its owner is done) the store has none: its
        writes take nameless spares only, and nothing is kept for it."""
        if named:
            pool = self._named.get(home, ())
            if pool is not None and len(pool) < NAMED_PER_STORE and home not in self._naming:
                self._ask_named(home, refill)
            if target is None and pool:
                taken = self._take_named(home, data)
                if taken is not None:
                    return taken
        if not _TMPFILE or device in self._unsupported:
            return None
        with self._lock:
            ready = self._ready.get(device)
            left = len(ready) if ready else 0
            fd = ready.pop() if ready and (target is None or left > self.reserved) else None
            wanted = (
                device not in self._refilling
                and len(ready or ()) < self.per_device - self.per_device // 4
                and (ready is not None or len(self._ready) < self.devices)
            )
            if wanted:
                self._refilling.add(device)
        if wanted:
            refill(lambda: self._refill(device, home))
        if fd is None:
            return None
        if target is not None:  # fill it while nobody can see it, then name it at once
            try:
                write_fully(fd, data)
            except BaseException:
                os.close(fd)
                raise
            try:
                _link(fd, target)
            except FileExistsError:  # made meanwhile, behind the store: replace it instead
                pass
            except OSError as exc:
                self._refused(device, fd, target, exc, filled=True)
                return None
            except BaseException:
                os.close(fd)
                raise
            else:
                os.close(fd)
                self.used += 1
                return target
        try:
            _link(fd, temp)
        except OSError as exc:
            self._refused(device, fd, temp, exc, filled=target is not None)
            return None
        except BaseException:
            os.close(fd)
            raise
        if target is None:
            _fill(fd, data, temp)
        else:
            os.close(fd)
        self.used += 1
        return temp

    def _ask_named(self, home: str, refill: Later) -> None:
        with self._lock:
            if home in self._naming:
                return
            self._naming.add(home)
        refill(lambda: self._make_named(home))

    def _take_named(self, home: str, data: bytes) -> str | None:
        """A named spare of the store `home` filled with `data`, by name, or `None` (none
        left, or the one taken was removed behind the pool's back: dropped)."""
        with self._lock:
            pool = self._named.pop(home, None)
            spare = pool.pop() if pool else None
            if pool is not None:
                self._named[home] = pool  # (now the one used last)
        if spare is None:
            return None
        fd, path = spare
        try:
            gone = os.fstat(fd).st_nlink == 0  # removed (a sweep, a shell): not a file any more
        except OSError:
            gone = True
        if gone:
            os.close(fd)
            return None
        _fill(fd, data, path)
        self.used += 1
        self.named_used += 1
        return path

    def made_directory(self, home: str) -> None:
        """The store `home` made its `SPARES_DIR` (`release` removes it)."""
        with self._lock:
            self._homes.add(home)
            if home in self._named and self._named[home] is None:
                del self._named[home]  # (marked unusable while it was missing: usable again)

    def release(self) -> None:
        """Leave every store holding only its own files: close and remove every named spare,
        then remove each `SPARES_DIR` this process made, if it is empty (another process's
        spares keep theirs). Named spares made by a refill that was running meanwhile are
        dropped when it ends. The application's shutdown calls it (`FilesystemPrimitive.stop`);
        a store written to afterwards makes its spares again (nameless ones at once, named ones
        after its next recount makes the directory)."""
        with self._lock:
            self._epoch += 1
            named = self._all_named()
            self._named.clear()
            self._swept.clear()
            homes, self._homes = self._homes, set()
        _drop(named)
        for home in homes:
            _remove_directory(home)

    def _make_named(self, home: str) -> None:
        """Make the store `home`'s named spares up to `NAMED_PER_STORE` in its `SPARES_DIR`
        (in a worker thread); a store without that directory (or where it is not a plain
        directory) is marked and asks no more. Past `NAMED_STORES` stores, the pool of the
        one written longest ago is closed and its files removed."""
        made: list[tuple[int, str]] = []
        usable = True
        with self._lock:
            epoch = self._epoch
        try:
            directory = os.open(
                f"{home}/{SPARES_DIR}", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            )
        except OSError:
            usable = False
        else:
            try:
                if home not in self._swept:
                    self._swept.add(home)
                    self._sweep(home, directory)
                with self._lock:
                    have = len(self._named.get(home) or ())
                for _ in range(NAMED_PER_STORE - have):
                    name = f"{_prefix}{next(_serial):x}{TEMP_SUFFIX}"
                    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                    fd = os.open(name, flags, 0o666, dir_fd=directory)
                    made.append((fd, f"{home}/{SPARES_DIR}/{name}"))
            except OSError:
                pass  # (the ones made are kept; the next write asks again)
            finally:
                os.close(directory)
        with self._lock:
            self._naming.discard(home)
            released = epoch != self._epoch
            pool = self._named.pop(home, None)
            evicted: list[tuple[int, str]] = []
            if released:  # the store was released while these were made: not kept
                evicted += made
                if pool is not None:
                    self._named[home] = pool
            elif usable:
                self._named[home] = (pool or []) + made
            else:
                self._named[home] = None
                evicted += pool or ()
            while len(self._named) > NAMED_STORES:
                oldest = next(iter(self._named))
                evicted += self._named.pop(oldest) or ()
                self._swept.discard(oldest)
        _drop(evicted)
        if released:
            _remove_directory(home)

    def _sweep(self, home: str, directory: int) -> None:
        """Remove the named spares another process left in `home`'s `SPARES_DIR` (not this
        pool's) older than `ORPHAN_SECONDS`: a process that ended without removing its own."""
        with self._lock:
            mine = {path.rsplit("/", 1)[1] for _, path in self._all_named()}
        cutoff = time.time() - ORPHAN_SECONDS
        for name in os.listdir(directory):
            if name in mine:
                continue
            try:
                info = os.stat(name, dir_fd=directory, follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and info.st_mtime < cutoff:
                    os.unlink(name, dir_fd=directory)
            except OSError:
                pass

    def _all_named(self) -> list[tuple[int, str]]:
        """Every named spare in the pools (under the lock, or where no other thread runs)."""
        return [spare for pool in self._named.values() for spare in pool or ()]

    def drop_named(self) -> None:
        """Close every named spare and remove its file."""
        with self._lock:
            named = self._all_named()
            self._named.clear()
        _drop(named)

    def named(self, home: str) -> int:
        """Named spares of the store `home` ready now."""
        with self._lock:
            return len(self._named.get(home) or ())

    def _refused(self, device: int, fd: int, name: str, exc: OSError, *, filled: bool) -> None:
        """The link of the spare `fd` to `name` failed with `exc`. When the fault is the
        write's own (the directory is missing: the caller creates it), the spare is kept,
        emptied if `filled`, and `FileNotFoundError` raised; else it is dropped, and the
        device's spares altogether when the system cannot link them (the caller then creates
        its file)."""
        parent = name.rsplit("/", 1)[0]
        if exc.errno == errno.ENOENT and not os.path.isdir(parent):
            try:
                if filled:
                    os.ftruncate(fd, 0)
                    os.lseek(fd, 0, os.SEEK_SET)
            except OSError:
                kept = False
            else:
                with self._lock:
                    ready = self._ready.setdefault(device, [])
                    kept = len(ready) < self.per_device  # (a refill may have filled it since)
                    if kept:
                        ready.append(fd)
            if not kept:
                os.close(fd)
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), parent)
        os.close(fd)
        if exc.errno in _UNSUPPORTED or exc.errno == errno.ENOENT:  # ENOENT: no /proc
            self._give_up(device)

    def _refill(self, device: int, home: str) -> None:
        """Make spares of `device` in `home` up to `per_device` (in a worker thread): the first
        quarter at once (the next writes on the loop find one), the rest each while the event
        loop pauses and no worker runs an operation (`workers.wait_for_idle`): a loop or pool
        that stays busy gets them at the next refill."""
        checked = False
        deadline = time.monotonic() + workers.IDLE_WAIT_SECONDS
        try:
            while True:
                with self._lock:
                    if device in self._unsupported:
                        return
                    ready = len(self._ready.get(device, ()))
                    if ready >= self.per_device:
                        return
                if ready >= self.per_device // 4 and not workers.wait_for_idle(deadline):
                    return
                fd = os.open(home, _TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o666)
                if not checked:  # once per refill: the job's files are all made in `home`
                    if os.fstat(fd).st_dev != device:  # `home` is on another filesystem now
                        os.close(fd)
                        return
                    checked = True
                with self._lock:
                    given_up = device in self._unsupported
                    if not given_up:
                        self._ready.setdefault(device, []).append(fd)
                if given_up:  # (while this was making it)
                    os.close(fd)
                    return
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                self._give_up(device)
        finally:
            with self._lock:
                self._refilling.discard(device)

    def _give_up(self, device: int) -> None:
        with self._lock:
            self._unsupported.add(device)
            spares = self._ready.pop(device, [])
        for fd in spares:
            os.close(fd)

    def ready(self, device: int) -> int:
        """Spares of `device` ready now."""
        with self._lock:
            return len(self._ready.get(device, ()))

    def retire(self, fd: int, later: Later) -> None:
        """Close `fd` in a worker thread, with `later(job)`: the descriptor a write kept open on
        the file it replaced, whose last close frees the file's blocks."""
        with self._lock:
            first = not self._retired
            self._retired.append(fd)
        if first:
            later(self._close_retired)

    def retired(self) -> int:
        """Descriptors waiting to be closed (tests)."""
        with self._lock:
            return len(self._retired)

    def _close_retired(self, *, wait: bool = True) -> None:
        if wait:  # for a pause of the loop and the pool, then close them anyway
            workers.wait_for_idle(time.monotonic() + workers.IDLE_WAIT_SECONDS)
        with self._lock:
            retired, self._retired = self._retired, []
        for fd in retired:
            _close(fd)

    def close(self) -> None:
        """Close every spare (their nameless files vanish; the named ones are removed) and
        every retired descriptor."""
        with self._lock:
            spares = [fd for ready in self._ready.values() for fd in ready]
            self._ready.clear()
        for fd in spares:
            os.close(fd)
        self.drop_named()
        self._close_retired(wait=False)


def _link(fd: int, path: str) -> None:
    """Give the nameless file open as `fd` the name `path` (`linkat` through `/proc`)."""
    os.link(f"/proc/self/fd/{fd}", path, src_dir_fd=_any_directory(), follow_symlinks=True)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _fill(fd: int, data: bytes, name: str) -> None:
    """Write `data` into the spare open as `fd`, named `name`, and close it; a write that fails
    removes the file (the target is left as it was)."""
    try:
        write_fully(fd, data)
    except BaseException:
        os.close(fd)
        remove_quietly(name)
        raise
    os.close(fd)


def _remove_directory(home: str) -> None:
    """Remove the store `home`'s `SPARES_DIR` if it is empty."""
    try:
        os.rmdir(f"{home}/{SPARES_DIR}")
    except OSError:
        pass  # gone already, or another process's spares are in it


def _drop(named: list[tuple[int, str]]) -> None:
    """Close named spares and remove their files."""
    for fd, path in named:
        _close(fd)
        remove_quietly(path)


_prefix = f"{os.getpid()}-{os.urandom(4).hex()}-"
"""This process's part of its named spares' names (drawn again in a forked child)."""
_serial = itertools.count()


_directory: list[int] = []


def _any_directory() -> int:
    """A directory descriptor to pass with the absolute `/proc` path: the kernel ignores it,
    but it makes CPython call `linkat(..., AT_SYMLINK_FOLLOW)`, which names the file the
    descriptor refers to (plain `link()` would link the `/proc` symlink itself: `EXDEV`)."""
    if not _directory:
        _directory.append(os.open("/", os.O_RDONLY | os.O_CLOEXEC))
    return _directory[0]


SPARES = SpareFiles()
"""The process's spares (a forked child starts with none of its parent's)."""


def _forked() -> None:
    global SPARES, _prefix
    # The child's copies of the parent's descriptors are closed without taking the lock: another
    # thread of the parent may have held it at the fork, and nothing would ever release it here.
    # The named spares' files are the parent's: left to it.
    named = [fd for fd, _ in SPARES._all_named()]
    for ready in [*SPARES._ready.values(), SPARES._retired, named]:
        for fd in ready:
            _close(fd)
    SPARES = SpareFiles()
    _prefix = f"{os.getpid()}-{os.urandom(4).hex()}-"


os.register_at_fork(after_in_child=_forked)


@atexit.register
def _exiting() -> None:
    """Remove this process's named spares (a process killed leaves them to the next sweep)."""
    SPARES.drop_named()
