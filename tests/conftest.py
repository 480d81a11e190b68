"""Shared fixtures: every test gets a clean environment and its own workspace directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

_OUR_PREFIXES = ("ATMOSPHERE_", "LLM_")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests never inherit harness configuration from the shell (CI's own flags excepted)."""
    for name in list(os.environ):
        if name.upper().startswith(_OUR_PREFIXES) and name != "ATMOSPHERE_REQUIRE_SERVICES":
            monkeypatch.delenv(name, raising=False)
    return


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    root.mkdir()
    return root
