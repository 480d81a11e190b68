"""Tool-output offload: a result too long for the context goes to a workspace file.

A result longer than the threshold (characters) is written to
`tool-output/{tool}-{id}.txt` in the conversation's filesystem, and the model gets its first
1500 characters plus a pointer naming the tool it reads files with: `read_file` with
`offset`/`limit` on the built-in surface, the memory tool's `view` with `view_range` (at
`/memories/tool-output/...`) on Claude's native one. The
full text is never lost: with no filesystem in scope, or when the write fails for any reason
(a store bound, the disk), the model gets the whole result inline. That reading tool is
never offloaded itself (it pages by itself, so offloading it would only copy the file it read).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._log import get_logger
from .tools import ORIGIN, bound_file_system

if TYPE_CHECKING:
    from .._contracts import Run
    from .._runtimes.base import ToolCall
    from .._tools.base import Tool

log = get_logger(__name__)

PREVIEW_CHARS = 1500
OUTPUT_DIR = "tool-output"
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def offload_path(tool_name: str | None) -> str:
    """`tool-output/{tool}-{8 hex}.txt`, the tool name reduced to safe characters."""
    base = _UNSAFE_NAME.sub("_", tool_name.strip()) if tool_name and tool_name.strip() else "tool"
    return f"{OUTPUT_DIR}/{base}-{uuid.uuid4().hex[:8]}.txt"


@dataclass(frozen=True, slots=True)
class Reader:
    """How the model reads an offloaded file back with the file tools it actually has."""

    prefix: str
    """Prepended to the workspace path in the preview (the surface's own path syntax)."""
    how: str
    """The instruction, naming the tool."""
    tool: str
    """That tool's name: its own results are never offloaded (it pages by itself)."""


READ_FILE = Reader("", "use read_file to read it (offset/limit page through it)", "read_file")
"""The eight built-in tools."""
MEMORY_VIEW = Reader(
    "/memories/",
    "use the memory tool's view command on it (view_range pages through it)",
    "memory",
)
"""Claude's native memory tool, whose `/memories/tool-output/` is the conversation workspace's
`tool-output/` (with a user or without)."""


def preview(result: str, path: str, reader: Reader = READ_FILE) -> str:
    """What the model gets instead of an offloaded result."""
    cut = len(result) - PREVIEW_CHARS
    return (
        f"{result[:PREVIEW_CHARS]}\n\n[... {cut} chars truncated. Full output saved to "
        f"{reader.prefix}{path} — {reader.how}.]"
    )


class ToolOutputOffload:
    """The result hook (`endpoint.result_hooks`) that offloads long tool results; `reader` is
    how the model of that endpoint reads a file back (the preview names it)."""

    def __init__(self, threshold: int, reader: Reader = READ_FILE) -> None:
        self.threshold = threshold
        self.reader = reader

    async def __call__(self, call: ToolCall, tool: Tool, result: str, run: Run) -> str:
        if self.threshold <= 0 or len(result) <= self.threshold:
            return result
        if tool.name == self.reader.tool and tool.origin == ORIGIN:
            return result
        path = offload_path(tool.name)
        try:
            fs = bound_file_system(run)
            if fs is None:
                return result
            await fs.write(path, result)
        except Exception as exc:
            log.debug("tool output kept inline: offload failed", tool=tool.name, error=str(exc))
            return result
        return preview(result, path, self.reader)
