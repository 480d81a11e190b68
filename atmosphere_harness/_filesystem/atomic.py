"""Atomic writes and bounded reads of one file, never through a final symlink.

`write_atomic` puts the content in a temporary file beside the target (named with the reserved
`paths.TEMP_SUFFIX`, so listings hide it and a walk sweeps it if a crash leaves it behind), then
`os.replace` swaps it in: readers, which take no lock, see the old file or the new one, and a
crash never leaves a torn one. `fsync=True` also flushes the file and its directory before
returning (about 1 ms per write on a cloud VM's disk, ten times the write itself), for stores
that must survive a power cut; the default relies on the OS write-back.
"""

from __future__ import annotations

import errno
import itertools
import os
import secrets
from collections.abc import Callable

from .paths import TEMP_SUFFIX

Spare = Callable[[str, bytes, "str | None"], "str | None"]
"""`spares.SpareFiles.place` bound to a store: `(temp, data, target or None) -> name or None`."""

WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC

_SPARE_LOST = {errno.EXDEV, errno.ENOENT}
"""What a spare's rename over the target answers when the spare cannot serve: it is on another
mount than the target (a mount inside the store), or another process's sweep of old named
spares removed it since it was checked (`spares.SpareFiles`)."""

_prefix = secrets.token_hex(4)
"""This process's random part of the temporary names (drawn again in a forked child)."""
_serial = itertools.count()


def _reseed() -> None:
    global _prefix
    _prefix = secrets.token_hex(4)


os.register_at_fork(after_in_child=_reseed)


def temp_name(name: str) -> str:
    """A temporary name for an atomic write of `name`, unique among this host's processes
    (a random per-process part and a counter: no `getrandom` call per write)."""
    return f".{name}.{_prefix}{next(_serial):x}{TEMP_SUFFIX}"


def write_atomic(
    target: str,
    data: bytes,
    *,
    fsync: bool = False,
    make_parent: Callable[[str], None] | None = None,
    spare: Spare | None = None,
    new: bool = False,
    parent_missing: bool = False,
) -> None:
    """Write `data` to `target` atomically: a temp file in the same directory, then a rename.

    When the parent directory is missing, `make_parent(parent)` is called to create it (and may
    refuse by raising); without it the `FileNotFoundError` propagates. A parent that is a file
    raises `NotADirectoryError`. On any failure the temporary file is removed and the target is
    untouched. `spare(temp, data, name)`, when given, may put `data` in a file made ahead of
    time (`spares.SpareFiles.place`): named `temp` or a named spare's own name (renamed over
    the target here), or named `target` at once when `new` says the target did not exist
    (`name` is then `target`); when it says it did neither, the file is created here.
    `parent_missing` says the caller found no parent directory: it is made first (with
    `make_parent`) rather than after a failure.
    """
    parent, name = target.rsplit("/", 1)
    temp = f"{parent}/{temp_name(name)}"
    if parent_missing and make_parent is not None:
        make_parent(parent)
    if spare is not None and not fsync:
        direct = target if new else None
        try:
            named = spare(temp, data, direct)
        except FileNotFoundError:
            if make_parent is None:
                raise
            make_parent(parent)
            named = spare(temp, data, direct)
        if named is not None and named != target:  # (`temp`, or a named spare elsewhere)
            try:
                os.replace(named, target)
            except BaseException as exc:
                remove_quietly(named)
                lost = isinstance(exc, OSError) and exc.errno in _SPARE_LOST
                if named == temp or not lost:  # (`temp` is beside the target: nothing to retry)
                    raise
                named = None  # a named spare that cannot serve: the file is created below
        if named is not None:
            return
    try:
        fd = os.open(temp, WRITE_FLAGS, 0o666)
    except FileNotFoundError:
        if make_parent is None:
            raise
        make_parent(parent)
        fd = os.open(temp, WRITE_FLAGS, 0o666)
    try:
        try:
            write_fully(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, target)
    except BaseException:
        remove_quietly(temp)
        raise
    if fsync:
        fsync_directory(parent)


def write_fully(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd` (one `write` may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def remove_quietly(path: str) -> None:
    """Remove `path` if it is there (a temporary file, after a failure)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def fsync_directory(directory: str) -> None:
    """Flush a directory's entries (a rename or a new file in it) to the disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_bytes(path: str, limit: int, *, size: int | None = None) -> bytes | None:
    """The bytes of `path` (never through a final symlink), or `None` if it holds more than
    `limit` bytes.

    One read of the size `fstat` reports (plus one byte, to notice a file still growing) instead
    of a `limit`-sized buffer per file. `size`, when the caller has just seen it (an `lstat`),
    saves the `fstat`: a file that changed since is read to its end all the same.
    """
    data, fd = read_open(path, limit, size=size)
    os.close(fd)
    return data


def read_open(path: str, limit: int, *, size: int | None = None) -> tuple[bytes | None, int]:
    """`read_bytes`, and the descriptor it read from, still open: the caller closes it (a write
    that replaces the file holds it across the rename, see `spares.SpareFiles.retire`)."""
    fd = os.open(path, READ_FLAGS)
    try:
        return _read_fd(fd, limit, size), fd
    except BaseException:
        os.close(fd)
        raise


def _read_fd(fd: int, limit: int, size: int | None) -> bytes | None:
    if size is None:
        size = os.fstat(fd).st_size
    if size > limit:
        return None
    chunks = [os.read(fd, size + 1)]
    total = len(chunks[0])
    while total > size:  # it grew since it was measured: read on to the end, or past the limit
        if total > limit:
            return None
        chunk = os.read(fd, limit + 1 - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
