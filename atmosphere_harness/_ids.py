"""Conversation ids: they name directories on disk, so their shape is checked everywhere."""

from __future__ import annotations

import re
import uuid

_CONVERSATION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CONVERSATION_ID_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""What `check_conversation_id` accepts, as one (ECMA-262) pattern for API documents."""


def new_conversation_id() -> str:
    return str(uuid.uuid4())


def check_conversation_id(value: str) -> str:
    """Conversation ids name directories on disk: 1-128 of `[A-Za-z0-9._-]`, no `..`."""
    if not isinstance(value, str) or not _CONVERSATION_ID.match(value) or ".." in value:
        raise ValueError(
            "conversationId must be 1-128 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit, no '..')"
        )
    return value
