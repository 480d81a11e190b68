"""A small in-memory `AgentFileSystem` for the memory-tool tests.

It follows the protocol's contract (relative forward-slash paths, `FileSystemError` with a
model-facing message, atomic whole-file writes, `ls` entries relative to the root, directories
first) without any disk; the workspace implementation is exercised by the end-to-end test.
"""

from __future__ import annotations

import fnmatch
import re

from atmosphere_harness._errors import FileNotFoundInWorkspace, FileSystemError
from atmosphere_harness._filesystem.base import FileInfo, GrepHit


def _check(path: str) -> str:
    if not isinstance(path, str) or not path.strip():
        raise FileSystemError("path must not be blank")
    text = path.strip()
    if "\0" in text:
        raise FileSystemError(f"path must not contain NUL: {path!r}")
    if "\\" in text:
        raise FileSystemError(f"path must use forward slashes: {path}")
    if text.startswith("/"):
        raise FileSystemError(f"path must be relative: {path}")
    for segment in text.split("/"):
        if segment in ("", ".", ".."):
            raise FileSystemError(f"path contains an illegal segment ('{segment}'): {path}")
    return text


class DictFileSystem:
    def __init__(self, max_file_bytes: int = 1024) -> None:
        self.files: dict[str, str] = {}
        self.max_file_bytes = max_file_bytes

    def _dirs(self) -> set[str]:
        dirs: set[str] = set()
        for path in self.files:
            parts = path.split("/")[:-1]
            dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        return dirs

    async def ls(self, dir: str | None = None) -> list[FileInfo]:
        base = "" if dir in (None, "", ".") else _check(dir)
        if base in self.files:
            raise FileSystemError(f"not a directory: {dir}")
        prefix = base + "/" if base else ""
        dirs = sorted(
            d for d in self._dirs() if d.startswith(prefix) and "/" not in d[len(prefix) :]
        )
        files = sorted(
            f for f in self.files if f.startswith(prefix) and "/" not in f[len(prefix) :]
        )
        return [FileInfo(d, 0, True) for d in dirs] + [
            FileInfo(f, len(self.files[f].encode()), False) for f in files
        ]

    async def read(self, path: str) -> str:
        key = _check(path)
        if key not in self.files:
            raise FileNotFoundInWorkspace(f"File not found: {path}")
        return self.files[key]

    async def write(self, path: str, content: str) -> None:
        key = _check(path)
        if key in self._dirs():
            raise FileSystemError(f"is a directory: {path}")
        size = len(content.encode())
        if size > self.max_file_bytes:
            raise FileSystemError(
                f"Write rejected: {path} would be {size} bytes, over the "
                f"{self.max_file_bytes}-byte per-file limit"
            )
        self.files[key] = content

    async def edit(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        content = await self.read(path)
        count = content.count(old_text)
        if count == 0:
            raise FileSystemError(f"old_text not found in {path}")
        if count > 1 and not replace_all:
            raise FileSystemError(f"old_text appears {count} times in {path}")
        await self.write(path, content.replace(old_text, new_text))
        return count

    async def glob(self, pattern: str) -> list[str]:
        return sorted(f for f in self.files if fnmatch.fnmatch(f, pattern))

    async def grep(self, pattern: str, dir: str | None = None) -> list[GrepHit]:
        regex = re.compile(pattern)
        return [
            GrepHit(path, number, line)
            for path, text in sorted(self.files.items())
            for number, line in enumerate(text.split("\n"), start=1)
            if regex.search(line)
        ]

    async def delete(self, path: str) -> None:
        key = _check(path)
        doomed = [f for f in self.files if f == key or f.startswith(key + "/")]
        if not doomed:
            raise FileNotFoundInWorkspace(f"File not found: {path}")
        for name in doomed:
            del self.files[name]

    async def rename(self, old_path: str, new_path: str) -> None:
        old, new = _check(old_path), _check(new_path)
        if new in self.files or new in self._dirs():
            raise FileSystemError(f"destination exists: {new_path}")
        moved = {f: new + f[len(old) :] for f in self.files if f == old or f.startswith(old + "/")}
        if not moved:
            raise FileNotFoundInWorkspace(f"File not found: {old_path}")
        for source, target in moved.items():
            self.files[target] = self.files.pop(source)
