"""The shapes of the tool results the harness itself writes (errors, refusals, denials)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._jsontext import compact_json


def json_result(**fields: Any) -> str:
    """A compact JSON tool result (Atmosphere's error shapes are matched byte for byte)."""
    return _TEXT(fields)


_TEXT = compact_json(ascii_only=False)


def invalid_arguments(tool: str, details: Sequence[str]) -> str:
    return json_result(error="invalid_arguments", tool=tool, details=list(details))
