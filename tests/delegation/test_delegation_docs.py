"""The examples of docs/delegation.md and docs/governance.md run as written (uvicorn, loopback)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx2
import pytest

from atmosphere_harness import ScriptedRuntime, ToolApprovalPolicy, ToolCall, ToolKind
from tests.delegation_support import governed_app, open_prompt
from tests.support import client_for, doc_example, of_type, serve
from tests.support import prompt as post_prompt

DOCS = Path(__file__).resolve().parents[2] / "docs"


async def test_the_delegation_example_delegates_and_spawns(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_WORKSPACE_ROOT", str(workspace))
    app = doc_example(DOCS / "delegation.md", "team_app").app
    async with client_for(app) as client:
        asked = await post_prompt(
            client, "/atmosphere/agent/lead", "ask the research agent about otters"
        )
        spawned = await post_prompt(
            client,
            "/atmosphere/agent/lead",
            "Use the task tool to spawn a general-purpose subagent to brainstorm three "
            "team-building activities, then give me its report.",
        )
        info = (await client.get("/api/console/info")).json()
    assert asked[-1]["data"]["summary"].endswith("Three facts about otters: ...")
    assert [f["event"] for f in spawned if f["event"].startswith("subagent")] == [
        "subagent-start",
        "subagent-end",
    ]
    assert len(of_type(spawned, "plan-update")) == 2
    assert {e["path"] for e in info["endpoints"]} == {
        "/atmosphere/agent/lead",
        "/atmosphere/agent/writer",
    }


async def test_the_headless_start_up_line_says_where_it_is_explained(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ATMOSPHERE_WORKSPACE_ROOT", str(workspace))
    app = doc_example(DOCS / "delegation.md", "team_app").app
    with caplog.at_level(logging.INFO, logger="atmosphere_harness"):
        async with client_for(app):
            pass
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("headless")]
    assert line.endswith(" see='docs/delegation.md#headless-agents'"), line
    page = (DOCS / "delegation.md").read_text()
    assert "\n## Headless agents\n" in page
    assert f"INFO atmosphere_harness._kernel.host {line}\n" in page, "the docs quote it as logged"


async def test_the_governance_example_policy_and_approval(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_WORKSPACE_ROOT", str(workspace))
    module = doc_example(DOCS / "governance.md", "governed_app")
    async with client_for(module.app) as client:
        info = (await client.get("/api/console/info")).json()
    assert "send_invoice" in info["endpoints"][0]["tools"]

    runtime = ScriptedRuntime(
        [
            [
                ToolCall("write_file", {"path": "prod/config.yml", "content": "x"}),
                ToolCall("send_invoice", {"customer": "acme", "amount": 500}),
            ],
            "done",
        ]
    )
    app = governed_app(
        [module.Billing],
        runtime=runtime,
        workspace=workspace,
        policies=[module.NoProductionPaths()],
        approval_policy=ToolApprovalPolicy.custom(
            lambda tool: tool.requires_approval or tool.kind is ToolKind.DELETE
        ),
    )
    path = "/atmosphere/agent/billing"
    async with (
        serve(app) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
        open_prompt(client, path, "bill acme") as reader,
    ):
        asked = await reader.until("approval-required")
        assert asked["data"]["arguments"] == {"customer": "acme", "amount": 500}
        edit = {"approve": True, "arguments": {"customer": "acme", "amount": 450}}
        answer = await client.post(f"{path}/approvals/{asked['data']['approvalId']}", json=edit)
        assert answer.json()["status"] == "approved"
        rest = await reader.rest()
    answers = [m.content for m in runtime.requests[-1].messages if m.role == "tool"]
    assert json.loads(answers[0])["message"] == (
        "Tool write_file denied by policy 'no-production-paths': prod/ is read-only for agents"
    )
    assert answers[1] == "invoice for 450 sent to acme"
    assert rest[-1]["event"] == "complete"
