"""`skill_file=` over real HTTP: an agent's system prompt read from a Markdown file (Atmosphere's
`@Coordinator(skillFile = ...)`), found beside the agent's module, then from the working
directory; `system_prompt=` wins over it; a missing or empty file stops the app's start-up (its
lifespan, which uvicorn runs before it serves) naming the paths it tried."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from atmosphere_harness import ScriptedRuntime
from tests.skills.support import agent_module
from tests.support import make_app, serve
from tests.support import prompt as post_prompt

LEAD = """
from atmosphere_harness import StreamingSession, coordinator, prompt

@coordinator("lead", skill_file="prompts/lead-skill.md")
class Lead:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)
"""

INSTRUCTIONS = "# Lead\n\nYou run a team of two. Answer in one sentence.\n"


async def _system_prompt(agent_cls: type, workspace: Path, path: str) -> str:
    runtime = ScriptedRuntime(["done"])
    app = make_app([agent_cls], runtime=runtime, workspace=workspace)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        frames = await post_prompt(client, path, "hello")
    assert frames[-1]["event"] == "complete", frames[-1]
    return runtime.requests[0].system_prompt


async def test_the_file_beside_the_agents_module_is_its_system_prompt(
    tmp_path: Path, workspace: Path
) -> None:
    (tmp_path / "team" / "prompts").mkdir(parents=True)
    (tmp_path / "team" / "prompts" / "lead-skill.md").write_text(f"\n{INSTRUCTIONS}\n", "utf-8")
    module = agent_module(tmp_path / "team", LEAD)
    system = await _system_prompt(module.Lead, workspace, "/atmosphere/agent/lead")
    assert system.startswith(INSTRUCTIONS.strip()), system
    assert "You are lead" not in system, "the default prompt is replaced, not added to"


async def test_a_path_from_the_working_directory_and_system_prompt_winning(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cwd" / "prompts").mkdir(parents=True)
    (tmp_path / "cwd" / "prompts" / "lead-skill.md").write_text(INSTRUCTIONS, "utf-8")
    monkeypatch.chdir(tmp_path / "cwd")
    module = agent_module(tmp_path / "elsewhere", LEAD)
    system = await _system_prompt(module.Lead, workspace, "/atmosphere/agent/lead")
    assert system.startswith(INSTRUCTIONS.strip())

    both = LEAD.replace('")', '", system_prompt="Explicit instructions.")', 1)
    explicit = agent_module(tmp_path / "elsewhere", both)
    system = await _system_prompt(explicit.Lead, workspace, "/atmosphere/agent/lead")
    assert system.startswith("Explicit instructions."), system


@pytest.mark.parametrize("content", [None, "  \n"], ids=["missing", "empty"])
async def test_a_missing_or_empty_file_stops_the_app_naming_it(
    tmp_path: Path, workspace: Path, content: str | None
) -> None:
    if content is not None:
        (tmp_path / "team" / "prompts").mkdir(parents=True)
        (tmp_path / "team" / "prompts" / "lead-skill.md").write_text(content, "utf-8")
    module = agent_module(tmp_path / "team", LEAD)
    app = make_app([module.Lead], runtime=ScriptedRuntime(["done"]), workspace=workspace)
    with pytest.raises(FileNotFoundError, match=r"skill_file 'prompts/lead-skill.md'") as raised:
        async with app.router.lifespan_context(app):
            pass
    assert str(tmp_path / "team" / "prompts" / "lead-skill.md") in str(raised.value)
