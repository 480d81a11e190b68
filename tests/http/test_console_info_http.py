"""GET /api/console/info over HTTP: runtime truth app-wide and per endpoint."""

from __future__ import annotations

from pathlib import Path

from atmosphere_harness import (
    Harness,
    ScriptedRuntime,
    agent,
    ai_endpoint,
)
from tests.agents import echo
from tests.support import client_for, make_app

FEATURE_KEYS = ("conversation-memory", "long-term-memory", "delegation", "planning", "filesystem")


TruthAgent = echo(agent(name="truth-agent"), "TruthAgent")


BareAgent = echo(agent(name="bare-agent", harness=()), "BareAgent")


BareEndpoint = echo(ai_endpoint("/atmosphere/ai-chat"), "BareEndpoint")


OptInEndpoint = echo(ai_endpoint("/atmosphere/optin", harness=(Harness.MEMORY,)), "OptInEndpoint")


async def info(app) -> dict:
    async with client_for(app) as client:
        response = await client.get("/api/console/info")
        assert response.status_code == 200
        return response.json()


def by_path(data: dict) -> dict[str, dict]:
    return {endpoint["path"]: endpoint for endpoint in data["endpoints"]}


async def test_default_agent_app(workspace: Path) -> None:
    data = await info(make_app([TruthAgent], runtime=ScriptedRuntime(), workspace=workspace))
    harness = data["harness"]
    assert harness["prompt-cache-default"] == "conservative"
    assert harness["compaction"] == "sliding-window"
    assert harness["skills"] == "CONVENTION"
    assert harness["delegation"] == "INACTIVE(disabled)"
    endpoint = by_path(data)["/atmosphere/agent/truth-agent"]
    assert endpoint["kind"] == "agent"
    assert endpoint["owner"] == "truth-agent"
    assert endpoint["features"] == ["memory", "cache", "delegation", "planning", "filesystem"]
    assert endpoint["harness"]["delegation"] == "INACTIVE(no-coordinator)"
    assert endpoint["harness"]["prompt-cache-default"] == "conservative"
    for key in FEATURE_KEYS:
        # App-wide ACTIVE exactly when the one endpoint really attached the primitive.
        assert harness[key].startswith("ACTIVE") == (key in _attached_keys(endpoint)), key
    assert data["backends"] == {"state": "sqlite", "events": "local", "workspace": "files"}
    assert data["runtime"] == {
        "name": "scripted",
        "capabilities": ["parallel-tool-calls", "streaming", "system-prompt", "tool-calling"],
    }


def _attached_keys(endpoint: dict) -> set[str]:
    return {key for key, state in endpoint["harness"].items() if active(state)}


def active(state: object) -> bool:
    """An `ACTIVE...` state (the endpoint's `model` chain is a list, `mcp` a map: neither)."""
    return isinstance(state, str) and state.startswith("ACTIVE")


async def test_kill_switch_reports_every_feature_disabled(workspace: Path) -> None:
    app = make_app(
        [TruthAgent, OptInEndpoint], runtime=ScriptedRuntime(), workspace=workspace, enabled=False
    )
    data = await info(app)
    for key in FEATURE_KEYS:
        assert data["harness"][key] == "INACTIVE(disabled)"
    assert data["harness"]["prompt-cache-default"] == "none"
    for endpoint in data["endpoints"]:
        assert endpoint["features"] == []
        for key in FEATURE_KEYS:
            assert endpoint["harness"][key] == "INACTIVE(disabled)"
        assert not any(active(state) for state in endpoint["harness"].values())


async def test_flag_true_upgrades_only_bare_ai_endpoints(workspace: Path) -> None:
    app = make_app(
        [BareAgent, BareEndpoint, OptInEndpoint],
        runtime=ScriptedRuntime(),
        workspace=workspace,
        enabled=True,
    )
    endpoints = by_path(await info(app))
    assert endpoints["/atmosphere/agent/bare-agent"]["features"] == []
    assert endpoints["/atmosphere/ai-chat"]["features"] == [
        "memory",
        "cache",
        "delegation",
        "planning",
        "filesystem",
    ]
    assert endpoints["/atmosphere/ai-chat"]["owner"] == "atmosphere-ai-chat"
    assert endpoints["/atmosphere/ai-chat"]["kind"] == "ai-endpoint"
    assert endpoints["/atmosphere/optin"]["features"] == ["memory"]


async def test_unset_flag_leaves_bare_endpoint_bare(workspace: Path) -> None:
    endpoints = by_path(
        await info(make_app([BareEndpoint], runtime=ScriptedRuntime(), workspace=workspace))
    )
    assert endpoints["/atmosphere/ai-chat"]["features"] == []
    assert endpoints["/atmosphere/ai-chat"]["harness"]["prompt-cache-default"] == "none"


async def test_excluded_path_gets_nothing(workspace: Path) -> None:
    app = make_app(
        [TruthAgent],
        runtime=ScriptedRuntime(),
        workspace=workspace,
        exclude_paths={"/atmosphere/agent/truth-agent"},
    )
    endpoint = by_path(await info(app))["/atmosphere/agent/truth-agent"]
    assert endpoint["features"] == []


async def test_block_absent_when_no_endpoint_resolved(workspace: Path) -> None:
    data = await info(make_app([], runtime=ScriptedRuntime(), workspace=workspace))
    assert "harness" not in data
    assert data["endpoints"] == []
