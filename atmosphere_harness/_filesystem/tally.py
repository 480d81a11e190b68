"""`DiskTally`: what a store's directory held when the store last looked, to notice what changed.

The usage ledger (`usage.py`) keeps the totals exact for every change made through a store; the
tally keeps them true when files change on disk behind the stores' back (another process, a
shell, a crash). It records each regular file's size and each directory's mtime. A directory's
mtime changes whenever an entry is added, removed or renamed in it, so before a change the store
compares the mtimes of the directories on its path (and, at most every `DIR_CHECK_SECONDS`, of
every directory) with the recorded ones, and recounts by a walk on any difference. A file resized
in place is caught when it is the target (its size disagrees with the tally) and by a full walk
at least every `FULL_RESYNC_SECONDS` (as is a change made within the same clock tick, a few
milliseconds, as the store's own change in that directory).

Also here: `walk`, the bounded traversal that the recount, `glob` and `grep` share.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator

from .._errors import FileSystemError
from .paths import TEMP_SUFFIX, is_under
from .usage import StoreUsage

FULL_RESYNC_SECONDS = 30.0
"""Oldest tally a change trusts without re-walking the whole store."""

DIR_CHECK_SECONDS = 0.25
"""How often a change also checks every directory's mtime, not only those on its own path."""

ORPHAN_SECONDS = 60.0
"""Temporary files older than this, left by a crash mid-write, are removed by the next walk."""

MAX_WALK_ENTRIES = 100_000
"""Most directory entries one walk visits (a store filled from outside cannot stall a call)."""


def mtime(directory: str) -> int | None:
    """A directory's mtime in nanoseconds, `None` when it does not exist."""
    try:
        return os.stat(directory).st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        return None


def walk(
    top: str, prefix: str, *, clean: bool = False, dirs: dict[str, int] | None = None
) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Regular files below `top` as `(relative path, entry)`, links and temp files skipped.

    `prefix` is `top`'s path relative to the store root. With `clean`, temporary files older than
    `ORPHAN_SECONDS` are removed. With `dirs`, each directory's mtime is recorded before it is
    listed (so an entry added during the walk changes the mtime after the recorded one, and is
    noticed).
    """
    stack = [(top, prefix)]
    seen = 0
    while stack:
        directory, rel = stack.pop()
        if dirs is not None:
            stamp = mtime(directory)
            if stamp is None:
                continue
            dirs[directory] = stamp
        try:
            listing = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with listing:
            for entry in listing:
                seen += 1
                if seen > MAX_WALK_ENTRIES:
                    raise FileSystemError(
                        f"the store holds more than {MAX_WALK_ENTRIES} entries; narrow the search"
                    )
                name = entry.name
                path = f"{rel}/{name}" if rel else name
                if name.endswith(TEMP_SUFFIX):
                    if clean:
                        _drop_orphan(entry)
                elif entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, path))
                elif entry.is_file(follow_symlinks=False):
                    yield path, entry


def _drop_orphan(entry: os.DirEntry[str]) -> None:
    try:
        if time.time() - entry.stat(follow_symlinks=False).st_mtime > ORPHAN_SECONDS:
            os.unlink(entry.path)
    except OSError:
        pass


def chain(root: str, real_path: str) -> list[str]:
    """The directories from `real_path`'s parent up to `root` (those a change there touches)."""
    directories: list[str] = []
    directory = real_path.rsplit("/", 1)[0]
    while len(directory) > len(root):
        directories.append(directory)
        directory = directory.rsplit("/", 1)[0]
    directories.append(root)
    return directories


class DiskTally:
    """One store instance's record of its directory: file sizes and directory mtimes.

    `sizes` maps every regular file (relative path) to its size, `None` until the first walk;
    `dirs` maps every directory (real path) to the mtime seen by the last walk or change.
    Used under the ledger's `hold()`.
    """

    __slots__ = ("checked_at", "dirs", "made_dirs", "sizes", "synced_at", "touched_at")

    def __init__(self) -> None:
        self.sizes: dict[str, int] | None = None
        self.dirs: dict[str, int] = {}
        self.synced_at = 0.0
        self.checked_at = 0.0
        self.touched_at = 0.0
        self.made_dirs = False

    def rebuild(self, root: str) -> StoreUsage:
        """Walk the store (sweeping old temp files) and return what it holds."""
        sizes: dict[str, int] = {}
        dirs: dict[str, int] = {}
        total = 0
        for path, entry in walk(root, "", clean=True, dirs=dirs):
            size = entry.stat(follow_symlinks=False).st_size
            sizes[path] = size
            total += size
        self.sizes, self.dirs = sizes, dirs
        self.synced_at = self.checked_at = time.monotonic()
        return StoreUsage(len(sizes), total)

    def stale(self, directories: list[str], seen: dict[str, int] | None = None) -> bool:
        """Whether the disk may differ from the record: never walked, walked too long ago, or a
        directory's mtime moved (those in `directories`, and every quarter second all of them).
        `seen` holds mtimes just read (by `containment.resolve`, under the same hold): those
        directories are not `stat`ed again."""
        now = time.monotonic()
        if self.sizes is None or now - self.synced_at > FULL_RESYNC_SECONDS:
            return True
        watched: Iterable[str] = directories
        if now - self.checked_at > DIR_CHECK_SECONDS:
            watched = set(directories).union(self.dirs)
            self.checked_at = now
        recorded = self.dirs
        known = seen or {}
        for directory in watched:
            stamp = known.get(directory)
            if stamp is None:
                stamp = mtime(directory)
            if stamp != recorded.get(directory):
                return True
        return False

    def all_due(self) -> bool:
        """Whether the next `stale` checks every directory, not only those it is given."""
        return time.monotonic() - self.checked_at > DIR_CHECK_SECONDS

    def settle(self, directories: Iterable[str]) -> None:
        """Record the mtimes of the directories the store's own change just touched."""
        dirs = self.dirs
        for directory in directories:
            stamp = mtime(directory)
            if stamp is None:
                dirs.pop(directory, None)
            else:
                dirs[directory] = stamp

    def forget(self) -> None:
        """Drop the record: the next change walks the store again."""
        self.sizes = None

    def put(self, key: str, size: int) -> None:
        if self.sizes is not None:
            self.sizes[key] = size

    def drop_under(self, key: str, *, directory: bool) -> None:
        """Forget the file at `key` (O(1)), or every file below the directory `key`."""
        sizes = self.sizes
        if sizes is None:
            return
        if not directory:
            sizes.pop(key, None)
            return
        for name in [name for name in sizes if is_under(name, key)]:
            del sizes[name]

    def drop_dirs_under(self, real_path: str) -> None:
        """Forget the directory `real_path` and those below it (a deleted tree)."""
        prefix = real_path + "/"
        for directory in [d for d in self.dirs if d == real_path or d.startswith(prefix)]:
            del self.dirs[directory]

    def move(self, old: str, new: str) -> None:
        """Carry the size of a file renamed from `old` to `new` (a moved tree is `forget`)."""
        sizes = self.sizes
        if sizes is not None:
            size = sizes.pop(old, None)
            if size is not None:
                sizes[new] = size
