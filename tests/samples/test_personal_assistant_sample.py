"""The assistant sample end to end over loopback, on the scripted demo model: the coordinator
delegates to both fleet members, spawns a sub-agent that plans and writes a file, and the
opted-in ai_endpoint reports the full harness."""

from __future__ import annotations

from pathlib import Path

from atmosphere_harness import HarnessSettings
from samples.personal_assistant.app import create_app
from tests.support import client_for, of_type
from tests.support import prompt as post_prompt

ASSISTANT = "/atmosphere/agent/assistant"


async def test_the_assistant_delegates_spawns_and_reports_its_truth(workspace: Path) -> None:
    settings = HarnessSettings(workspace_root=workspace, llm_runtime="scripted")
    async with client_for(create_app(settings)) as client:
        research = await post_prompt(client, ASSISTANT, "ask the research agent about otters")
        writer = await post_prompt(client, ASSISTANT, "ask the writer agent to draft a thank-you")
        spawned = await post_prompt(
            client,
            ASSISTANT,
            "Use the task tool to spawn a general-purpose subagent to brainstorm three "
            "team-building activities, then give me its report.",
        )
        chat = await post_prompt(client, "/atmosphere/ai-chat", "hello")
        info = (await client.get("/api/console/info")).json()

    assert research[-1]["data"]["summary"] == (
        "The research agent replied:\n\n"
        "Sea otters hold hands while they sleep so they do not drift apart."
    )
    assert writer[-1]["data"]["summary"] == (
        "The writer agent replied:\n\nYou said: draft a thank-you"
    )
    assert [f["data"]["status"] for f in of_type(spawned, "subagent-end")] == ["completed"]
    assert len(of_type(spawned, "plan-update")) == 2
    assert "report.md" in of_type(spawned, "tool-result")[0]["data"]["result"]
    assert chat[-1]["data"]["summary"] == "You said: hello"

    assert info["harness"]["delegation"] == "ACTIVE"
    endpoints = {e["path"]: e for e in info["endpoints"]}
    assert set(endpoints) == {ASSISTANT, "/atmosphere/agent/writer", "/atmosphere/ai-chat"}
    assert endpoints[ASSISTANT]["kind"] == "coordinator"
    assert {"delegate_task", "task", "write_todos"} <= set(endpoints[ASSISTANT]["tools"])
    opted_in = endpoints["/atmosphere/ai-chat"]
    assert opted_in["kind"] == "ai-endpoint"
    assert opted_in["features"] == ["memory", "cache", "delegation", "planning", "filesystem"]
    assert opted_in["harness"]["planning"] == "ACTIVE(builtin)"
    assert opted_in["harness"]["delegation"] == "INACTIVE(no-coordinator)"
