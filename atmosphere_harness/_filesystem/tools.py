"""The eight built-in file tools the model calls: `ls`, `read_file`, `write_file`, `edit_file`,
`glob`, `grep`, `delete`, `rename`.

Each tool works on the run's `AgentFileSystem` (already scoped to the conversation) and always
returns text the model can act on: Atmosphere's success lines (`Wrote notes/a.md`, `(empty)`,
`(no matches)`), or `Error: <reason>` for anything the store rejects. Nothing raises into the run.

`read_file` pages: without `offset`/`limit` it returns the whole file when it fits the tool-output
budget (the offload threshold), otherwise the first lines that fit and the offset to continue
from. That is how an offloaded tool output is read back, and why `read_file` itself is never
offloaded.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import FileSystemError
from .._settings import DEFAULT_OFFLOAD_THRESHOLD
from .._tools.base import Batch, HistoryArguments, Prefetch, Tool, ToolContext, ToolKind
from .base import AgentFileSystem

if TYPE_CHECKING:
    from .._contracts import Run

ORIGIN = "filesystem"
UNAVAILABLE = "File tools unavailable: no agent filesystem is bound to this session."
FILE_TOOL_NAMES = ("ls", "read_file", "write_file", "edit_file", "glob", "grep", "delete", "rename")

_EOL = re.compile(r"\r\n|\r|\n")

Operation = Callable[[AgentFileSystem, Mapping[str, Any]], Awaitable[str]]


def bound_file_system(run: Run) -> AgentFileSystem | None:
    """The run's conversation-scoped filesystem, if the primitive (or the host) bound one."""
    found: AgentFileSystem | None = run.resolve(AgentFileSystem)
    return found


def _required(arguments: Mapping[str, Any], name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str) or not value.strip():
        raise FileSystemError(f"'{name}' is required")
    return value


def _optional_int(arguments: Mapping[str, Any], name: str, minimum: int) -> int | None:
    value = arguments.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise FileSystemError(f"'{name}' must be an integer >= {minimum}")
    return value


def _line_ends(text: str) -> Iterator[int]:
    """The offset just past each line (`\\n`, `\\r\\n` or `\\r`, as grep counts them)."""
    pos = 0
    for match in _EOL.finditer(text):
        pos = match.end()
        yield pos
    if pos < len(text):
        yield len(text)


def _span_by_lines(
    text: str, start: int, limit: int | None, budget: int
) -> tuple[int, int, int, int]:
    """`(begin, stop, end line, total lines)` of a window, walking line by line (any newline)."""
    ends = list(_line_ends(text))
    if start >= len(ends):
        return len(text), len(text), len(ends), len(ends)
    begin = ends[start - 1] if start else 0
    end = start
    stop = begin
    for position in ends[start:]:
        if limit is not None and end - start >= limit:
            break
        if limit is None and budget > 0 and end > start and position - begin > budget:
            break
        stop, end = position, end + 1
    return begin, stop, end, len(ends)


def _span(text: str, start: int, limit: int | None, budget: int) -> tuple[int, int, int, int]:
    """The same window as `_span_by_lines`, with C-level string calls when lines end in `\\n`."""
    if "\r" in text:
        return _span_by_lines(text, start, limit, budget)
    size = len(text)
    total = text.count("\n") + (1 if text and text[-1] != "\n" else 0)
    if start >= total:
        return size, size, total, total
    cut = start + (limit or 0)
    parts = text.split("\n", cut)
    begin = sum(map(len, parts[:start])) + start
    if limit is not None:
        stop = size if len(parts) <= cut else sum(map(len, parts[:cut])) + cut
    elif budget <= 0 or size - begin <= budget:
        stop = size
    else:
        newline = text.rfind("\n", begin, begin + budget)
        if newline < 0:
            newline = text.find("\n", begin)
        stop = size if newline < 0 else newline + 1
    end = start + text.count("\n", begin, stop) + (1 if stop == size and text[-1] != "\n" else 0)
    return begin, stop, end, total


def read_window(text: str, path: str, offset: int | None, limit: int | None, budget: int) -> str:
    """The part of `text` that `read_file` returns (see the module docstring)."""
    if offset is None and limit is None and (budget <= 0 or len(text) <= budget):
        return text
    start = offset or 0
    begin, stop, end, total = _span(text, start, limit, budget)
    if start and start >= total:
        raise FileSystemError(f"offset {start} is past the end of {path} ({total} lines)")
    body = text[begin:stop]
    if end >= total:
        return body
    return (
        f"{body}\n[read_file: lines {start + 1}-{end} of {total} shown; "
        f"call read_file with offset={end} to read on]"
    )


def _nothing() -> None:
    return None


async def prefetch_reads(arguments: Sequence[Any], run: Run) -> Callable[[], None]:
    """`read_file`'s prefetch: the files of a message's consecutive reads, in one hop.

    Only a store that can (`WorkspaceAgentFileSystem.prefetch`) is asked; each `read_file`
    then takes its text from what was read, on the event loop, and answers exactly what a read
    of its own would have. What is left unread is freed after the run of calls.
    """
    fs = bound_file_system(run)
    prefetch = getattr(fs, "prefetch", None)
    drop = getattr(fs, "drop_prefetched", None)
    if prefetch is None or drop is None:
        return _nothing
    paths = [
        item.get("path")
        for item in arguments
        if isinstance(item, Mapping) and isinstance(item.get("path"), str)
    ]
    if not paths:
        return _nothing
    await prefetch(paths)
    release: Callable[[], None] = drop
    return release


async def write_batch(arguments: Sequence[Mapping[str, Any]], run: Run) -> list[Any]:
    """`write_file`'s batch: a message's consecutive writes in one worker-thread hop.

    Only a store that can (`WorkspaceAgentFileSystem.write_many`) writes them together; any
    other runs them one by one. Either way each call gets exactly what its own `write_file`
    would have answered, in order.
    """
    fs = bound_file_system(run)
    if fs is None:
        return [UNAVAILABLE] * len(arguments)
    results: list[Any] = [None] * len(arguments)
    wanted: list[tuple[int, str, str]] = []
    for position, item in enumerate(arguments):
        try:
            path = _required(item, "path")
        except FileSystemError as exc:
            results[position] = f"Error: {exc}"
            continue
        content = item.get("content")
        wanted.append((position, path, "" if content is None else content))
    write_many = getattr(fs, "write_many", None)
    if write_many is None:
        errors: list[Exception | None] = []
        for _, path, content in wanted:
            try:
                await fs.write(path, content)
            except Exception as exc:
                errors.append(exc)
            else:
                errors.append(None)
    else:
        errors = await write_many([(path, content) for _, path, content in wanted])
    for (position, path, _), error in zip(wanted, errors, strict=True):
        if error is None:
            results[position] = f"Wrote {path}"
        elif isinstance(error, FileSystemError):
            results[position] = f"Error: {error}"
        else:
            results[position] = error
    return results


def _tool(
    name: str,
    description: str,
    kind: ToolKind,
    properties: dict[str, Any],
    required: list[str],
    operation: Operation,
    history_arguments: HistoryArguments | None = None,
    prefetch: Prefetch | None = None,
    batch: Batch | None = None,
) -> Tool:
    async def handler(arguments: Mapping[str, Any], context: ToolContext) -> str:
        fs = bound_file_system(context.run)
        if fs is None:
            return UNAVAILABLE
        try:
            return await operation(fs, arguments)
        except FileSystemError as exc:
            return f"Error: {exc}"

    parameters = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return Tool(
        name=name,
        description=description,
        parameters=parameters,
        handler=handler,
        kind=kind,
        origin=ORIGIN,
        history_arguments=history_arguments,
        prefetch=prefetch,
        batch=batch,
    )


def written_note(limit: int) -> HistoryArguments:
    """How history keeps a `write_file` call: a note in place of a content over `limit` chars.

    The workspace holds that content: a second copy in the conversation history would double
    the disk a session costs and send the whole file back to the model on every later prompt
    (the run that wrote it still sees it in full). Only a write that succeeded is shortened; a
    rejected one keeps its content, which exists nowhere else.
    """

    def keep(arguments: Mapping[str, Any], result: str) -> Mapping[str, Any]:
        content = arguments.get("content")
        path = arguments.get("path")
        if not isinstance(content, str) or len(content) <= limit or result != f"Wrote {path}":
            return arguments
        note = (
            f"[{len(content)} characters written to {path}; not kept in the conversation "
            f"history: read_file {path} shows the file as it is now]"
        )
        return {**arguments, "content": note}

    return keep


def _text(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


def file_tools(
    *, read_budget: int = DEFAULT_OFFLOAD_THRESHOLD, max_grep_hits: int = 500
) -> list[Tool]:
    """The eight file tools, in Atmosphere's Java harness's registration order.

    Args:
        read_budget: Characters `read_file` returns before it pages a file read without
            `offset`/`limit` (pass the offload threshold; `<= 0` returns whole files), and the
            size over which history keeps a note instead of a `write_file` content
            (`written_note`; `<= 0` keeps every content).
        max_grep_hits: The cap stated in the `grep` description.
    """

    async def ls(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
        entries = await fs.ls(arguments.get("dir"))
        lines = [
            f"{entry.path}/" if entry.directory else f"{entry.path} ({entry.size} bytes)"
            for entry in entries
        ]
        return "\n".join(lines) if lines else "(empty)"

    async def read_file(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
        path = _required(arguments, "path")
        offset = _optional_int(arguments, "offset", 0)
        limit = _optional_int(arguments, "limit", 1)
        text = await fs.read(path)
        return read_window(text, path, offset, limit, read_budget)

    async def write_file(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
        path = _required(arguments, "path")
        content = arguments.get("content")
        await fs.write(path, "" if content is None else content)
        return f"Wrote {path}"

    async def edit_file(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
        path = _required(arguments, "path")
        old_text = _required(arguments, "old_text")
        new_text = arguments.get("new_text")
        replace_all = arguments.get("replace_all") is True
        count = await fs.edit(
            path, old_text, "" if new_text is None else new_text, replace_all=replace_all
        )
        if replace_all:
            return f"Edited {path} ({count} replacement{'' if count == 1 else 's'})"
        return f"Edited {path}"

    async def glob(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
        matches = await fs.glob(_required(arguments, "pattern"))
        return "\n".join(matches) if matches else "(no matches)"

    async def grep(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
        hits = await fs.grep(_required(arguments, "pattern"), arguments.get("dir"))
        if not hits:
            return "(no matches)"
        text = "\n".join(f"{hit.path}:{hit.line}: {hit.text}" for hit in hits)
        cap = getattr(fs, "max_grep_hits", None)
        if isinstance(cap, int) and len(hits) >= cap:
            text += (
                f"\n[grep: showing the first {cap} hits; there may be more — narrow the "
                "pattern or pass dir]"
            )
        return text

    async def delete(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
        path = _required(arguments, "path")
        await fs.delete(path)
        return f"Deleted {path}"

    async def rename(fs: AgentFileSystem, arguments: Mapping[str, Any]) -> str:
        old_path = _required(arguments, "old_path")
        new_path = _required(arguments, "new_path")
        await fs.rename(old_path, new_path)
        return f"Renamed {old_path} to {new_path}"

    path = _text("Path relative to the workspace root, e.g. notes/todo.md")
    return [
        _tool(
            "ls",
            "List the files and directories directly inside a workspace directory (the root "
            "when dir is omitted). Directories end with '/'; files show their size in bytes.",
            ToolKind.READ,
            {"dir": _text("Directory relative to the workspace root; omit for the root")},
            [],
            ls,
        ),
        _tool(
            "read_file",
            "Read a UTF-8 text file from your workspace. A short file comes back whole; a long "
            "one comes back as its first lines plus the offset to continue from. offset skips "
            "that many lines, limit caps how many lines are returned.",
            ToolKind.READ,
            {
                "path": path,
                "offset": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Lines to skip from the start (0 = first line)",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Most lines to return",
                },
            },
            ["path"],
            read_file,
            prefetch=prefetch_reads,
        ),
        _tool(
            "write_file",
            "Create or overwrite a file in your workspace; parent directories are created. "
            "Files are size-bounded: a rejected write returns the reason and changes nothing.",
            ToolKind.EDIT,
            {"path": path, "content": _text("The complete new content of the file")},
            ["path", "content"],
            write_file,
            written_note(read_budget) if read_budget > 0 else None,
            batch=write_batch,
        ),
        _tool(
            "edit_file",
            "Replace text in a workspace file. old_text must match EXACTLY ONCE (include "
            "surrounding lines to make it unique) unless replace_all is true, which replaces "
            "every occurrence.",
            ToolKind.EDIT,
            {
                "path": path,
                "old_text": _text("The exact text to replace"),
                "new_text": _text("The text to put in its place"),
                "replace_all": {
                    "type": "boolean",
                    "description": "Replace every occurrence instead of exactly one",
                },
            },
            ["path", "old_text", "new_text"],
            edit_file,
        ),
        _tool(
            "glob",
            "Find workspace files whose path matches a glob pattern, e.g. **/*.md (any depth, "
            "the root included) or notes/*.txt. '*' never crosses '/'.",
            ToolKind.READ,
            {"pattern": _text("Glob pattern relative to the workspace root")},
            ["pattern"],
            glob,
        ),
        _tool(
            "grep",
            "Search workspace files with a Python regular expression (case-sensitive; start "
            "with (?i) to ignore case). Returns matching lines as path:line: text. Output is "
            f"capped at {max_grep_hits} hits.",
            ToolKind.READ,
            {
                "pattern": _text("Regular expression, searched in each line"),
                "dir": _text("Only search below this directory; omit for the whole workspace"),
            },
            ["pattern"],
            grep,
        ),
        _tool(
            "delete",
            "Delete a file from your workspace, or a directory with everything in it.",
            ToolKind.DELETE,
            {"path": path},
            ["path"],
            delete,
        ),
        _tool(
            "rename",
            "Rename or move a file or directory within your workspace; the destination must "
            "not exist.",
            ToolKind.EDIT,
            {
                "old_path": _text("Current path relative to the workspace root"),
                "new_path": _text("New path relative to the workspace root"),
            },
            ["old_path", "new_path"],
            rename,
        ),
    ]
