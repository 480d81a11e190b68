"""The example of docs/planning.md runs as written (served by uvicorn, offline demo model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import client_for, doc_example
from tests.support import prompt as post_prompt

DOC = Path(__file__).resolve().parents[2] / "docs" / "planning.md"


async def test_the_documented_example_plans_and_serves_the_plan(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_WORKSPACE_ROOT", str(workspace))
    app = doc_example(DOC, "planning_app").app
    async with client_for(app) as client:
        frames = await post_prompt(
            client,
            "/atmosphere/agent/assistant",
            "plan a short task and save the result to a file",
            conversation_id="demo",
        )
        assert [f["event"] for f in frames].count("plan-update") == 2
        shown = (await client.get("/plans/demo")).json()
    assert shown == {
        "markdown": "Goal: plan a short task and save the result to a file\n"
        "- [x] Outline the task\n- [x] Write the result to a file\n- [x] Review the result"
    }
    assert (workspace / "agents" / "assistant" / "plans" / "assistant" / "demo.json").is_file()
