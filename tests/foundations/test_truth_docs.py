"""What configuration.md, runtime-truth.md and prompt-cache.md claim about the app-wide flag and
`prompt-cache-default`, checked claim by claim on a real app over HTTP.

- `prompt-cache-default`: the app-wide value starts as the setting, else `conservative` when
  `ATMOSPHERE_AI_HARNESS_ENABLED=true`, else `none`; each endpoint whose policy is not `none`
  then writes its own. An endpoint's own value is its effective policy: annotation, then the
  setting (an explicit `none` switches caching off), then `conservative` with `Harness.CACHE`,
  then `none`; the setting holds under the kill switch too.
- the flag: blank is unset; `false` (any case) is the kill switch with no WARN, logged at INFO at
  start-up; any other value is the kill switch and logs a WARN naming it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import Harness, PromptCache, agent, ai_endpoint
from tests.agents import echo
from tests.support import client_for, make_app

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _agent() -> type:
    return echo(agent(name="helper"), "Helper")


def _opted_down() -> type:
    return echo(agent(name="plain", harness=()), "Plain")


def _bare() -> type:
    return echo(ai_endpoint("/atmosphere/bare"), "Bare")


def _aggressive() -> type:
    return echo(ai_endpoint("/atmosphere/eager", prompt_cache=PromptCache.AGGRESSIVE), "Eager")


def _memory_only() -> type:
    return echo(ai_endpoint("/atmosphere/mem", harness=(Harness.MEMORY,)), "Mem")


async def _truth(workspace: Path, agents: list[type], **settings: Any) -> dict[str, Any]:
    async with client_for(make_app(agents, workspace=workspace, **settings)) as client:
        info: dict[str, Any] = (await client.get("/api/console/info")).json()
    return info


def _cache(info: dict[str, Any]) -> tuple[str, dict[str, str]]:
    endpoints = {e["path"]: e["harness"]["prompt-cache-default"] for e in info["endpoints"]}
    return info["harness"]["prompt-cache-default"], endpoints


@pytest.mark.parametrize(
    ("agents", "settings", "app_wide", "per_endpoint"),
    [
        # The harness on, no setting: conservative, even where the only endpoint opted down.
        ([_opted_down], {"enabled": True}, "conservative", {"/atmosphere/agent/plain": "none"}),
        ([_bare], {"enabled": True}, "conservative", {"/atmosphere/bare": "conservative"}),
        # Flag unset: none until an endpoint with CACHE (a default @agent) writes conservative.
        ([_bare], {}, "none", {"/atmosphere/bare": "none"}),
        ([_memory_only], {}, "none", {"/atmosphere/mem": "none"}),
        ([_agent], {}, "conservative", {"/atmosphere/agent/helper": "conservative"}),
        # An explicit none switches the default off; a set value is every endpoint's default.
        (
            [_agent],
            {"enabled": True, "prompt_cache_default": "none"},
            "none",
            {"/atmosphere/agent/helper": "none"},
        ),
        (
            [_bare],
            {"prompt_cache_default": "aggressive"},
            "aggressive",
            {"/atmosphere/bare": "aggressive"},
        ),
        # The annotation beats the setting; the last endpoint that is not none wins app-wide.
        (
            [_aggressive, _agent],
            {"prompt_cache_default": "conservative"},
            "conservative",
            {"/atmosphere/eager": "aggressive", "/atmosphere/agent/helper": "conservative"},
        ),
        # The kill switch leaves the setting alone (and without a setting, nothing caches).
        ([_agent], {"enabled": False}, "none", {"/atmosphere/agent/helper": "none"}),
        (
            [_agent],
            {"enabled": False, "prompt_cache_default": "aggressive"},
            "aggressive",
            {"/atmosphere/agent/helper": "aggressive"},
        ),
    ],
)
async def test_prompt_cache_default_reads_as_documented(
    workspace: Path,
    agents: list[Any],
    settings: dict[str, Any],
    app_wide: str,
    per_endpoint: dict[str, str],
) -> None:
    info = await _truth(workspace, [make() for make in agents], **settings)
    assert _cache(info) == (app_wide, per_endpoint)


async def test_the_kill_switch_keeps_features_disabled_and_the_seams_their_settings(
    workspace: Path,
) -> None:
    info = await _truth(workspace, [_agent()], enabled=False, compaction="summarizing")
    harness = info["harness"]
    for key in ("conversation-memory", "long-term-memory", "planning", "filesystem", "delegation"):
        assert harness[key] == "INACTIVE(disabled)"
    assert harness["compaction"] == "summarizing"


@pytest.mark.parametrize(
    ("raw", "kill_switch", "warns"),
    [
        ("false", True, False),
        ("FALSE", True, False),
        ("yes", True, True),
        ("1", True, True),
        ("on", True, True),
        ("  ", False, False),
        ("True", False, False),
    ],
)
async def test_the_flag_warns_only_for_a_value_that_is_neither_true_nor_false(
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    raw: str,
    kill_switch: bool,
    warns: bool,
) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_HARNESS_ENABLED", raw)
    with caplog.at_level(logging.INFO, logger="atmosphere_harness"):
        app = make_app([_agent()], workspace=workspace)
        async with client_for(app) as client:
            info = (await client.get("/api/console/info")).json()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    named = [m for m in warnings if "ATMOSPHERE_AI_HARNESS_ENABLED" in m]
    assert bool(named) is warns, warnings
    if warns:
        assert repr(raw) in named[0], "the WARN names the value"
        assert "kill switch" in named[0]
    started = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("harness started")
    ]
    assert len(started) == 1
    assert ("mode='kill switch'" in started[0]) is kill_switch, started
    planning = info["harness"]["planning"]
    assert (planning == "INACTIVE(disabled)") is kill_switch


def test_the_pages_say_what_these_tests_check() -> None:
    configuration, truth, cache = (
        " ".join((DOCS / page).read_text(encoding="utf-8").split())
        for page in ("configuration.md", "runtime-truth.md", "prompt-cache.md")
    )
    assert "`false` (any case) is the kill switch, logged at start-up at INFO" in configuration
    assert "any other value (`yes`, `1`, `on`) is the kill switch too" in configuration
    assert "logs a WARN naming the value" in configuration
    assert "every default `@agent`) caches `conservative`, any other `none`" in configuration
    assert "otherwise `conservative` when `ATMOSPHERE_AI_HARNESS_ENABLED=true`" in truth
    assert "with the flag unset, one default `@agent` makes it `conservative`" in truth
    assert "an explicit `none` switches the harness default off" in cache
    assert "with none `conservative` when `ATMOSPHERE_AI_HARNESS_ENABLED=true` and `none`" in cache
