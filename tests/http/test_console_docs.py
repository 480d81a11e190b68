"""The example of docs/console.md runs as written: console, WebSocket, admin API, AG-UI."""

from __future__ import annotations

from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from tests.http.test_agui_http import run_agui, run_input
from tests.http.test_websocket import run_over, ws_url
from tests.support import client_for, doc_example, serve

DOC = Path(__file__).resolve().parents[2] / "docs" / "console.md"
AGENT = "/atmosphere/agent/assistant"


async def test_the_documented_app_serves_the_console_and_its_transports(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_WORKSPACE_ROOT", str(workspace))
    app = doc_example(DOC, "console_app").app
    async with serve(app) as base, client_for(app) as client:
        assert (await client.get("/atmosphere/console/")).status_code == 200
        async with connect(ws_url(base, AGENT, conversationId="docs")) as socket:
            frames = await run_over(
                socket, {"message": "plan a short task and save the result to a file"}
            )
        assert frames[-1]["event"] == "complete"
        auth = {"X-Atmosphere-Auth": "change-me"}
        plan = await client.get(
            "/api/admin/agents/assistant/plan", params={"conversationId": "docs"}, headers=auth
        )
        content = await client.get(
            "/api/admin/agents/assistant/files/content",
            params={"conversationId": "docs", "path": "notes/task.md"},
            headers=auth,
        )
        events = await run_agui(client, AGENT, run_input("docs-agui", "hello"))
    assert [step["status"] for step in plan.json()["steps"]] == ["completed"] * 3
    assert content.json()["content"].startswith("# plan a short task")
    assert events[-1]["type"] == "RUN_FINISHED"
    assert events[-1]["result"] == "You said: hello"
