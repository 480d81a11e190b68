"""`WorkspaceAgentFileSystem`: a bounded file store in one directory on disk.

What it guarantees, whatever the caller does:

- **Containment.** Every path is validated (`paths.check_path`), then resolved one segment at a
  time; a symlink is followed only if its real target stays inside the store's real root, for
  existing and new targets alike, so a symlinked directory planted in the store cannot redirect a
  read or a write outside it. `ls`, `glob` and `grep` never follow links, and the tally ignores
  them. (A process with write access to the store that swaps a directory for a link *during* an
  operation is out of scope: it already owns the host.)
- **Bounds before bytes.** Per-file size, file count and total size are checked before a write
  or an edit touches the disk, with the reference's messages; a rejected write changes nothing.
- **Atomic writes.** Content goes to a temporary file in the target's directory, then
  `os.replace` swaps it in, so readers (which take no lock) see the old or the new file and a
  crash never leaves a torn one. `fsync=True` also flushes the file and its directory before
  returning (about 1 ms per write on the reference machine, ten times the write itself), for
  stores that must survive a power cut; the default relies on the OS write-back.
- **Exact accounting.** One lock per store directory (shared by every instance on that
  directory in the process) serializes `write`, `edit`, `delete` and `rename`; a running tally of
  file sizes makes the bounds check O(1) instead of a walk per write. The tally stays true when
  files change on disk behind the store's back: a directory's mtime changes whenever an entry is
  added, removed or renamed in it, so each write compares the mtimes of the directories on its
  path (and, at most every `DIR_CHECK_SECONDS`, of every directory) with the ones it recorded,
  and rebuilds the tally by a walk on any difference. A file resized in place is caught when it
  is the target (its size disagrees with the tally) and by a full walk at least every
  `FULL_RESYNC_SECONDS` (as is a change made within the same clock tick, a few milliseconds,
  as the store's own write in that directory). Before rejecting a write the tally is always
  rebuilt, so a stale tally never causes a wrong rejection.
- **Nothing is created by a read.** The root directory appears on the first write; `ls`,
  `read`, `glob` and `grep` of a store that was never written see an empty store.

Blocking work runs in a worker thread, one hop per operation.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import TypeVar

from ..ids import check_conversation_id
from .base import (
    FileInfo,
    FileNotFoundInWorkspace,
    FileSystemError,
    FileSystemLimits,
    GrepHit,
)
from .globbing import compile_glob, literal_prefix
from .paths import TEMP_SUFFIX, check_dir, check_path, is_under, shown
from .search import Deadline, LinePattern, clip, compile_pattern, search_file

T = TypeVar("T")

FULL_RESYNC_SECONDS = 30.0
"""Oldest usage tally a write trusts without re-walking the whole store."""

DIR_CHECK_SECONDS = 0.25
"""How often a write also checks every directory's mtime, not only those on its own path."""

TOUCH_SECONDS = 1.0
"""Granularity of the root's mtime as the store's last-write time (the provider's LRU order)."""

ORPHAN_SECONDS = 60.0
"""Temporary files older than this, left by a crash mid-write, are removed by the next walk."""

MAX_WALK_ENTRIES = 100_000
"""Most directory entries one walk visits (a store filled from outside cannot stall a call)."""

_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class StoreUsage:
    """How much of its bounds a store uses."""

    files: int
    bytes: int


class _Tally:
    """The lock and the usage accounting of one store directory.

    `sizes` maps every regular file (relative path) to its size, `None` until the first walk;
    `dirs` maps every directory (real path) to the mtime seen by the last walk or write.
    """

    __slots__ = (
        "__weakref__",
        "checked_at",
        "dirs",
        "lock",
        "made_dirs",
        "sizes",
        "synced_at",
        "total",
        "touched_at",
    )

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sizes: dict[str, int] | None = None
        self.dirs: dict[str, int] = {}
        self.total = 0
        self.synced_at = 0.0
        self.checked_at = 0.0
        self.touched_at = 0.0
        self.made_dirs = False

    def put(self, key: str, size: int) -> None:
        assert self.sizes is not None
        self.total += size - self.sizes.get(key, 0)
        self.sizes[key] = size

    def drop_under(self, key: str) -> None:
        assert self.sizes is not None
        for name in [name for name in self.sizes if is_under(name, key)]:
            self.total -= self.sizes.pop(name)

    def move(self, old: str, new: str) -> None:
        assert self.sizes is not None
        moved = {name: size for name, size in self.sizes.items() if is_under(name, old)}
        for name, size in moved.items():
            del self.sizes[name]
            self.sizes[new + name[len(old) :]] = size


_TALLIES: weakref.WeakValueDictionary[str, _Tally] = weakref.WeakValueDictionary()
_TALLIES_LOCK = threading.Lock()


def store_key(root: str | os.PathLike[str]) -> str:
    """The absolute path that identifies a store directory."""
    return os.path.abspath(os.path.expanduser(os.fspath(root)))


def _tally_for(key: str) -> _Tally:
    with _TALLIES_LOCK:
        tally = _TALLIES.get(key)
        if tally is None:
            tally = _Tally()
            _TALLIES[key] = tally
        return tally


def is_live(root: str | os.PathLike[str]) -> bool:
    """True while some `WorkspaceAgentFileSystem` on `root` exists in this process."""
    with _TALLIES_LOCK:
        return store_key(root) in _TALLIES


def conversation_dir_name(conversation_id: str) -> str:
    """A conversation id checked for use as a directory name."""
    if not isinstance(conversation_id, str) or not conversation_id.strip():
        raise FileSystemError("conversationId must not be blank")
    try:
        return check_conversation_id(conversation_id)
    except ValueError as exc:
        raise FileSystemError(f"{exc}: {shown(conversation_id)}") from None


def _mtime(directory: str) -> int | None:
    try:
        return os.stat(directory).st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        return None


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


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

    `on_create` is called (in the worker thread, under the store lock) just before the first
    write creates the root directory; the provider uses it to apply its conversation cap.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        limits: FileSystemLimits | None = None,
        *,
        fsync: bool = False,
        on_create: Callable[[], None] | None = None,
    ) -> None:
        self._root = store_key(root)
        self.root = Path(self._root)
        self.limits = limits or FileSystemLimits()
        self.fsync = fsync
        self._on_create = on_create
        self._tally = _tally_for(self._root)
        self._real_root: str | None = None

    @classmethod
    def for_conversation(
        cls,
        agent_root: str | os.PathLike[str],
        conversation_id: str,
        limits: FileSystemLimits | None = None,
        *,
        fsync: bool = False,
        on_create: Callable[[], None] | None = None,
    ) -> WorkspaceAgentFileSystem:
        """The store of one conversation: `{agent_root}/files/{conversation_id}/`."""
        name = conversation_dir_name(conversation_id)
        return cls(Path(agent_root) / "files" / name, limits, fsync=fsync, on_create=on_create)

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
        return await self._run("read", shown(path), self._read, rel, shown(path))

    async def write(self, path: str, content: str) -> None:
        rel = check_path(path)
        echo = shown(path)
        data = self._encode(content, echo)
        await self._run("write", echo, self._locked, self._write, rel, echo, data)

    async def edit(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        rel = check_path(path)
        echo = shown(path)
        if not isinstance(old_text, str) or old_text == "":
            raise FileSystemError("old_text must not be empty")
        if not isinstance(new_text, str):
            raise FileSystemError("new_text must be a string")
        return await self._run(
            "edit", echo, self._locked, self._edit, rel, echo, old_text, new_text, replace_all
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
        await self._run("delete", echo, self._locked, self._delete, rel, echo)

    async def rename(self, old_path: str, new_path: str) -> None:
        old_rel, new_rel = check_path(old_path), check_path(new_path)
        old_echo, new_echo = shown(old_path), shown(new_path)
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

    async def usage(self) -> StoreUsage:
        """Files and bytes the store holds now (a fresh walk)."""

        def measure() -> StoreUsage:
            self._sync()
            assert self._tally.sizes is not None
            return StoreUsage(len(self._tally.sizes), self._tally.total)

        return await self._run("measure", ".", self._locked, measure)

    # --- machinery -------------------------------------------------------------------------

    async def _run(self, action: str, echo: str, fn: Callable[..., T], *args: object) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except FileSystemError:
            raise
        except OSError as exc:
            raise _failed(action, echo, exc) from None

    def _locked(self, fn: Callable[..., T], *args: object) -> T:
        with self._tally.lock:
            try:
                return fn(*args)
            except OSError:
                self._tally.sizes = None  # the disk may differ from the tally now
                raise

    def _encode(self, content: str, echo: str) -> bytes:
        if content is None:
            raise FileSystemError("content must not be null")
        if not isinstance(content, str):
            raise FileSystemError(f"content must be text, got {type(content).__name__}")
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise FileSystemError(
                f"Write rejected: the content for {echo} is not valid Unicode text"
            ) from None
        self._check_size(echo, len(data))
        return data

    def _check_size(self, echo: str, size: int) -> None:
        limit = self.limits.max_file_bytes
        if size > limit:
            raise FileSystemError(
                f"Write rejected: {echo} would be {size} bytes, "
                f"over the {limit}-byte per-file limit"
            )

    def _real(self) -> str:
        """The root's real path (symlinks of its ancestors resolved), cached once it exists."""
        if self._real_root is not None:
            return self._real_root
        real = os.path.realpath(self._root)
        if os.path.isdir(real):
            self._real_root = real
        return real

    def _key(self, real_path: str) -> str:
        return real_path[len(self._real()) + 1 :]

    def _resolve(self, rel: str, echo: str, *, follow: bool) -> tuple[str, os.stat_result | None]:
        """The real path of `rel` and its `lstat` (`None` when missing), proven to stay inside.

        Segments are checked one `lstat` at a time; a link is resolved (and its target checked)
        when it is an intermediate segment, or the final one with `follow`.
        """
        root = self._real()
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
                if not _inside(target, root):
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
        raise AssertionError("unreachable")  # pragma: no cover

    def _walk(
        self, top: str, prefix: str, *, clean: bool = False, dirs: dict[str, int] | None = None
    ) -> Iterator[tuple[str, os.DirEntry[str]]]:
        """Regular files below `top` as `(relative path, entry)`, links and temp files skipped.

        With `dirs`, each directory's mtime is recorded before it is listed (so an entry added
        during the walk changes the mtime after the recorded one, and is noticed).
        """
        stack = [(top, prefix)]
        seen = 0
        while stack:
            directory, rel = stack.pop()
            if dirs is not None:
                mtime = _mtime(directory)
                if mtime is None:
                    continue
                dirs[directory] = mtime
            try:
                listing = os.scandir(directory)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with listing:
                for entry in listing:
                    seen += 1
                    if seen > MAX_WALK_ENTRIES:
                        raise FileSystemError(
                            f"the store holds more than {MAX_WALK_ENTRIES} entries; "
                            "narrow the search"
                        )
                    name = entry.name
                    path = f"{rel}/{name}" if rel else name
                    if name.endswith(TEMP_SUFFIX):
                        if clean:
                            self._drop_orphan(entry)
                    elif entry.is_dir(follow_symlinks=False):
                        stack.append((entry.path, path))
                    elif entry.is_file(follow_symlinks=False):
                        yield path, entry

    @staticmethod
    def _drop_orphan(entry: os.DirEntry[str]) -> None:
        try:
            if time.time() - entry.stat(follow_symlinks=False).st_mtime > ORPHAN_SECONDS:
                os.unlink(entry.path)
        except OSError:
            pass

    def _sync(self) -> None:
        """Rebuild the tally from the disk (called under the store lock)."""
        sizes: dict[str, int] = {}
        dirs: dict[str, int] = {}
        total = 0
        for path, entry in self._walk(self._real(), "", clean=True, dirs=dirs):
            size = entry.stat(follow_symlinks=False).st_size
            sizes[path] = size
            total += size
        tally = self._tally
        tally.sizes, tally.dirs, tally.total = sizes, dirs, total
        tally.synced_at = tally.checked_at = time.monotonic()

    def _chain(self, real_path: str) -> list[str]:
        """The directories from `real_path`'s parent up to the root (those a write changes)."""
        root = self._real()
        chain: list[str] = []
        directory = real_path.rsplit("/", 1)[0]
        while len(directory) > len(root):
            chain.append(directory)
            directory = directory.rsplit("/", 1)[0]
        chain.append(root)
        return chain

    def _trust(self, chain: list[str]) -> bool:
        """Make the tally match the disk; True when it was just rebuilt by a walk."""
        tally = self._tally
        now = time.monotonic()
        if tally.sizes is None or now - tally.synced_at > FULL_RESYNC_SECONDS:
            self._sync()
            return True
        watched: list[str] | set[str] = chain
        if now - tally.checked_at > DIR_CHECK_SECONDS:
            watched = set(chain).union(tally.dirs)
            tally.checked_at = now
        if any(_mtime(directory) != tally.dirs.get(directory) for directory in watched):
            self._sync()
            return True
        return False

    def _settle(self, chain: list[str] | set[str]) -> None:
        """Record the mtimes of the directories this store's own operation just changed."""
        dirs = self._tally.dirs
        for directory in chain:
            mtime = _mtime(directory)
            if mtime is None:
                dirs.pop(directory, None)
            else:
                dirs[directory] = mtime

    def _admit(
        self, key: str, echo: str, new_size: int, old_size: int | None, chain: list[str]
    ) -> None:
        """Raise unless writing `new_size` bytes at `key` keeps the store within its bounds."""
        tally = self._tally
        fresh = self._trust(chain)
        assert tally.sizes is not None
        if not fresh and tally.sizes.get(key) != old_size:
            self._sync()
            fresh = True
        problem = self._over(echo, new_size, old_size)
        if problem and not fresh:
            self._sync()
            problem = self._over(echo, new_size, old_size)
        if problem:
            raise FileSystemError(problem)

    def _over(self, echo: str, new_size: int, old_size: int | None) -> str | None:
        tally = self._tally
        assert tally.sizes is not None
        limits = self.limits
        count = len(tally.sizes)
        if old_size is None and count >= limits.max_files:
            return (
                f"Write rejected: the store already holds {count} files, "
                f"at the {limits.max_files}-file limit"
            )
        projected = tally.total - (old_size or 0) + new_size
        if projected > limits.max_total_bytes:
            return (
                f"Write rejected: {echo} would bring the store to {projected} bytes, "
                f"over the {limits.max_total_bytes}-byte total limit"
            )
        return None

    def _make_dirs(self, directory: str, echo: str) -> None:
        if self._on_create is not None and not os.path.isdir(self._root):
            self._on_create()
        self._tally.made_dirs = True
        try:
            os.makedirs(directory, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise FileSystemError(f"Cannot write {echo}: a parent of it is a file") from None

    def _store(self, target: str, data: bytes, echo: str) -> None:
        """Write `data` to `target` atomically: a temp file in the same directory, then rename."""
        parent, name = target.rsplit("/", 1)
        temp = f"{parent}/.{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        try:
            fd = os.open(temp, _WRITE_FLAGS, 0o666)
        except FileNotFoundError:
            self._make_dirs(parent, echo)
            fd = os.open(temp, _WRITE_FLAGS, 0o666)
        except NotADirectoryError:
            raise FileSystemError(f"Cannot write {echo}: a parent of it is a file") from None
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, target)
        except BaseException:
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise
        if self.fsync:
            directory = os.open(parent, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

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
        self._settle(changed)

    @staticmethod
    def _read_bytes(path: str, limit: int) -> bytes | None:
        """The bytes of `path`, or `None` if it holds more than `limit` bytes.

        One read of the size `fstat` reports (plus one byte, to notice a file still growing)
        instead of a `limit`-sized buffer per file.
        """
        fd = os.open(path, _READ_FLAGS)
        try:
            size = os.fstat(fd).st_size
            if size > limit:
                return None
            chunks = [os.read(fd, size + 1)]
            total = len(chunks[0])
            while total > size:  # it grew since fstat: read on to the end, or past the limit
                if total > limit:
                    return None
                chunk = os.read(fd, limit + 1 - total)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            os.close(fd)

    def _text(self, target: str, info: os.stat_result, echo: str) -> str:
        limit = self.limits.max_file_bytes
        data = None if info.st_size > limit else self._read_bytes(target, limit)
        if data is None:
            size = max(info.st_size, limit + 1)
            raise FileSystemError(f"File too large to read: {echo} is {size} bytes (limit {limit})")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise FileSystemError(f"Cannot read {echo}: it is not UTF-8 text") from None

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

    def _write(self, rel: str, echo: str, data: bytes) -> None:
        target, info = self._resolve(rel, echo, follow=True)
        if info is not None and stat.S_ISDIR(info.st_mode):
            raise FileSystemError(f"Cannot write {echo}: it is a directory")
        old_size = info.st_size if info is not None and stat.S_ISREG(info.st_mode) else None
        key = self._key(target)
        chain = self._chain(target)
        self._admit(key, echo, len(data), old_size, chain)
        self._store(target, data, echo)
        self._tally.put(key, len(data))
        self._touch(target)

    def _edit(self, rel: str, echo: str, old: str, new: str, replace_all: bool) -> int:
        target, info = self._resolve(rel, echo, follow=True)
        if info is None or not stat.S_ISREG(info.st_mode):
            raise FileNotFoundInWorkspace(f"File not found: {echo}")
        text = self._text(target, info, echo)
        count = text.count(old)
        if count == 0:
            raise FileSystemError(f"old_text not found in {echo} — nothing was changed")
        if count > 1 and not replace_all:
            raise FileSystemError(
                f"old_text matches {count} times in {echo} — it must match exactly once; "
                "include more surrounding context, or pass replace_all to replace every match"
            )
        updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        if updated != text:
            data = updated.encode("utf-8")
            self._check_size(echo, len(data))
            key = self._key(target)
            chain = self._chain(target)
            self._admit(key, echo, len(data), info.st_size, chain)
            self._store(target, data, echo)
            self._tally.put(key, len(data))
            self._touch(target)
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
        return sorted(path for path, _ in self._walk(top, prefix) if matcher.fullmatch(path))

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
        for path, entry in sorted(self._walk(top, rel), key=itemgetter(0)):
            deadline.remaining()
            try:
                data = self._read_bytes(entry.path, max_bytes)
            except OSError:
                continue
            found = (
                None if data is None else search_file(pattern, data, limit - len(hits), deadline)
            )
            if found:
                hits.extend(GrepHit(path, number, clip(line)) for number, line in found)
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
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(target)
            for directory in [d for d in self._tally.dirs if _inside(d, target)]:
                del self._tally.dirs[directory]
        else:
            os.unlink(target)
        self._tally.drop_under(key)
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
            self._tally.sizes = None  # a moved tree: the next write re-walks
        else:
            self._tally.move(old_key, new_key)
        self._touch(source, destination)
