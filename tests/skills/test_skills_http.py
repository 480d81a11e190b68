"""Skills over real HTTP: the three sources with override, progressive disclosure in the
system prompt, the read-only `skills/` route, sub-agents, truth and the console info."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest

from atmosphere_harness import ModelRequest, ScriptedRuntime, ToolCall, agent
from atmosphere_harness._delegation import SYSTEM_PROMPT
from tests.agents import echo
from tests.skills.support import agent_module, write_skill
from tests.support import doc_example, make_app, of_type, serve
from tests.support import prompt as post_prompt

PATH = "/atmosphere/agent/{name}"


def since_user(request: ModelRequest) -> list[Any]:
    last = max(i for i, m in enumerate(request.messages) if m.role == "user")
    return list(request.messages[last + 1 :])


def calls_then_quote(*calls: ToolCall) -> ScriptedRuntime:
    """Asks for `calls` in one message, then answers with the tool results joined by ' | '."""

    def turn(request: ModelRequest) -> Any:
        after = since_user(request)
        if not after:
            return list(calls)
        return " | ".join(m.content for m in after if m.role == "tool")

    return ScriptedRuntime((), default=turn)


@pytest.fixture
def three_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> type:
    """An agent with convention skills {alpha, beta}, decorator skills {beta, gamma} and
    app-wide skills {gamma}: alpha from the convention, beta from the decorator, gamma from
    the setting."""
    home = tmp_path / "agentpkg"
    write_skill(home / "skills", "alpha", "Alpha from the convention folder.", "ALPHA BODY")
    (home / "skills" / "alpha" / "reference.md").write_text("alpha reference\n", "utf-8")
    write_skill(home / "skills", "beta", "Beta from the convention folder.", "BETA CONVENTION")
    write_skill(home / "extra", "beta", "Beta from the decorator.", "BETA DECORATOR")
    write_skill(home / "extra", "gamma", "Gamma from the decorator.", "GAMMA DECORATOR")
    write_skill(tmp_path / "app-skills", "gamma", "Gamma app-wide.", "GAMMA SETTINGS")
    monkeypatch.setenv("ATMOSPHERE_AI_SKILLS_DIRS", f" {tmp_path / 'app-skills'} ,")
    module = agent_module(
        home,
        """
        from atmosphere_harness import StreamingSession, agent, prompt

        @agent("skilled", skills=("extra",))
        class Skilled:
            @prompt
            async def chat(self, message: str, session: StreamingSession) -> None:
                await session.stream(message)
        """,
    )
    return module.Skilled  # type: ignore[no-any-return]


async def run(agent_cls: type, runtime: ScriptedRuntime, workspace: Path, **settings: Any) -> Any:
    app = make_app([agent_cls], runtime=runtime, workspace=workspace, **settings)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        frames = await post_prompt(client, "/atmosphere/agent/skilled", "go")
        info = (await client.get("/api/console/info")).json()
    return frames, info


def results(frames: list[dict[str, Any]]) -> list[str]:
    return [frame["data"]["result"] for frame in of_type(frames, "tool-result")]


async def test_three_sources_override_by_name_and_only_the_list_goes_in_the_prompt(
    three_sources: type, workspace: Path
) -> None:
    runtime = calls_then_quote(
        ToolCall("read_file", {"path": "skills/alpha/SKILL.md"}),
        ToolCall("read_file", {"path": "skills/beta/SKILL.md"}),
        ToolCall("read_file", {"path": "skills/gamma/SKILL.md"}),
        ToolCall("ls", {"dir": "skills/alpha"}),
        ToolCall("glob", {"pattern": "skills/**/*.md"}),
        ToolCall("grep", {"pattern": "DECORATOR|SETTINGS"}),
    )
    frames, info = await run(three_sources, runtime, workspace)
    assert frames[-1]["event"] == "complete", frames[-1]
    alpha, beta, gamma, listing, globbed, grepped = results(frames)
    assert "ALPHA BODY" in alpha
    assert "description: Alpha from the convention folder." in alpha
    assert "BETA DECORATOR" in beta
    assert "GAMMA SETTINGS" in gamma
    assert "skills/alpha/SKILL.md" in listing
    assert "skills/alpha/reference.md" in listing
    assert globbed.split("\n") == [
        "skills/alpha/SKILL.md",
        "skills/alpha/reference.md",
        "skills/beta/SKILL.md",
        "skills/gamma/SKILL.md",
    ]
    assert "skills/beta/SKILL.md:" in grepped
    assert "skills/gamma/SKILL.md:" in grepped
    assert "CONVENTION" not in grepped

    system = runtime.requests[0].system_prompt
    assert "- alpha: Alpha from the convention folder. (skills/alpha/SKILL.md)" in system
    assert "- beta: Beta from the decorator. (skills/beta/SKILL.md)" in system
    assert "- gamma: Gamma app-wide. (skills/gamma/SKILL.md)" in system
    assert "BODY" not in system, "only names, descriptions and paths"
    assert "DECORATOR" not in system

    assert info["harness"]["skills"] == "ACTIVE(3)"
    (endpoint,) = info["endpoints"]
    assert endpoint["harness"]["skills"] == "ACTIVE(3)"
    assert endpoint["skills"] == [
        {
            "name": "alpha",
            "description": "Alpha from the convention folder.",
            "path": "skills/alpha/SKILL.md",
        },
        {"name": "beta", "description": "Beta from the decorator.", "path": "skills/beta/SKILL.md"},
        {"name": "gamma", "description": "Gamma app-wide.", "path": "skills/gamma/SKILL.md"},
    ]


async def test_the_skills_route_is_read_only(three_sources: type, workspace: Path) -> None:
    runtime = calls_then_quote(
        ToolCall("write_file", {"path": "skills/alpha/SKILL.md", "content": "hacked"}),
        ToolCall("write_file", {"path": "skills/new/SKILL.md", "content": "new"}),
        ToolCall(
            "edit_file", {"path": "skills/alpha/SKILL.md", "old_text": "ALPHA", "new_text": "X"}
        ),
        ToolCall("delete", {"path": "skills/alpha"}),
        ToolCall("delete", {"path": "skills"}),
        ToolCall("rename", {"old_path": "skills/alpha/SKILL.md", "new_path": "mine.md"}),
        ToolCall("write_file", {"path": "notes.md", "content": "mine"}),
        ToolCall("rename", {"old_path": "notes.md", "new_path": "skills/alpha/notes.md"}),
        ToolCall("read_file", {"path": "skills/alpha/SKILL.md"}),
        ToolCall("ls", {}),
    )
    frames, _ = await run(three_sources, runtime, workspace)
    assert frames[-1]["event"] == "complete", frames[-1]
    *rejected, wrote, renamed_in, reread, root = results(frames)
    assert len(rejected) == 6
    for result, path in zip(
        rejected,
        [
            "skills/alpha/SKILL.md",
            "skills/new/SKILL.md",
            "skills/alpha/SKILL.md",
            "skills/alpha",
            "skills",
            "skills/alpha/SKILL.md",
        ],
        strict=True,
    ):
        assert result.startswith(f"Error: Cannot change {path}: skills/ is read-only"), result
        assert "write it elsewhere in your workspace" in result
    assert wrote == "Wrote notes.md"
    assert renamed_in.startswith("Error: Cannot change skills/alpha/notes.md: skills/ is read-only")
    assert "ALPHA BODY" in reread
    assert "hacked" not in reread
    assert "skills/" in root
    assert "notes.md" in root
    # The skill folders themselves are never touched.
    home = Path(sys.modules[three_sources.__module__].__file__ or "").parent
    assert "ALPHA BODY" in (home / "skills" / "alpha" / "SKILL.md").read_text("utf-8")
    assert not (home / "skills" / "new").exists()


async def test_task_sub_agents_see_the_coordinators_skills(tmp_path: Path, workspace: Path) -> None:
    write_skill(tmp_path / "team-skills", "review", "How to review a change.", "REVIEW STEPS")
    module = agent_module(
        tmp_path / "boss",
        f"""
        from atmosphere_harness import StreamingSession, coordinator, prompt

        @coordinator("skilled", skills=({str(tmp_path / "team-skills")!r},))
        class Boss:
            @prompt
            async def chat(self, message: str, session: StreamingSession) -> None:
                await session.stream(message)
        """,
    )

    def turn(request: ModelRequest) -> Any:
        after = since_user(request)
        if request.system_prompt.startswith(SYSTEM_PROMPT):
            if not after:
                return [ToolCall("read_file", {"path": "skills/review/SKILL.md"})]
            return "sub read: " + after[-1].content
        if not after:
            return [ToolCall("task", {"description": "review the change"})]
        return after[-1].content

    runtime = ScriptedRuntime((), default=turn)
    spawns = tmp_path / "spawns"
    spawns.mkdir()
    frames, _ = await run(module.Boss, runtime, workspace, subagent_workspace_dir=spawns)
    assert frames[-1]["event"] == "complete", frames[-1]
    assert "sub read:" in frames[-1]["data"]["summary"]
    assert "REVIEW STEPS" in frames[-1]["data"]["summary"]
    sub = [r for r in runtime.requests if r.system_prompt.startswith(SYSTEM_PROMPT)]
    assert "- review: How to review a change. (skills/review/SKILL.md)" in sub[0].system_prompt


async def test_without_skills_the_truth_stays_convention(workspace: Path) -> None:
    plain = echo(agent("skilled"), "Plain")
    frames, info = await run(plain, ScriptedRuntime(["hi"]), workspace)
    assert frames[-1]["event"] == "complete"
    assert info["harness"]["skills"] == "CONVENTION"
    assert info["endpoints"][0]["harness"]["skills"] == "CONVENTION"
    assert info["endpoints"][0]["skills"] == []


async def test_skills_without_a_workspace_are_reported_inactive(
    tmp_path: Path, workspace: Path
) -> None:
    write_skill(tmp_path / "s", "solo", "Solo.")
    bare = echo(agent("skilled", harness=(), skills=(str(tmp_path / "s"),)), "Bare")
    runtime = ScriptedRuntime(["hi"])
    frames, info = await run(bare, runtime, workspace)
    assert frames[-1]["event"] == "complete"
    assert info["endpoints"][0]["harness"]["skills"] == "INACTIVE(no-filesystem)"
    assert "solo" not in runtime.requests[0].system_prompt


async def test_the_docs_example_runs() -> None:
    module = doc_example(Path(__file__).parents[2] / "docs" / "skills.md", "skills_doc_example")
    async with serve(module.app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        frames = await post_prompt(client, "/atmosphere/agent/poet", "a poem please")
    (read,) = of_type(frames, "tool-result")
    assert read["data"]["result"].startswith("---\nname: haiku\n")
    assert frames[-1]["data"]["summary"].startswith("Quiet tests at dawn")


async def test_consecutive_reads_across_the_workspace_and_skills_answer_exactly(
    three_sources: type, workspace: Path
) -> None:
    batches = [
        [
            ToolCall("write_file", {"path": "a.md", "content": "AAA"}),
            ToolCall("write_file", {"path": "b.md", "content": "BBB"}),
        ],
        [
            ToolCall("read_file", {"path": "a.md"}),
            ToolCall("read_file", {"path": "skills/beta/SKILL.md"}),
            ToolCall("read_file", {"path": "b.md"}),
            ToolCall("read_file", {"path": "missing.md"}),
        ],
    ]

    def turn(request: ModelRequest) -> Any:
        done = sum(1 for m in since_user(request) if m.role == "assistant")
        return batches[done] if done < len(batches) else "done"

    frames, _ = await run(three_sources, ScriptedRuntime((), default=turn), workspace)
    _, _, first, skill, second, missing = results(frames)
    assert first == "AAA"
    assert "BETA DECORATOR" in skill
    assert second == "BBB"
    assert missing == "Error: File not found: missing.md"
