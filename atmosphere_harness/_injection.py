"""Which parameter types the harness injects into `@prompt` methods and user tools.

`INJECTABLE_TYPES` declares them all, by where each is defined, so what is injectable never
depends on which modules happen to be imported. Parameters annotated with one of them are filled
from the run, never from the model, and are left out of a tool's JSON schema; a run whose
endpoint does not provide one (its primitive is off) gets `None`.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

INJECTABLE_TYPES = frozenset(
    {
        "atmosphere_harness._kernel.session.StreamingSession",
        "atmosphere_harness._tools.base.ToolContext",
        "atmosphere_harness._planning.store.PlanStore",
        "atmosphere_harness._filesystem.base.AgentFileSystem",
        "atmosphere_harness._filesystem.base.UserFiles",
        "atmosphere_harness._memory.LongTermMemory",
        "atmosphere_harness._memory.conversation.ConversationMemory",
    }
)
"""Every injectable type, as `module.QualifiedName` of the class (its `__module__`: where it is
defined, or the package that re-exports it when that package says so)."""


def injectable_type(annotation: object) -> type | None:
    """The injectable type behind an annotation (`X`, `X | None`, `Optional[X]`), if any."""
    if isinstance(annotation, type) and _name_of(annotation) in INJECTABLE_TYPES:
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return injectable_type(members[0])
    return None


def _name_of(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


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
