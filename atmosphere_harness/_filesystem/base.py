"""The `AgentFileSystem` protocol: a conversation's bounded workspace, as tools and runtimes see it.

Paths are always relative, forward-slash, inside the store (`notes/todo.md`); every
implementation validates them and enforces its `FileSystemLimits` before writing a byte. A
rejected operation raises `FileSystemError` with a message written for the model; the file tools
return it as `Error: <message>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .._errors import FileSystemError
from .._limits import KIB, MIB, FileSystemLimits

__all__ = [
    "KIB",
    "MIB",
    "AgentFileSystem",
    "FileInfo",
    "FileSystemLimits",
    "GrepHit",
    "UserFiles",
]


def encode_content(content: str, echo: str, limits: FileSystemLimits) -> bytes:
    """`content` as UTF-8 within the per-file limit, or the `FileSystemError` every workspace
    backend answers (`echo` is the path as the model wrote it)."""
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
    check_file_size(echo, len(data), limits)
    return data


def check_file_size(echo: str, size: int, limits: FileSystemLimits) -> None:
    """Reject a file that would be over the per-file limit (a write or an edit's result)."""
    limit = limits.max_file_bytes
    if size > limit:
        raise FileSystemError(
            f"Write rejected: {echo} would be {size} bytes, over the {limit}-byte per-file limit"
        )


def check_matches(echo: str, count: int, replace_all: bool) -> None:
    """Reject an edit whose `old_text` matches `count` times: none, or more than one without
    `replace_all` (every store says it in the same words)."""
    if count == 0:
        raise FileSystemError(f"old_text not found in {echo} — nothing was changed")
    if count > 1 and not replace_all:
        raise FileSystemError(
            f"old_text matches {count} times in {echo} — it must match exactly once; "
            "include more surrounding context, or pass replace_all to replace every match"
        )


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One `ls` entry: a path relative to the store root; size is 0 for directories."""

    path: str
    size: int
    directory: bool


@dataclass(frozen=True, slots=True)
class GrepHit:
    """One matching line: relative path, 1-based line number, line text (possibly truncated)."""

    path: str
    line: int
    text: str


@runtime_checkable
class AgentFileSystem(Protocol):
    """A bounded file store. Every method is async and safe to call concurrently."""

    async def ls(self, dir: str | None = None) -> list[FileInfo]:
        """Direct children of `dir` (the root when `None`, blank or `.`): directories first."""
        ...

    async def read(self, path: str) -> str:
        """The whole UTF-8 text of a file."""
        ...

    async def write(self, path: str, content: str) -> None:
        """Create or replace a file atomically (parents are created)."""
        ...

    async def edit(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """Replace `old_text` (exactly once unless `replace_all`); returns the replacements."""
        ...

    async def glob(self, pattern: str) -> list[str]:
        """Relative paths of the files matching `pattern`, sorted."""
        ...

    async def grep(self, pattern: str, dir: str | None = None) -> list[GrepHit]:
        """Lines matching the regex `pattern`, capped at the store's grep limit."""
        ...

    async def delete(self, path: str) -> None:
        """Remove a file, or a directory with everything below it."""
        ...

    async def rename(self, old_path: str, new_path: str) -> None:
        """Move a file or directory; the destination must not exist."""
        ...


@dataclass(frozen=True, slots=True)
class UserFiles:
    """The current user's durable files, as Claude's native memory tool (`/memories`) sees them.

    `fs` keeps what is written for the user across conversations (per owner and user); its
    `tool-output/` route is the conversation's workspace, where long tool results are offloaded,
    so the model can page through them with the same tool. Injected only when the run has a
    user; without one the memory tool falls back to the conversation's workspace.
    """

    fs: AgentFileSystem
    user_id: str
