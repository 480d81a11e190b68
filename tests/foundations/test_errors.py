"""One exception tree: every error the harness exports derives from `HarnessError`, and the
classes that were `ValueError`s (or `RuntimeError`s) before the tree still are."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import atmosphere_harness
from atmosphere_harness import (
    DelegationError,
    FileNotFoundInWorkspace,
    FileSystemError,
    HarnessError,
    ModelError,
    PlanStoreError,
    ToolArgumentError,
)
from atmosphere_harness._filesystem.search import GrepTimeout
from atmosphere_harness._kernel.loop import LoopLimitExceeded
from atmosphere_harness._planning.bus import PlanBusFull
from atmosphere_harness._runtimes.scripted import ScriptExhausted

PACKAGE = Path(atmosphere_harness.__file__).parent


def test_every_exported_exception_is_a_harness_error() -> None:
    exported = [
        getattr(atmosphere_harness, name)
        for name in atmosphere_harness.__all__
        if name not in ("AnthropicRuntime", "OpenAIRuntime")  # optional SDKs, not exceptions
    ]
    errors = [value for value in exported if isinstance(value, type)]
    errors = [cls for cls in errors if issubclass(cls, BaseException)]
    assert set(errors) >= {
        HarnessError,
        FileSystemError,
        FileNotFoundInWorkspace,
        ModelError,
        DelegationError,
        PlanStoreError,
        ToolArgumentError,
    }
    for cls in errors:
        assert issubclass(cls, HarnessError), cls


def test_the_fixed_names_are_importable_from_the_package() -> None:
    for name in (
        "HarnessError",
        "FileSystemError",
        "ModelError",
        "DelegationError",
        "PlanStoreError",
        "ToolArgumentError",
    ):
        assert name in atmosphere_harness.__all__
        assert issubclass(getattr(atmosphere_harness, name), HarnessError)


@pytest.mark.parametrize(
    ("cls", "old_bases"),
    [
        (FileSystemError, (ValueError,)),
        (FileNotFoundInWorkspace, (FileSystemError, ValueError)),
        (GrepTimeout, (FileSystemError, ValueError)),
        (PlanStoreError, (ValueError,)),
        (PlanBusFull, (RuntimeError,)),
        (ToolArgumentError, (ValueError,)),
        (ModelError, ()),
        (LoopLimitExceeded, (ModelError,)),
        (ScriptExhausted, (ModelError,)),
        (DelegationError, ()),
    ],
)
def test_each_class_is_rooted_and_keeps_its_old_bases(
    cls: type[Exception], old_bases: tuple[type[Exception], ...]
) -> None:
    assert issubclass(cls, HarnessError)
    for base in old_bases:
        assert issubclass(cls, base), (cls, base)


def test_a_value_error_handler_still_catches_the_value_errors() -> None:
    for error in (FileSystemError("x"), PlanStoreError("x"), ToolArgumentError(["x"])):
        with pytest.raises(ValueError, match="x"):
            raise error


def test_every_exception_class_the_package_defines_is_in_the_tree() -> None:
    """A new `class FooError(Exception)` must join the tree (private helpers excepted)."""
    roots = {
        "Exception",
        "ValueError",
        "RuntimeError",
        "TypeError",
        "KeyError",
        "OSError",
        "SettingsError",  # pydantic-settings' root: a config error must still be ours too
    }
    outside = []
    for source in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = {base.id for base in node.bases if isinstance(base, ast.Name)}
            if bases & roots and "HarnessError" not in bases and node.name != "HarnessError":
                outside.append(f"{source.relative_to(PACKAGE)}:{node.name}")
    assert outside == []


def test_errors_module_imports_nothing_from_the_package() -> None:
    tree = ast.parse((PACKAGE / "_errors.py").read_text(encoding="utf-8"))
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert all(node.level == 0 and node.module == "__future__" for node in imports)
