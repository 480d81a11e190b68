"""The default bounds the settings carry: `FileSystemLimits` (one workspace store), what one
model message may ask of the executor, and `UsageLimits` (what one run may spend on its model).

They live beside the settings (`ATMOSPHERE_AI_FILESYSTEM_LIMITS`,
`ATMOSPHERE_AI_MAX_TOOL_CALLS_PER_MESSAGE`, `ATMOSPHERE_AI_MAX_TOOL_ARGUMENT_CHARS`,
`ATMOSPHERE_AI_USAGE_LIMITS`) rather than in the filesystem package, the tools or the kernel, so
configuration depends on no layer above the foundations; `atmosphere_harness._filesystem` and
`atmosphere_harness._tools.bounds` re-export the first two.
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


@dataclass(frozen=True, slots=True)
class UsageLimits:
    """What one run may spend, counted over the whole run: its sub-agents and fleet members too.

    `None` leaves a quantity unbounded. `request_limit` and `tool_calls_limit` are checked
    before the call that would exceed them (`request_limit=2` allows two model requests); the
    token limits after each model response (input tokens count cached ones): the run ends at
    the first response over a limit, whose tool calls never run. A run stopped by a limit ends
    with an `error` frame `{"type": "UsageLimitExceeded", "limit": "<name>", ...}`.
    """

    request_limit: int | None = None
    input_tokens_limit: int | None = None
    output_tokens_limit: int | None = None
    total_tokens_limit: int | None = None
    tool_calls_limit: int | None = None

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 0):
                raise ValueError(f"{name} must be a count of 0 or more, got {value!r}")

    @property
    def any(self) -> bool:
        """Whether anything is bounded."""
        return any(getattr(self, name) is not None for name in self.__slots__)
