"""Frames: the events a prompt run streams to its client, and their one wire shape.

Every transport (SSE, WebSocket, AG-UI) starts from the same frame:
`{"event": type, "data": {...}, "sessionId": ..., "conversationId": ..., "seq": n}`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TEXT = "text"
TOOL_START = "tool-start"
TOOL_RESULT = "tool-result"
PLAN_UPDATE = "plan-update"
APPROVAL_REQUIRED = "approval-required"
SUBAGENT_START = "subagent-start"
SUBAGENT_END = "subagent-end"
COMPLETE = "complete"
ERROR = "error"

TERMINAL = frozenset({COMPLETE, ERROR})

_SURROGATE = re.compile("[\ud800-\udfff]")


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
        """Compact JSON on one line (safe as one SSE `data:` line), always encodable as UTF-8.

        Text stays as it is (no `\\u` escapes for non-ASCII), except when a model sent a lone
        surrogate (JSON allows `"\\ud800"`; UTF-8 cannot carry it): then the frame is spelled
        with ASCII escapes, which every JSON parser reads back as the same string, instead of
        the transport failing mid-stream.
        """
        wire = self.to_wire()
        text = json.dumps(wire, ensure_ascii=False, separators=(",", ":"), default=str)
        if _SURROGATE.search(text) is None:
            return text
        return json.dumps(wire, ensure_ascii=True, separators=(",", ":"), default=str)

    @property
    def terminal(self) -> bool:
        return self.event in TERMINAL
