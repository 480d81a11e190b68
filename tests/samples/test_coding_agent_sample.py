"""The coding-agent sample end to end over loopback: files, grep, edit, offload, routed memory."""

from __future__ import annotations

from pathlib import Path

from atmosphere_harness import HarnessSettings
from samples.coding_agent.app import create_app
from tests.support import client_for, of_type
from tests.support import prompt as post_prompt

PATH = "/atmosphere/agent/coder"


async def test_the_coding_agent_fixes_the_bug_and_keeps_a_shared_lesson(
    workspace: Path, tmp_path: Path
) -> None:
    memory = tmp_path / "memory"
    settings = HarnessSettings(workspace_root=workspace, filesystem_routes=f"memory/={memory}")
    async with client_for(create_app(settings)) as client:
        frames = await post_prompt(client, PATH, "fix the calculator", conversation_id="job-1")
        again = await post_prompt(client, PATH, "fix the calculator", conversation_id="job-2")
        info = (await client.get("/api/console/info")).json()
    results = {
        frame["data"]["tool"]: frame["data"]["result"] for frame in of_type(frames, "tool-result")
    }
    reads = [
        frame["data"]["result"]
        for frame in of_type(frames, "tool-result")
        if frame["data"]["tool"] == "read_file"
    ]
    assert reads[0].startswith("---\nname: fix-a-failing-test\n"), "the skill is read first"
    assert "write_todos" in results, "the planning primitive plans the work first"
    assert results["write_file"] == "Wrote memory/lessons.md"
    assert "src/calc.py:6:     # TODO: guard against division by zero" in results["grep"]
    assert results["glob"] == "src/calc.py\ntests/test_calc.py"
    assert results["edit_file"] == "Edited src/calc.py"
    assert "Full output saved to tool-output/run_tests-" in results["run_tests"]
    assert results["read_file"].endswith("test_divide_by_zero PASSED\n2 passed\n")
    assert frames[-1]["event"] == "complete"
    assert "both tests pass" in frames[-1]["data"]["summary"]

    job = workspace / "agents" / "coder" / "files" / "job-1"
    assert "if b == 0:" in (job / "src" / "calc.py").read_text()
    [log] = (job / "tool-output").iterdir()
    assert log.read_text().count("\n") == 403
    assert not (job / "memory").exists(), "memory/ is routed to the shared store"
    shared = memory / "files" / "shared" / "memory" / "lessons.md"
    assert shared.read_text().startswith("- Guard divisions")
    assert of_type(again, "complete"), "a second conversation reuses the same shared store"
    assert info["harness"]["filesystem"] == "ACTIVE(builtin)"
    assert info["harness"]["skills"] == "ACTIVE(2)"
    assert [skill["name"] for skill in info["endpoints"][0]["skills"]] == [
        "fix-a-failing-test",
        "write-python-tests",
    ]
