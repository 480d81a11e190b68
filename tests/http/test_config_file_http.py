"""`ATMOSPHERE_CONFIG_FILE` end to end: a Spring-style file configures a served app."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI

from atmosphere_harness import ScriptedRuntime, agent, ai_endpoint, create_harness_router
from atmosphere_harness._errors import ConfigFileError
from tests.agents import echo
from tests.support import client_for

Assistant = echo(agent(name="assistant"), "Assistant")
Webhook = echo(ai_endpoint("/atmosphere/internal-webhook"), "Webhook")
Chat = echo(ai_endpoint("/atmosphere/chat"), "Chat")


def app() -> FastAPI:
    """Settings come from the environment when the app starts (no HarnessSettings given)."""
    application = FastAPI()
    application.include_router(
        create_harness_router(agents=[Assistant, Webhook, Chat], runtime=ScriptedRuntime())
    )
    return application


async def test_an_application_yml_configures_the_running_harness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "application.yml"
    path.write_text(
        f"""\
atmosphere:
  workspace:
    root: {tmp_path / "workspace"}
  ai:
    harness:
      enabled: true
      exclude-paths:
        - /atmosphere/internal-webhook
      prompt-cache-default: aggressive
""",
        encoding="utf-8",
    )
    monkeypatch.setenv("ATMOSPHERE_CONFIG_FILE", str(path))
    monkeypatch.setenv("ATMOSPHERE_AI_HARNESS_PROMPT_CACHE_DEFAULT", "conservative")
    async with client_for(app()) as client:
        info = (await client.get("/api/console/info")).json()
        answer = await client.post("/atmosphere/chat", json={"message": "hi"})
    endpoints = {endpoint["path"]: endpoint for endpoint in info["endpoints"]}
    assert endpoints["/atmosphere/chat"]["features"], "enabled=true upgrades a bare ai_endpoint"
    assert endpoints["/atmosphere/internal-webhook"]["features"] == [], "excluded by the file"
    assert info["harness"]["prompt-cache-default"] == "conservative", "the environment wins"
    assert info["harness"]["durable-runs"] != "INACTIVE(disabled)", "enabled=true implies it"
    assert answer.status_code == 200
    assert (tmp_path / "workspace" / "atmosphere.db").exists(), "the file's workspace root"


async def test_a_broken_file_stops_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "application.properties"
    monkeypatch.setenv("ATMOSPHERE_CONFIG_FILE", str(path))  # never written: missing
    application = app()
    with pytest.raises(ConfigFileError, match=r"^ATMOSPHERE_CONFIG_FILE=.*: no such file"):
        async with application.router.lifespan_context(application):
            pass
