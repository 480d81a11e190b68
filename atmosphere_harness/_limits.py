"""The default bounds the settings carry: `FileSystemLimits` (one workspace store) and what one
model message may ask of the executor.

They live beside the settings (`ATMOSPHERE_AI_FILESYSTEM_LIMITS`,
`ATMOSPHERE_AI_MAX_TOOL_CALLS_PER_MESSAGE`, `ATMOSPHERE_AI_MAX_TOOL_ARGUMENT_CHARS`) rather than in
the filesystem package or the tools, so configuration depends on no layer above the foundations;
`atmosphere_harness._filesystem` and `atmosphere_harness._tools.bounds` re-export them.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB

DEFAULT_MAX_TOOL_CALLS = 256
"""Tool calls one model message may ask for (`ATMOSPHERE_AI_MAX_TOOL_CALLS_PER_MESSAGE`)."""
DEFAULT_MAX_ARGUMENT_CHARS = 1024 * 1024
"""Characters one call's arguments may hold (`ATMOSPHERE_AI_MAX_TOOL_ARGUMENT_CHARS`): twice the
default per-file limit, so a maximal `write_file` or `edit_file` always fits."""


@dataclass(frozen=True, slots=True)
class FileSystemLimits:
    """Hard bounds of one store, checked before any byte is written."""

    max_file_bytes: int = 512 * KIB
    max_files: int = 256
    max_total_bytes: int = 16 * MIB
    max_grep_hits: int = 500
    max_conversations: int = 256

    def __post_init__(self) -> None:
        values = (
            self.max_file_bytes,
            self.max_files,
            self.max_total_bytes,
            self.max_grep_hits,
            self.max_conversations,
        )
        if any(value <= 0 for value in values):
            raise ValueError("limits must be positive: " + "/".join(str(v) for v in values))
