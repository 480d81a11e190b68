"""End to end: Claude's memory tool writes into the conversation workspace the admin surface reads.

A default `@agent` on `AnthropicRuntime` (through the fake Messages server) gets the native file
surface under `filesystem=auto`; the model's `memory` commands land in
`{workspace}/agents/{owner}/files/{conversationId}/`, which the admin workspace REST
(`GET /api/admin/agents/{name}/files` and `/files/content`, with an admin token) lists and serves
back. `builtin` forces the eight tools instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from atmosphere_harness import (
    HarnessSettings,
    agent,
    create_harness_router,
)
from atmosphere_harness._runtimes.anthropic import AnthropicRuntime
from tests.agents import echo
from tests.fake_providers import Stream, anthropic_text, anthropic_tool_uses, fake_anthropic
from tests.support import client_for, serve
from tests.support import prompt as post_prompt

pytest.importorskip(
    "atmosphere_harness._filesystem.primitive", reason="needs the filesystem primitive"
)

FILE_TOOLS = {"ls", "read_file", "write_file", "edit_file", "glob", "grep", "delete", "rename"}


ClaudeNotes = echo(agent(name="claude-notes"), "ClaudeNotes")


PATH = "/atmosphere/agent/claude-notes"


ADMIN = "/api/admin/agents/claude-notes"
TOKEN = "native-files-admin-token"
AUTH = {"X-Atmosphere-Auth": TOKEN}


def app_for(base: str, workspace: Path, **settings: Any) -> FastAPI:
    runtime = AnthropicRuntime("claude-fake", base_url=base, api_key="sk-ant-test")
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace, admin_token=TOKEN, **settings),
            agents=[ClaudeNotes],
            runtime=runtime,
        )
    )
    return app


async def test_memory_tool_writes_into_the_workspace(workspace: Path) -> None:
    create = {"command": "create", "path": "/memories/notes/plan.md", "file_text": "1. add\n"}
    edit = {
        "command": "str_replace",
        "path": "/memories/notes/plan.md",
        "old_str": "1. add",
        "new_str": "1. add (done)",
    }
    view = {"command": "view", "path": "/memories"}
    fake = fake_anthropic().script(
        Stream(anthropic_tool_uses([("tu_1", "memory", json.dumps(create))])),
        Stream(anthropic_tool_uses([("tu_2", "memory", json.dumps(edit))])),
        Stream(anthropic_tool_uses([("tu_3", "memory", json.dumps(view))])),
        Stream(anthropic_text("Noted.")),
    )
    async with serve(fake.app) as base, client_for(app_for(base, workspace)) as client:
        info = (await client.get("/api/console/info")).json()
        response = await client.post(PATH, json={"message": "note the plan"})
        conversation = response.headers["x-conversation-id"]
        root = await client.get(
            f"{ADMIN}/files", params={"conversationId": conversation}, headers=AUTH
        )
        notes = await client.get(
            f"{ADMIN}/files", params={"conversationId": conversation, "path": "notes"}, headers=AUTH
        )
        content = await client.get(
            f"{ADMIN}/files/content",
            params={"conversationId": conversation, "path": "notes/plan.md"},
            headers=AUTH,
        )
        anonymous = await client.get(
            f"{ADMIN}/files/content",
            params={"conversationId": conversation, "path": "notes/plan.md"},
        )
    [endpoint] = info["endpoints"]
    assert endpoint["harness"]["filesystem"] == "ACTIVE(native:anthropic)"
    assert info["harness"]["filesystem"] == "ACTIVE(native:anthropic)"
    assert "memory" in endpoint["tools"]
    assert FILE_TOOLS.isdisjoint(endpoint["tools"]), "one file surface, never both"

    on_disk = workspace / "agents" / "claude-notes" / "files" / conversation / "notes" / "plan.md"
    assert on_disk.read_text() == "1. add (done)\n"
    # The admin workspace REST lists and serves the file the memory tool wrote.
    assert root.status_code == 200
    assert root.json() == {
        "agent": "claude-notes",
        "conversationId": conversation,
        "sessionId": conversation,
        "path": ".",
        "entries": [{"path": "notes", "size": 0, "directory": True}],
    }
    assert notes.json()["entries"] == [
        {"path": "notes/plan.md", "size": len("1. add (done)\n"), "directory": False}
    ]
    assert content.status_code == 200
    assert content.json() == {
        "agent": "claude-notes",
        "conversationId": conversation,
        "sessionId": conversation,
        "path": "notes/plan.md",
        "content": "1. add (done)\n",
    }
    assert anonymous.status_code == 401, "the workspace reads still need the admin token"

    tools = fake.bodies[0]["tools"]
    assert {"type": "memory_20250818", "name": "memory"} in [
        {k: v for k, v in tool.items() if k != "cache_control"} for tool in tools
    ]
    assert FILE_TOOLS.isdisjoint(tool.get("name") for tool in tools)
    listing = fake.bodies[3]["messages"][-1]["content"][-1]["content"]
    assert "/memories/notes/plan.md" in listing


async def test_traversal_through_the_memory_tool_is_refused(workspace: Path) -> None:
    escape = {"command": "create", "path": "/memories/../../escape.md", "file_text": "x"}
    fake = fake_anthropic().script(
        Stream(anthropic_tool_uses([("tu_1", "memory", json.dumps(escape))])),
        Stream(anthropic_text("Refused.")),
    )
    async with serve(fake.app) as base, client_for(app_for(base, workspace)) as client:
        frames = await post_prompt(client, PATH, "escape")
    result = next(f for f in frames if f["event"] == "tool-result")["data"]["result"]
    assert result.startswith("Error: ")
    assert not list(workspace.rglob("escape.md"))


async def test_builtin_mode_forces_the_eight_tools(workspace: Path) -> None:
    fake = fake_anthropic().script(Stream(anthropic_text("hi")))
    async with (
        serve(fake.app) as base,
        client_for(app_for(base, workspace, filesystem="builtin")) as client,
    ):
        info = (await client.get("/api/console/info")).json()
        await post_prompt(client, PATH, "hi")
    [endpoint] = info["endpoints"]
    assert endpoint["harness"]["filesystem"] == "ACTIVE(builtin)"
    assert set(endpoint["tools"]) >= FILE_TOOLS
    assert "memory" not in endpoint["tools"]
    sent = {tool.get("name") for tool in fake.bodies[0]["tools"]}
    assert sent >= FILE_TOOLS
    assert all("type" not in tool for tool in fake.bodies[0]["tools"]), "schemas, not natives"
