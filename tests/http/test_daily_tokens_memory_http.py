"""The per-user daily token cap counts the harness's own model calls (compaction summaries,
fact extraction), over loopback HTTP, and only the cap: a run's `UsageLimits` never see them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx2
from fastapi import FastAPI, Request

from atmosphere_harness import ModelRequest, ModelResponse, Usage, agent, get_user_id
from atmosphere_harness._kernel.budget import UserDailyTokensHook, utc_day
from atmosphere_harness._runtimes.base import AiCapability, TextSink
from atmosphere_harness._web.deps import STATE_KEY, user_id_from_header
from tests.agents import echo
from tests.support import client_for, make_app, parse_sse

PATH = "/atmosphere/agent/metered"
TURN = Usage(input_tokens=6, output_tokens=4)
SUMMARY = Usage(input_tokens=400, output_tokens=100)
EXTRACTION = Usage(input_tokens=250, output_tokens=50)

Metered = echo(agent(name="metered"), "Metered")


class MeteredModel:
    """Reports usage: 10 tokens a turn, 500 a summary, 300 an extraction."""

    name = "scripted"
    capabilities = frozenset({AiCapability.STREAMING})

    def __init__(self) -> None:
        self.purposes: list[str] = []

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        purpose = str(request.metadata.get("purpose", "turn"))
        self.purposes.append(purpose)
        if purpose == "memory-summary":
            return ModelResponse(text="They counted.", usage=SUMMARY)
        if purpose == "memory-extraction":
            return ModelResponse(text=json.dumps(["Counts numbers"]), usage=EXTRACTION)
        return ModelResponse(text="ok", usage=TURN)


def app_for(workspace: Path, runtime: MeteredModel, **settings: Any) -> FastAPI:
    app = make_app([Metered], runtime=runtime, workspace=workspace, **settings)
    app.dependency_overrides[get_user_id] = user_id_from_header

    @app.get("/daily")
    async def daily(user: str, request: Request) -> int:
        """The user's tokens today, as the cap counts them."""
        host = getattr(request.state, STATE_KEY)
        cap = next(hook for hook in host.hooks if isinstance(hook, UserDailyTokensHook))
        spent: int = await cap.store.spent(user, utc_day())
        return spent

    return app


async def say(client: httpx2.AsyncClient, message: str, user: str) -> dict[str, Any]:
    body = {"message": message, "conversationId": f"c-{user}"}
    response = await client.post(PATH, json=body, headers={"X-User-Id": user})
    assert response.status_code == 200, response.text
    last: dict[str, Any] = parse_sse(response.text)[-1]
    return last


async def spent(client: httpx2.AsyncClient, user: str) -> int:
    response = await client.get("/daily", params={"user": user})
    assert response.status_code == 200, response.text
    value: int = response.json()
    return value


async def test_a_compaction_summary_counts_toward_the_users_day(workspace: Path) -> None:
    runtime = MeteredModel()
    app = app_for(
        workspace,
        runtime,
        compaction="summarizing",
        user_daily_token_limit=1_000_000,
        usage_limits={"total_tokens_limit": 15},
    )
    async with client_for(app) as client:
        prompts = 0
        while "memory-summary" not in runtime.purposes:
            assert prompts < 40, "no summary was written"
            assert (await say(client, f"number {prompts}", "alice"))["event"] == "complete"
            prompts += 1
        total = await spent(client, "alice")
    # every turn's 10 tokens and the summary's 500; the run's own limit (15 tokens) is not
    # charged with the summary, or the prompt that compacted would have failed
    assert runtime.purposes.count("memory-summary") == 1
    assert total == prompts * 10 + 500


async def test_a_user_over_the_cap_after_a_compaction_is_refused(workspace: Path) -> None:
    runtime = MeteredModel()
    app = app_for(workspace, runtime, compaction="summarizing", user_daily_token_limit=600)
    async with client_for(app) as client:
        ends = []
        for index in range(40):
            ends.append(await say(client, f"number {index}", "alice"))
            if ends[-1]["event"] == "error":
                break
        other = await say(client, "hello", "bob")
    # 10-token turns alone would allow 60 prompts; the summary's 500 tokens reach the cap, and
    # after it at most the turn of the prompt that compacted runs, then prompts are refused
    # before any model call
    compacted = runtime.purposes.index("memory-summary")
    assert runtime.purposes[compacted + 1 :].count("turn") <= 1
    assert [end["event"] for end in ends[:-1]] == ["complete"] * (len(ends) - 1)
    assert ends[-1]["event"] == "error"
    assert ends[-1]["data"]["type"] == "UsageLimitExceeded"
    assert ends[-1]["data"]["limit"] == "user_daily_token_limit"
    assert runtime.purposes.count("memory-summary") == 1
    assert other["event"] == "complete"


async def test_fact_extraction_from_the_idle_reaper_counts_toward_the_users_day(
    workspace: Path,
) -> None:
    runtime = MeteredModel()
    app = app_for(
        workspace, runtime, user_daily_token_limit=1_000_000, conversation_idle_timeout=0.2
    )
    async with client_for(app) as client:
        assert (await say(client, "I count numbers", "alice"))["event"] == "complete"
        # no close: the idle reaper closes the conversation and extracts its facts
        for _ in range(500):
            if "memory-extraction" in runtime.purposes and await spent(client, "alice") > 10:
                break
            await asyncio.sleep(0.02)
        total = await spent(client, "alice")
    assert runtime.purposes.count("memory-extraction") == 1
    assert total == 10 + 300


async def test_a_user_at_the_cap_gets_no_extraction_call(workspace: Path) -> None:
    runtime = MeteredModel()
    app = app_for(workspace, runtime, user_daily_token_limit=10)
    async with client_for(app) as client:
        assert (await say(client, "I count numbers", "alice"))["event"] == "complete"
        headers = {"X-User-Id": "alice"}
        closed = await client.post(f"{PATH}/conversations/c-alice/close", headers=headers)
        assert closed.status_code == 200
        assert (await say(client, "hello", "bob"))["event"] == "complete"
        total = await spent(client, "alice")
    # leaving `client_for` stopped the app, which waited for the pending extraction
    assert runtime.purposes == ["turn", "turn"]
    assert total == 10
