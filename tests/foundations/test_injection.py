"""What `@prompt` methods and tools can be given is one declared table, whatever was imported."""

from __future__ import annotations

import importlib

import pytest

from atmosphere_harness import (
    AgentFileSystem,
    ConversationMemory,
    LongTermMemory,
    PlanStore,
    StreamingSession,
    ToolContext,
    WorkspaceAgentFileSystem,
)
from atmosphere_harness._injection import INJECTABLE_TYPES, injectable_type


def _resolve(dotted: str) -> object:
    """The object at `package.module.Name` (the module part as long as it imports)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise AssertionError(f"{dotted} names no module")


@pytest.mark.parametrize("dotted", sorted(INJECTABLE_TYPES))
def test_each_entry_names_a_class_that_is_injectable(dotted: str) -> None:
    kind = _resolve(dotted)
    assert isinstance(kind, type), dotted
    assert injectable_type(kind) is kind


@pytest.mark.parametrize(
    "kind",
    [StreamingSession, ToolContext, PlanStore, AgentFileSystem, LongTermMemory, ConversationMemory],
)
def test_the_documented_types_are_injectable_also_when_optional(kind: type) -> None:
    assert injectable_type(kind) is kind
    assert injectable_type(kind | None) is kind


@pytest.mark.parametrize("annotation", [str, int, WorkspaceAgentFileSystem, PlanStore | str])
def test_anything_else_comes_from_the_model(annotation: object) -> None:
    assert injectable_type(annotation) is None
