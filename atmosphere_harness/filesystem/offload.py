"""Tool-output offload: a result too long for the context goes to a workspace file.

A result longer than the threshold (characters) is written to
`tool-output/{tool}-{id}.txt` in the conversation's filesystem, and the model gets its first
1500 characters plus a pointer; `read_file` with `offset`/`limit` pages through the rest. The
full text is never lost: with no filesystem in scope, or when the write fails for any reason
(a store bound, the disk), the model gets the whole result inline. The built-in `read_file` is
never offloaded (it pages by itself, so offloading it would only copy the file it read).
"""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING

from ..log import get_logger
from .tools import ORIGIN, bound_file_system

if TYPE_CHECKING:
    from ..contracts import Run
    from ..runtimes.base import ToolCall
    from ..tools.base import Tool

log = get_logger(__name__)

PREVIEW_CHARS = 1500
OUTPUT_DIR = "tool-output"
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def offload_path(tool_name: str | None) -> str:
    """`tool-output/{tool}-{8 hex}.txt`, the tool name reduced to safe characters."""
    base = _UNSAFE_NAME.sub("_", tool_name.strip()) if tool_name and tool_name.strip() else "tool"
    return f"{OUTPUT_DIR}/{base}-{uuid.uuid4().hex[:8]}.txt"


def preview(result: str, path: str) -> str:
    """What the model gets instead of an offloaded result."""
    cut = len(result) - PREVIEW_CHARS
    return (
        f"{result[:PREVIEW_CHARS]}\n\n[... {cut} chars truncated. Full output saved to {path} "
        "— use read_file to read it (offset/limit page through it).]"
    )


class ToolOutputOffload:
    """The result hook (`endpoint.result_hooks`) that offloads long tool results."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold

    async def __call__(self, call: ToolCall, tool: Tool, result: str, run: Run) -> str:
        if self.threshold <= 0 or len(result) <= self.threshold:
            return result
        if tool.name == "read_file" and tool.origin == ORIGIN:
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
        return preview(result, path)
