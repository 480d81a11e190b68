"""`FileSystemLimits`: the bounds of one workspace store.

They live beside the settings (which carry them, `ATMOSPHERE_AI_FILESYSTEM_LIMITS`) rather than in
the filesystem package, so configuration never depends on a primitive;
`atmosphere_harness._filesystem` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB


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
