"""The shapes of the tool results the harness itself writes (errors, refusals, denials)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def json_result(**fields: Any) -> str:
    """A compact JSON tool result (the reference's error shapes are matched byte for byte)."""
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))


def invalid_arguments(tool: str, details: Sequence[str]) -> str:
    return json_result(error="invalid_arguments", tool=tool, details=list(details))
