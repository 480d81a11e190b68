"""Conversation ids: they name directories on disk and key every store, so one validator checks
them everywhere, and generated ones are unguessable."""

from __future__ import annotations

import re
import uuid

_CONVERSATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
CONVERSATION_ID_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""What `check_conversation_id` accepts, as one (ECMA-262) pattern for API documents (in
ECMA-262, unlike Python's `re`, `$` never matches before a trailing newline)."""

INVALID_CONVERSATION_ID = (
    "conversationId must be 1-128 letters, digits, '.', '_' or '-' "
    "(starting with a letter or digit, no '..')"
)


def new_conversation_id() -> str:
    """A fresh conversation id: a random UUID, 122 random bits.

    Without a user identity the id is the only thing that stands between a conversation and
    anyone else, so it must not be guessable (`docs/security.md`).
    """
    return str(uuid.uuid4())


def is_conversation_id(value: object) -> bool:
    """Whether `value` is a valid conversation id (see `check_conversation_id`)."""
    return (
        isinstance(value, str)
        and _CONVERSATION_ID.fullmatch(value) is not None
        and ".." not in value
    )


def check_conversation_id(value: str) -> str:
    """`value` if it is a conversation id, else `ValueError`.

    An id is 1-128 of `[A-Za-z0-9._-]`, starts with a letter or digit and holds no `..`: the
    whole value must match (`fullmatch`), so a trailing newline, which `$` would let through,
    is refused, and so is `""` (an absent id means "generate one"; an empty one is a mistake).
    """
    if not is_conversation_id(value):
        raise ValueError(INVALID_CONVERSATION_ID)
    return value
