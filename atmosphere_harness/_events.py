"""Frames: the events a prompt run streams to its client, and their one wire shape.

Every transport (SSE, WebSocket, AG-UI) starts from the same frame:
`{"event": type, "data": {...}, "sessionId": ..., "conversationId": ..., "seq": n}`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._jsontext import compact_json

TEXT = "text"
TOOL_START = "tool-start"
TOOL_RESULT = "tool-result"
PLAN_UPDATE = "plan-update"
APPROVAL_REQUIRED = "approval-required"
SUBAGENT_START = "subagent-start"
SUBAGENT_END = "subagent-end"
MODEL_FALLBACK = "model-fallback"
COMPLETE = "complete"
ERROR = "error"

TERMINAL = frozenset({COMPLETE, ERROR})

_LINE_UNSAFE = re.compile("[\x85\u2028\u2029\ud800-\udfff]")


def line_safe(text: str) -> str:
    """JSON text made safe for any line reader and for UTF-8, meaning unchanged.

    Compact JSON never holds a CR or LF, but with `ensure_ascii=False` it keeps U+0085, U+2028
    and U+2029 as they are: valid JSON, and not line breaks to SSE, yet Python's
    `str.splitlines` (and so `httpx`'s `iter_lines`, which many SSE clients use) splits there
    and the client loses the frame. A lone surrogate (a model may send `"\\ud800"`) cannot be
    encoded as UTF-8 at all. All of these only ever occur inside JSON strings, where a `\\u`
    escape means the same character, so each is spelled as one.
    """
    if text.isascii() or _LINE_UNSAFE.search(text) is None:
        return text  # (`isascii` reads a flag the string keeps: no scan for most texts)
    return _LINE_UNSAFE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def json_line(value: Any) -> str:
    """Compact JSON on one line, non-ASCII text kept as is, safe for line readers and UTF-8."""
    return line_safe(_TEXT(value))


_TEXT = compact_json(ascii_only=False, default=str)


@dataclass(frozen=True, slots=True)
class Event:
    """Something to tell the client: a type and a JSON-serializable payload."""

    type: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Frame:
    """An event stamped with its run's ids and its position in the stream."""

    event: str
    data: Mapping[str, Any]
    session_id: str
    conversation_id: str
    seq: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "data": self.data,
            "sessionId": self.session_id,
            "conversationId": self.conversation_id,
            "seq": self.seq,
        }

    def to_json(self) -> str:
        """Compact JSON on one line (one SSE `data:` line for every reader; see `line_safe`)."""
        return json_line(self.to_wire())

    @property
    def terminal(self) -> bool:
        return self.event in TERMINAL
