"""Spare files: made ahead of time, so an atomic write on the event loop skips creating one.

An atomic write (`atomic.write_atomic`) puts its data in a new temporary file and renames it
over the target. Creating that file is the costly step on ext4: allocating an inode took 40 to
540 us on the reference VM (the more the journal is busy), against 3-15 us for each other step of
an edit (its read, the write of 50 KiB, each `stat`). Linux can make a file with no name
(`O_TMPFILE`) and give it one later (`linkat` through `/proc/self/fd`), so a worker thread makes
a few nameless files per filesystem ahead of time, and a write on the event loop takes one,
names it with the write's temporary name, fills it and renames it over the target as before.

Nothing else changes: the same temporary name, the same rename, and what a crash leaves is what
it left before (a nameless file vanishes with the process; a named one is an ordinary temporary
file, which the next walk sweeps). Where the system cannot do it (another OS, a filesystem
without `O_TMPFILE`, no `/proc`, a bind mount that refuses the link), the device is marked and
its writes create their files as before. Spares are bounded (`PER_DEVICE` open files for each
of at most `DEVICES` filesystems) and only serve writes made on the event loop: a worker thread
may as well create its own file.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable

from .atomic import remove_quietly, write_fully

PER_DEVICE = 4
"""Spare files kept ready per filesystem (open descriptors of nameless files)."""
DEVICES = 8
"""Filesystems that get spares at most (a process writes to one or two)."""

_TMPFILE = getattr(os, "O_TMPFILE", 0) if os.link in os.supports_dir_fd else 0
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.EXDEV}
"""What `O_TMPFILE` or the link answers where the system cannot do this at all."""


class SpareFiles:
    """Nameless files ready to be named, per filesystem (`st_dev`); thread-safe."""

    def __init__(self, per_device: int = PER_DEVICE, devices: int = DEVICES) -> None:
        self.per_device = per_device
        self.devices = devices
        self._ready: dict[int, list[int]] = {}
        self._refilling: set[int] = set()
        self._unsupported: set[int] = set() if _TMPFILE else {-1}
        self._lock = threading.Lock()
        self.used = 0
        """Writes that took a spare instead of creating their file (tests, benchmarks)."""

    def place(
        self,
        device: int,
        home: str,
        temp: str,
        data: bytes,
        refill: Callable[[Callable[[], None]], None],
    ) -> bool:
        """Give a spare of `device` the name `temp` and fill it with `data`; `False` (nothing
        done) when there is none to take or the system refuses the name. `home` is a directory
        on that filesystem to make the next spares in, with `refill(job)` (a worker thread)."""
        if not _TMPFILE or device in self._unsupported:
            return False
        with self._lock:
            ready = self._ready.get(device)
            fd = ready.pop() if ready else None
            wanted = (
                device not in self._refilling
                and len(ready or ()) < self.per_device
                and (ready is not None or len(self._ready) < self.devices)
            )
            if wanted:
                self._refilling.add(device)
        if wanted:
            refill(lambda: self._refill(device, home))
        if fd is None:
            return False
        try:
            os.link(f"/proc/self/fd/{fd}", temp, src_dir_fd=_any_directory(), follow_symlinks=True)
        except OSError as exc:
            self._refused(device, fd, temp, exc)
            return False
        try:
            write_fully(fd, data)
        except BaseException:
            os.close(fd)
            remove_quietly(temp)
            raise
        os.close(fd)
        self.used += 1
        return True

    def _refused(self, device: int, fd: int, temp: str, exc: OSError) -> None:
        """The link failed: keep the spare when the fault is the write's own (its directory
        is missing: the caller creates it and writes the usual way); else drop it, and the
        device's spares altogether when the system cannot link them."""
        parent = temp.rsplit("/", 1)[0]
        if exc.errno == errno.ENOENT and not os.path.isdir(parent):
            with self._lock:
                self._ready.setdefault(device, []).append(fd)
            return
        os.close(fd)
        if exc.errno in _UNSUPPORTED or exc.errno == errno.ENOENT:  # ENOENT: no /proc
            self._give_up(device)

    def _refill(self, device: int, home: str) -> None:
        """Make spares of `device` in `home` up to `per_device` (in a worker thread)."""
        try:
            while True:
                with self._lock:
                    if device in self._unsupported:
                        return
                    if len(self._ready.get(device, ())) >= self.per_device:
                        return
                fd = os.open(home, _TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o666)
                if os.fstat(fd).st_dev != device:  # `home` is on another filesystem now
                    os.close(fd)
                    return
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

    def close(self) -> None:
        """Close every spare (their nameless files vanish)."""
        with self._lock:
            spares = [fd for ready in self._ready.values() for fd in ready]
            self._ready.clear()
        for fd in spares:
            os.close(fd)


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
    global SPARES
    # The child's copies of the parent's descriptors are closed without taking the lock: another
    # thread of the parent may have held it at the fork, and nothing would ever release it here.
    for ready in SPARES._ready.values():
        for fd in ready:
            try:
                os.close(fd)
            except OSError:
                pass
    SPARES = SpareFiles()


os.register_at_fork(after_in_child=_forked)
