"""One exception tree: every error the harness exports derives from `HarnessError`, and the
classes that were `ValueError`s (or `RuntimeError`s) before the tree still are."""

from __future__ import annotations

import ast
import re
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
from atmosphere_harness import _errors as errors
from atmosphere_harness._errors import GrepTimeout, LoopLimitExceeded, PlanBusFull, ScriptExhausted

PACKAGE = Path(atmosphere_harness.__file__).parent
DOCS = PACKAGE.parent / "docs"


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
    """Any module may import it (pydantic-settings gives `ConfigFileError` its second base)."""
    tree = ast.parse((PACKAGE / "_errors.py").read_text(encoding="utf-8"))
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom | ast.Import)]
    modules = [
        alias.name if isinstance(node, ast.Import) else "." * node.level + (node.module or "")
        for node in imports
        for alias in node.names
    ]
    assert sorted(set(modules)) == ["__future__", "pydantic_settings"]


# --- one module, one tree, the same in the docs ---------------------------------------------------

_TREE_LINE = re.compile(
    r"^(?P<indent>(?:[│ ]   )*)(?:[├└]── )?(?P<name>\w+)(?: \((?P<bases>[\w, ]+)\))?"
)


def _declared() -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """Each class of the errors module: its parent in the tree and its other bases."""
    tree: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    for name, value in vars(errors).items():
        if isinstance(value, type) and issubclass(value, HarnessError):
            ours = [base for base in value.__bases__ if issubclass(base, HarnessError)]
            others = tuple(
                b.__name__ for b in value.__bases__ if b not in ours and b is not Exception
            )
            tree[name] = (ours[0].__name__ if ours else None, others)
    return tree


def _drawn(text: str) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """The tree drawn in the first fenced block of `text` that starts with `HarnessError`."""
    blocks = re.findall(r"^```\n(HarnessError\n.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert blocks, "no HarnessError tree"
    tree: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    parents: list[str] = []
    for line in blocks[0].splitlines():
        match = _TREE_LINE.match(line)
        assert match, line
        depth = len(match["indent"]) // 4 + (0 if line.startswith("HarnessError") else 1)
        name = match["name"]
        bases = tuple(part.strip() for part in (match["bases"] or "").split(",") if part.strip())
        del parents[depth:]
        tree[name] = (parents[-1] if parents else None, bases)
        parents.append(name)
    return tree


def test_every_harness_error_is_declared_in_the_errors_module() -> None:
    declared = set(_declared())
    elsewhere = []
    for source in PACKAGE.rglob("*.py"):
        if source.name == "_errors.py" and source.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {base.id for base in node.bases if isinstance(base, ast.Name)}
            if bases & declared:
                elsewhere.append(f"{source.relative_to(PACKAGE)}:{node.name}")
    assert elsewhere == []


def test_the_errors_module_draws_its_own_tree() -> None:
    assert errors.__doc__ is not None
    assert _drawn(errors.__doc__) == _declared()


def test_the_docs_draw_the_same_tree() -> None:
    assert _drawn((DOCS / "errors.md").read_text(encoding="utf-8")) == _declared()
