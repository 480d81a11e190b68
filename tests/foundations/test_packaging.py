"""What an installed package carries: its inline types (PEP 561) and no dead dependency."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import atmosphere_harness

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_declares_its_inline_types() -> None:
    assert (Path(atmosphere_harness.__file__).parent / "py.typed").is_file()


def test_the_wheel_ships_py_typed(tmp_path: Path) -> None:
    """Build the wheel as pip does and look inside (the Typed classifier must be true)."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = tmp_path.glob("atmosphere_harness-*.whl")
    assert "atmosphere_harness/py.typed" in zipfile.ZipFile(wheel).namelist()


def test_every_declared_dependency_is_imported() -> None:
    """A base dependency nothing imports is dead weight for every user (aiofiles was one)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    imports = {
        "fastapi": "fastapi",
        "pydantic": "pydantic",
        "pydantic-settings": "pydantic_settings",
        "pyyaml": "yaml",
        "sse-starlette": "sse_starlette",
        "structlog": "structlog",
        "uvicorn": "uvicorn",
        "websockets": "websockets",
        "ag-ui-protocol": "ag_ui",
        "regex": "regex",
    }
    source = "\n".join(
        path.read_text(encoding="utf-8") for path in (ROOT / "atmosphere_harness").rglob("*.py")
    )
    for requirement in project["dependencies"]:
        name = requirement.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip()
        assert name in imports, f"{name}: say which module it provides"
        module = imports[name]
        used = f"import {module}" in source or f"from {module}" in source
        if name in ("uvicorn", "websockets"):
            # The server `make demo` and the samples run on, and its WebSocket implementation
            # (uvicorn loads it by name): a user gets a working server with one install.
            used = True
        assert used, f"{name} is declared but nothing in the package imports {module}"
