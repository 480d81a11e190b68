"""The filesystem end to end over a real uvicorn server on loopback."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import FastAPI

from atmosphere_harness import (
    AgentFileSystem,
    AgentFileSystemDep,
    Harness,
    HarnessSettings,
    ModelRequest,
    ScriptedRuntime,
    StreamingSession,
    ToolCall,
    WorkspaceAgentFileSystem,
    agent,
    ai_endpoint,
    create_harness_router,
    get_file_system,
    prompt,
    tool,
)
from atmosphere_harness._filesystem.tools import FILE_TOOL_NAMES
from tests.agents import echo
from tests.fs_support import tree
from tests.support import client_for, make_app, of_type
from tests.support import prompt as post_prompt

Writer = echo(agent(name="writer"), "Writer")


WRITER = "/atmosphere/agent/writer"


def results(frames: list[dict]) -> list[str]:
    return [frame["data"]["result"] for frame in of_type(frames, "tool-result")]


async def test_file_tools_round_trip_and_the_per_file_bound(workspace: Path) -> None:
    runtime = ScriptedRuntime(
        [
            [ToolCall("write_file", {"path": "notes/todo.md", "content": "- ship\n- rest\n"})],
            [ToolCall("read_file", {"path": "notes/todo.md"}), ToolCall("ls", {})],
            [ToolCall("write_file", {"path": "notes/big.md", "content": "x" * (512 * 1024 + 1)})],
            "done",
        ]
    )
    async with client_for(make_app([Writer], runtime=runtime, workspace=workspace)) as client:
        frames = await post_prompt(client, WRITER, "take notes", conversation_id="conv-1")
    got = results(frames)
    assert got[:3] == ["Wrote notes/todo.md", "- ship\n- rest\n", "notes/"]
    assert got[3].startswith("Error: Write rejected: notes/big.md would be 524289 bytes")
    assert "per-file limit" in got[3]
    assert frames[-1]["event"] == "complete"
    store = workspace / "agents" / "writer" / "files" / "conv-1"
    assert tree(store) == {"notes/todo.md": b"- ship\n- rest\n"}, "no partial or temp file"
    assert everything_in(store) == ["notes", "notes/todo.md"], "only the user's files are left"


def everything_in(folder: Path) -> list[str]:
    """Every entry below `folder` (hidden ones too, empty folders too), relative, sorted."""
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


async def test_once_the_app_has_shut_down_a_conversation_folder_holds_only_the_users_files(
    workspace: Path,
) -> None:
    """Writes that replace files, edits, a delete: after the lifespan's shutdown nothing the
    store made for itself (temporary files, files made ahead, hidden folders) is left."""
    runtime = ScriptedRuntime(
        [
            [
                ToolCall("write_file", {"path": "a.md", "content": "one"}),
                ToolCall("write_file", {"path": "docs/b.md", "content": "two"}),
            ],
            [
                ToolCall("write_file", {"path": "a.md", "content": "one, again"}),
                ToolCall("edit_file", {"path": "docs/b.md", "old_text": "two", "new_text": "2"}),
                ToolCall("write_file", {"path": "c.md", "content": "gone soon"}),
            ],
            [ToolCall("delete", {"path": "c.md"})],
            "done",
        ]
    )
    async with client_for(make_app([Writer], runtime=runtime, workspace=workspace)) as client:
        frames = await post_prompt(client, WRITER, "take notes", conversation_id="conv-9")
    assert frames[-1]["event"] == "complete", frames[-1]
    store = workspace / "agents" / "writer" / "files" / "conv-9"
    assert tree(store) == {"a.md": b"one, again", "docs/b.md": b"2"}
    assert everything_in(store) == ["a.md", "docs", "docs/b.md"]


async def test_a_prompt_that_writes_nothing_creates_no_directory(workspace: Path) -> None:
    runtime = ScriptedRuntime([[ToolCall("ls", {}), ToolCall("glob", {"pattern": "**"})], "ok"])
    async with client_for(make_app([Writer], runtime=runtime, workspace=workspace)) as client:
        frames = await post_prompt(client, WRITER, "look around", conversation_id="quiet")
    assert results(frames) == ["(empty)", "(no matches)"]
    assert not (workspace / "agents" / "writer" / "files").exists()


@tool
async def save_note(text: str, fs: AgentFileSystem) -> str:
    """Save a note through the injected filesystem.

    Args:
        text: What to save.
    """
    await fs.write("saved/note.md", text)
    return "saved"


@agent(name="injected")
class Injected:
    tools = [save_note]

    @prompt
    async def chat(self, message: str, session: StreamingSession, fs: AgentFileSystem) -> None:
        await fs.write("from-prompt.md", f"prompt saw: {message}")
        await session.stream(message)


async def test_the_filesystem_is_injected_scoped_to_the_conversation(workspace: Path) -> None:
    runtime = ScriptedRuntime(
        [
            [ToolCall("read_file", {"path": "from-prompt.md"})],
            [ToolCall("save_note", {"text": "via tool"})],
            [ToolCall("read_file", {"path": "saved/note.md"})],
            "done",
        ]
    )
    app = make_app([Injected], runtime=runtime, workspace=workspace)
    async with client_for(app) as client:
        first = await post_prompt(client, "/atmosphere/agent/injected", "hi", "conv-a")
        other = await post_prompt(client, "/atmosphere/agent/injected", "yo", "conv-b")
    assert results(first) == ["prompt saw: hi", "saved", "via tool"]
    assert results(other) == ["prompt saw: yo", "saved", "via tool"]
    files = workspace / "agents" / "injected" / "files"
    assert tree(files / "conv-a") == {
        "from-prompt.md": b"prompt saw: hi",
        "saved/note.md": b"via tool",
    }
    assert (files / "conv-b" / "from-prompt.md").read_text() == "prompt saw: yo"


async def test_get_file_system_serves_host_routes(workspace: Path) -> None:
    runtime = ScriptedRuntime(
        [[ToolCall("write_file", {"path": "report.md", "content": "# Q3"})], "done"]
    )
    app = make_app([Writer], runtime=runtime, workspace=workspace)

    @app.get("/report")
    async def report(fs: AgentFileSystemDep) -> dict[str, str]:
        return {"text": await fs.read("report.md")}

    async with client_for(app) as client:
        await post_prompt(client, WRITER, "write the report", conversation_id="c-7")
        assert (await client.get("/report", params={"conversationId": "c-7"})).json() == {
            "text": "# Q3"
        }
        named = await client.get("/report", params={"conversationId": "c-7", "agent": "writer"})
        assert named.json() == {"text": "# Q3"}
        assert (await client.get("/report", params={"conversationId": "../x"})).status_code == 400
        unknown = await client.get("/report", params={"conversationId": "c-7", "agent": "nope"})
        assert unknown.status_code == 404
        assert (await client.get("/report")).status_code == 422
    assert not (workspace / "agents" / "writer" / "files" / "x").exists()


async def test_get_file_system_needs_an_agent_when_several_have_files(workspace: Path) -> None:
    app = make_app([Writer, Injected], runtime=ScriptedRuntime(), workspace=workspace)

    @app.get("/probe")
    async def probe(fs: AgentFileSystemDep) -> list[str]:
        return await fs.glob("**")

    async with client_for(app) as client:
        ambiguous = await client.get("/probe", params={"conversationId": "c"})
        assert ambiguous.status_code == 400
        assert "pass agent= one of ['injected', 'writer']" in ambiguous.json()["detail"]
        chosen = await client.get("/probe", params={"conversationId": "c", "agent": "injected"})
        assert chosen.json() == []


async def test_get_file_system_can_be_overridden(workspace: Path, tmp_path: Path) -> None:
    mine = WorkspaceAgentFileSystem(tmp_path / "mine")
    await mine.write("hello.md", "from the override")
    app = make_app([Writer], runtime=ScriptedRuntime(), workspace=workspace)
    app.dependency_overrides[get_file_system] = lambda: mine

    @app.get("/hello")
    async def hello(fs: AgentFileSystemDep) -> str:
        return await fs.read("hello.md")

    async with client_for(app) as client:
        assert (await client.get("/hello")).json() == "from the override"


Demo = echo(agent(name="demo"), "Demo")


async def test_the_demo_model_saves_its_result_to_a_file(workspace: Path) -> None:
    app = make_app([Demo], runtime=ScriptedRuntime.demo(), workspace=workspace)
    async with client_for(app) as client:
        frames = await post_prompt(
            client,
            "/atmosphere/agent/demo",
            "plan a short task and save the result to a file",
            conversation_id="demo-1",
        )
    tools = [frame["data"]["tool"] for frame in of_type(frames, "tool-result")]
    assert tools == ["write_todos", "write_file", "write_todos"]
    assert results(frames)[1] == "Wrote notes/task.md"
    saved = workspace / "agents" / "demo" / "files" / "demo-1" / "notes" / "task.md"
    assert saved.read_text().startswith("# plan a short task and save the result to a file\n")
    assert frames[-1]["data"]["summary"].endswith(
        "saved the result to notes/task.md. Every step is completed."
    )


@tool
async def fetch_page(url: str) -> str:
    """Fetch a (very long) page."""
    return "".join(f"{url} line {n}\n" for n in range(3000))


Researcher = echo(
    ai_endpoint("/atmosphere/researcher", harness=(Harness.FILESYSTEM,)),
    "Researcher",
    tools=[fetch_page],
)


def read_back(request: ModelRequest) -> list[ToolCall] | str:
    """Page through the offloaded output the previous tool result points at."""
    last = request.messages[-1].content
    saved = re.search(r"Full output saved to (\S+) — ", last)
    if saved:
        return [ToolCall("read_file", {"path": saved.group(1), "offset": 2990})]
    return "read it"


async def test_offload_and_read_back_over_http(workspace: Path) -> None:
    runtime = ScriptedRuntime(
        [[ToolCall("fetch_page", {"url": "https://example.test"})], read_back, read_back]
    )
    app = make_app([Researcher], runtime=runtime, workspace=workspace)
    async with client_for(app) as client:
        frames = await post_prompt(client, "/atmosphere/researcher", "research", "r-1")
    offloaded, tail = results(frames)
    assert offloaded.startswith("https://example.test line 0\n")
    assert "chars truncated. Full output saved to tool-output/fetch_page-" in offloaded
    assert runtime.requests[1].messages[-1].content == offloaded
    assert tail == "".join(f"https://example.test line {n}\n" for n in range(2990, 3000))
    outputs = workspace / "endpoints" / "atmosphere-researcher" / "files" / "r-1" / "tool-output"
    [saved] = list(outputs.iterdir())
    assert saved.read_text() == "".join(f"https://example.test line {n}\n" for n in range(3000))


async def test_console_info_reports_the_filesystem(workspace: Path) -> None:
    async with client_for(make_app([Writer], runtime=ScriptedRuntime(), workspace=workspace)) as c:
        info = (await c.get("/api/console/info")).json()
    assert info["harness"]["filesystem"] == "ACTIVE(builtin)"
    [endpoint] = info["endpoints"]
    assert endpoint["harness"]["filesystem"] == "ACTIVE(builtin)"
    assert set(FILE_TOOL_NAMES) <= set(endpoint["tools"])


async def test_routes_from_the_environment_are_shared_across_conversations(
    workspace: Path, tmp_path: Path
) -> None:
    runtime = ScriptedRuntime(
        [[ToolCall("write_file", {"path": "memory/prefs.md", "content": "tea"})], "ok"]
    )
    reader = ScriptedRuntime([[ToolCall("read_file", {"path": "memory/prefs.md"})], "ok"])
    settings = HarnessSettings(
        workspace_root=workspace, filesystem_routes=f"memory/={tmp_path / 'durable'}"
    )
    for active, conversation in ((runtime, "first"), (reader, "second")):
        app = FastAPI()
        app.include_router(create_harness_router(settings, agents=[Writer], runtime=active))
        async with client_for(app) as client:
            frames = await post_prompt(client, WRITER, "remember", conversation)
    assert results(frames) == ["tea"]
    assert (tmp_path / "durable" / "files" / "shared" / "memory" / "prefs.md").read_text() == "tea"
    assert not (workspace / "agents" / "writer" / "files" / "first" / "memory").exists()
