"""Helpers for the skills tests: skill folders on disk and agent modules beside them."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import uuid
from pathlib import Path
from types import ModuleType


def write_skill(
    parent: Path, name: str, description: str, body: str = "", *, folder: str | None = None
) -> Path:
    """`parent/<folder or name>/SKILL.md` with front matter `name` and `description`."""
    directory = parent / (folder or name)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: {description}\n---\n\n{body or f'# {name}'}\n",
        encoding="utf-8",
    )
    return directory


def agent_module(directory: Path, source: str) -> ModuleType:
    """Import `source` as a module file in `directory` (so `skills/` beside it is the agent's)."""
    directory.mkdir(parents=True, exist_ok=True)
    name = f"skills_agent_{uuid.uuid4().hex[:12]}"
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
