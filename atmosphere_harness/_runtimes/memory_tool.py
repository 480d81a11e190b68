"""Anthropic's memory tool (`memory_20250818`), durable per user.

Claude issues `view`, `create`, `str_replace`, `insert`, `delete` and `rename` against a
`/memories` tree, expecting it to outlive the conversation. With a user on the run, this tool
maps `/memories/x` to `x` in that user's durable store (`UserFiles`: per owner and user, kept
across conversations, bounded like a workspace), except `/memories/tool-output/`, which is the
conversation's own `tool-output/` (where long tool results are offloaded, so the model can page
through them with `view`). Without a user it maps onto the conversation's workspace, where the
admin surface sees the files (and they go with the conversation). Every path is
then validated by the file system itself (traversal, symlinks, NUL, bounds), and every bound is
enforced before a byte is written. Messages follow the SDK's reference implementation, which is
what the model was trained against; rejections read `Error: <reason>` like the other file tools.

It needs no SDK: the tool is plain harness machinery, and the Anthropic runtime only declares it
natively (`{"type": "memory_20250818", "name": "memory"}`) instead of sending its JSON schema.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .._errors import FileSystemError
from .._filesystem.base import AgentFileSystem, FileInfo, UserFiles
from .._tools.base import Tool, ToolContext, ToolKind

NAME = "memory"
NATIVE = {"type": "memory_20250818", "name": NAME}
ROOT = "/memories"
UNAVAILABLE = "File tools unavailable: no agent filesystem is bound to this session."
LINE_NUMBER_WIDTH = 6
VIEW_DEPTH = 2

COMMANDS = ("view", "create", "str_replace", "insert", "delete", "rename")

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "enum": list(COMMANDS), "description": "What to do."},
        "path": {"type": "string", "description": "A path under /memories."},
        "view_range": {
            "type": "array",
            "items": {"type": "integer"},
            "description": "view: [first, last] line, 1-based; last -1 means the end.",
        },
        "file_text": {"type": "string", "description": "create: the new file's content."},
        "old_str": {"type": "string", "description": "str_replace: the exact text to replace."},
        "new_str": {"type": "string", "description": "str_replace: the replacement."},
        "insert_line": {
            "type": "integer",
            "description": "insert: the line after which to insert (0 = the top).",
        },
        "insert_text": {"type": "string", "description": "insert: the text to insert."},
        "old_path": {"type": "string", "description": "rename: the current path."},
        "new_path": {"type": "string", "description": "rename: the new path."},
    },
    "required": ["command"],
}

DESCRIPTION = (
    "Your memory directory /memories, kept for the current user across conversations: view a "
    "directory or a file, create a file, str_replace or insert text, delete, or rename. "
    "/memories/tool-output/ holds this conversation's long tool results."
)


class _Rejected(ValueError):
    """A memory command the tool refuses before touching the store."""


Command = Callable[[AgentFileSystem, Mapping[str, Any]], Awaitable[str]]


def memory_tool() -> Tool:
    """A fresh memory tool; the runtime declares it natively, the executor runs it."""
    return Tool(
        name=NAME,
        description=DESCRIPTION,
        parameters=PARAMETERS,
        handler=handle,
        kind=ToolKind.EDIT,
        origin="filesystem",
        native=NATIVE,
    )


async def handle(arguments: Mapping[str, Any], context: ToolContext) -> str:
    """Run one memory command; every outcome is a message the model can act on."""
    user = context.get(UserFiles)
    fs = user.fs if user is not None else context.get(AgentFileSystem)
    if fs is None:
        return UNAVAILABLE
    command = arguments.get("command")
    run = _COMMANDS.get(command) if isinstance(command, str) else None
    if run is None:
        return f"Error: unknown memory command {command!r}; use one of {', '.join(COMMANDS)}"
    try:
        return await run(fs, arguments)
    except (FileSystemError, _Rejected) as exc:
        return f"Error: {exc}"


# --- paths ------------------------------------------------------------------------------------


def _text(arguments: Mapping[str, Any], name: str, *, blank: bool = False) -> str:
    value = arguments.get(name)
    if not isinstance(value, str) or (not blank and not value.strip()):
        raise _Rejected(f"'{name}' is required")
    return value


def _relative(path: str, *, root_ok: bool = False) -> str:
    """`/memories/a/b.md` -> `a/b.md`; the store validates the rest."""
    text = path.strip()
    if text.rstrip("/") == ROOT:
        relative = ""
    elif text.startswith(ROOT + "/"):
        relative = text[len(ROOT) + 1 :].rstrip("/")
    else:
        raise _Rejected(f"Path must start with {ROOT}, got: {path}")
    if not relative and not root_ok:
        raise _Rejected(f"Cannot modify the {ROOT} directory itself")
    return relative


async def _entry(fs: AgentFileSystem, relative: str) -> FileInfo | None:
    """The `ls` entry of `relative` in its parent, or `None` when nothing is there."""
    parent = relative.rpartition("/")[0]
    try:
        entries = await fs.ls(parent or None)
    except FileSystemError:
        return None
    for entry in entries:
        if entry.path.rstrip("/") == relative:
            return entry
    return None


def _missing(path: str) -> _Rejected:
    return _Rejected(f"The path {path} does not exist. Please provide a valid path.")


# --- commands ---------------------------------------------------------------------------------


async def _view(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
    path = _text(arguments, "path")
    relative = _relative(path, root_ok=True)
    if relative:
        entry = await _entry(fs, relative)
        if entry is None:
            raise _missing(path)
        if not entry.directory:
            return _numbered(path, await fs.read(relative), arguments.get("view_range"))
    lines = [f"-\t{ROOT}/{relative}".rstrip("/") + "/"]
    await _walk(fs, relative, 1, lines)
    shown = path.strip().rstrip("/") or ROOT
    header = (
        f"Here're the files and directories up to {VIEW_DEPTH} levels deep in {shown}, "
        "excluding hidden items:"
    )
    return "\n".join([header, *lines])


async def _walk(fs: AgentFileSystem, directory: str, depth: int, lines: list[str]) -> None:
    for entry in await fs.ls(directory or None):
        relative = entry.path.rstrip("/")
        if relative.rsplit("/", 1)[-1].startswith("."):
            continue
        if entry.directory:
            lines.append(f"-\t{ROOT}/{relative}/")
            if depth < VIEW_DEPTH:
                await _walk(fs, relative, depth + 1, lines)
        else:
            lines.append(f"{_size(entry.size)}\t{ROOT}/{relative}")


def _numbered(path: str, content: str, view_range: object) -> str:
    lines = _lines(content)
    first, last = 1, len(lines)
    if view_range is not None:
        if (
            not isinstance(view_range, list)
            or len(view_range) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in view_range)
        ):
            raise _Rejected("'view_range' must be two integers: [first, last]")
        first, last = view_range[0], view_range[1]
        if last == -1:
            last = len(lines)
        if first < 1 or last < first:
            raise _Rejected(
                f"Invalid view_range {view_range}: lines run from 1 to {len(lines)}, "
                "and last must be -1 or at least first"
            )
    numbered = [
        f"{number:>{LINE_NUMBER_WIDTH}}\t{line}"
        for number, line in enumerate(lines[first - 1 : last], start=first)
    ]
    return "\n".join([f"Here's the content of {path} with line numbers:", *numbered])


async def _create(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
    path = _text(arguments, "path")
    content = _text(arguments, "file_text", blank=True)
    relative = _relative(path)
    if await _entry(fs, relative) is not None:
        raise _Rejected(f"File {path} already exists")
    await fs.write(relative, content)
    return f"File created successfully at: {path}"


async def _str_replace(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
    path = _text(arguments, "path")
    old = _text(arguments, "old_str", blank=True)
    new = arguments.get("new_str", "")
    if not old:
        raise _Rejected("'old_str' is required")
    if not isinstance(new, str):
        raise _Rejected("'new_str' must be a string")
    relative = _relative(path)
    content = await _read_file(fs, relative, path)
    count = content.count(old)
    if count == 0:
        raise _Rejected(
            f"No replacement was performed, old_str `{old}` did not appear verbatim in {path}."
        )
    if count > 1:
        at = [str(content[:index].count("\n") + 1) for index in _positions(content, old)]
        raise _Rejected(
            f"No replacement was performed. Multiple occurrences of old_str `{old}` in lines: "
            f"{', '.join(at)}. Please ensure it is unique"
        )
    await fs.edit(relative, old, new)
    changed = content[: content.find(old)].count("\n")
    lines = (content.replace(old, new, 1)).split("\n")
    start, end = max(0, changed - 2), min(len(lines), changed + new.count("\n") + 3)
    snippet = [f"{n + 1:>{LINE_NUMBER_WIDTH}}\t{lines[n]}" for n in range(start, end)]
    return "\n".join(
        [
            "The memory file has been edited. Here is the snippet showing the change "
            "(with line numbers):",
            *snippet,
        ]
    )


async def _insert(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
    path = _text(arguments, "path")
    text = _text(arguments, "insert_text", blank=True)
    line = arguments.get("insert_line")
    if not isinstance(line, int) or isinstance(line, bool):
        raise _Rejected("'insert_line' is required (an integer)")
    relative = _relative(path)
    lines = _lines(await _read_file(fs, relative, path))
    if not 0 <= line <= len(lines):
        raise _Rejected(
            f"Invalid `insert_line` parameter: {line}. "
            f"It should be within the range [0, {len(lines)}]."
        )
    lines.insert(line, text.rstrip("\n"))
    await fs.write(relative, "\n".join(lines) + "\n")
    return f"The file {path} has been edited."


async def _delete(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
    path = _text(arguments, "path")
    relative = _relative(path)
    if await _entry(fs, relative) is None:
        raise _Rejected(f"The path {path} does not exist")
    await fs.delete(relative)
    return f"Successfully deleted {path}"


async def _rename(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
    old_path = _text(arguments, "old_path")
    new_path = _text(arguments, "new_path")
    old, new = _relative(old_path), _relative(new_path)
    if await _entry(fs, old) is None:
        raise _Rejected(f"The path {old_path} does not exist")
    if await _entry(fs, new) is not None:
        raise _Rejected(f"The destination {new_path} already exists")
    await fs.rename(old, new)
    return f"Successfully renamed {old_path} to {new_path}"


_COMMANDS: dict[str, Command] = {
    "view": _view,
    "create": _create,
    "str_replace": _str_replace,
    "insert": _insert,
    "delete": _delete,
    "rename": _rename,
}


# --- helpers ----------------------------------------------------------------------------------


async def _read_file(fs: AgentFileSystem, relative: str, path: str) -> str:
    entry = await _entry(fs, relative)
    if entry is None:
        raise _missing(path)
    if entry.directory:
        raise _Rejected(f"The path {path} is not a file.")
    return await fs.read(relative)


def _lines(content: str) -> list[str]:
    """Lines split on LF, without the empty tail a final newline leaves."""
    lines = content.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _positions(content: str, needle: str) -> list[int]:
    found, start = [], content.find(needle)
    while start != -1:
        found.append(start)
        start = content.find(needle, start + 1)
    return found


def _size(size: int) -> str:
    """1536 -> `1.5K`, as the SDK's reference listing prints sizes."""
    value = float(size)
    for unit in ("B", "K", "M"):
        if value < 1024:
            return f"{int(value)}{unit}" if value == int(value) else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}G"
