"""`ToolApprovalPolicy`: which tool calls wait for a person before they run.

- `annotated()` (the default): the tools declared `requires_approval=True`;
- `allow_all()`: none;
- `deny_all()`: every call is refused (`Tool execution denied by policy`);
- `custom(predicate)`: the calls whose `Tool` the predicate accepts, e.g.
  `ToolApprovalPolicy.custom(lambda tool: tool.kind is ToolKind.DELETE)` gates `delete`.

A predicate that raises is read as "needs approval" (fail-closed, a person decides).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from .._log import get_logger
from .._tools.base import Tool

log = get_logger(__name__)


class _Mode(enum.Enum):
    ANNOTATED = "annotated"
    ALLOW_ALL = "allow-all"
    DENY_ALL = "deny-all"
    CUSTOM = "custom"


class ToolApprovalPolicy:
    """Decides, per tool, whether a call needs a person's approval. Build it with a factory."""

    __slots__ = ("_mode", "_predicate")

    def __init__(self, mode: _Mode, predicate: Callable[[Tool], bool] | None = None) -> None:
        self._mode = mode
        self._predicate = predicate

    @classmethod
    def annotated(cls) -> ToolApprovalPolicy:
        """Gate the tools declared with `requires_approval=True` (the default)."""
        return cls(_Mode.ANNOTATED)

    @classmethod
    def allow_all(cls) -> ToolApprovalPolicy:
        """Never ask."""
        return cls(_Mode.ALLOW_ALL)

    @classmethod
    def deny_all(cls) -> ToolApprovalPolicy:
        """Refuse every tool call without asking."""
        return cls(_Mode.DENY_ALL)

    @classmethod
    def custom(cls, predicate: Callable[[Tool], bool]) -> ToolApprovalPolicy:
        """Gate the tools `predicate(tool)` accepts."""
        if predicate is None or not callable(predicate):
            raise ValueError("predicate must not be None")
        return cls(_Mode.CUSTOM, predicate)

    @property
    def denies_all(self) -> bool:
        return self._mode is _Mode.DENY_ALL

    def requires_approval(self, tool: Tool) -> bool:
        if self._mode is _Mode.ANNOTATED:
            return tool.requires_approval
        if self._mode is _Mode.ALLOW_ALL:
            return False
        if self._mode is _Mode.DENY_ALL:
            return True
        assert self._predicate is not None
        try:
            return bool(self._predicate(tool))
        except Exception:
            log.exception("approval predicate failed; asking for approval", tool=tool.name)
            return True

    def __repr__(self) -> str:
        return f"ToolApprovalPolicy.{self._mode.name.lower()}()"
