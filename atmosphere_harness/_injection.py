"""Which parameter types the harness injects into `@prompt` methods and user tools.

A primitive registers the public type it can provide (`PlanStore`, `AgentFileSystem`, ...) once,
at import. Parameters annotated with a registered type are filled from the run, never from the
model, and are left out of a tool's JSON schema.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

_INJECTABLE: set[type] = set()


def register_injectable(kind: type) -> None:
    _INJECTABLE.add(kind)


def injectable_type(annotation: object) -> type | None:
    """The injectable type behind an annotation (`X`, `X | None`, `Optional[X]`), if any."""
    if isinstance(annotation, type) and annotation in _INJECTABLE:
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return injectable_type(members[0])
    return None


def resolved_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Type hints with forward references resolved; unresolvable ones are left as written."""
    try:
        return typing.get_type_hints(fn)
    except Exception:
        return {
            name: parameter.annotation
            for name, parameter in inspect.signature(fn).parameters.items()
            if parameter.annotation is not inspect.Parameter.empty
        }
