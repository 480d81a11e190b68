"""Containment on the disk: where a validated relative path really lands, symlinks included.

`paths.check_path` proves a path well formed as text; `resolve` proves it stays inside the store.
It walks the path one `lstat` at a time from the store's real root, and follows a symlink only if
its real target stays inside that root, for existing and new targets alike: a symlinked directory
planted in the store can redirect neither a read nor a write outside it. (A process with write
access to the store that swaps a directory for a link *during* an operation is out of scope: it
already owns the host.)
"""

from __future__ import annotations

import os
import stat

from .._errors import FileSystemError


def inside(path: str, root: str) -> bool:
    """Whether the real path `path` is `root` or below it (both absolute, no trailing `/`)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def resolve(
    root: str, rel: str, echo: str, *, follow: bool, mtimes: dict[str, int] | None = None
) -> tuple[str, os.stat_result | None]:
    """The real path of `rel` under the real root `root` and its `lstat` (`None` when missing),
    proven to stay inside.

    Segments are checked one `lstat` at a time; a link is resolved (and its target checked)
    when it is an intermediate segment, or the final one with `follow`. `echo` is the path as
    the caller gave it, for the error message (never a host path). `mtimes`, when given,
    receives the mtime of each directory passed on the way (its real path: those `lstat`
    found to be directories), which a change's check of the directories on its path
    (`tally.DiskTally.stale`) then need not `stat` again.
    """
    current = root
    parts = rel.split("/")
    last = len(parts) - 1
    for index, part in enumerate(parts):
        candidate = f"{current}/{part}"
        try:
            info = os.lstat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            return "/".join([candidate, *parts[index + 1 :]]), None
        if stat.S_ISLNK(info.st_mode) and (follow or index < last):
            target = os.path.realpath(candidate)
            if not inside(target, root):
                raise FileSystemError(f"Path escapes the store root via a link: {echo}")
            if target == root:
                raise FileSystemError(f"Path resolves to the store root: {echo}")
            current = target
            if index == last:
                try:
                    return target, os.stat(target)
                except (FileNotFoundError, NotADirectoryError):
                    return target, None
            continue
        current = candidate
        if index == last:
            return current, info
        if mtimes is not None and stat.S_ISDIR(info.st_mode):
            mtimes[current] = info.st_mtime_ns
    raise AssertionError("unreachable")  # pragma: no cover
