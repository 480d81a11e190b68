"""The per-user daily token cap (`ATMOSPHERE_AI_USER_DAILY_TOKEN_LIMIT`), embedded counter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2

from atmosphere_harness import ModelRequest, ModelResponse, StreamingSession, Usage, prompt
from atmosphere_harness._kernel.budget import InProcessUserTokens, utc_day
from atmosphere_harness._registry import AgentRegistry
from atmosphere_harness._runtimes.base import AiCapability, TextSink
from tests.support import client_for, make_app, parse_sse

PATH = "/atmosphere/agent/capped"
TURN_TOKENS = 100


class HundredTokens:
    """Answers every request with 60 input and 40 output tokens."""

    name = "scripted"
    capabilities = frozenset({AiCapability.STREAMING})

    def __init__(self) -> None:
        self.calls = 0

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        self.calls += 1
        return ModelResponse(text="ok", usage=Usage(input_tokens=60, output_tokens=40))


def capped_agent() -> type:
    registry = AgentRegistry()

    @registry.agent(name="capped", harness=())
    class Capped:
        @prompt
        async def chat(self, message: str, session: StreamingSession) -> None:
            await session.stream(message)

    return Capped


async def ask(client: httpx2.AsyncClient, user: str | None) -> dict[str, Any]:
    headers = {"X-User-Id": user} if user else {}
    response = await client.post(PATH, json={"message": "hi"}, headers=headers)
    frames = parse_sse(response.text)
    last: dict[str, Any] = frames[-1]
    return last


async def test_a_user_over_the_daily_cap_is_refused_and_others_are_not(workspace: Path) -> None:
    runtime = HundredTokens()
    app = make_app(
        [capped_agent()],
        runtime=runtime,
        workspace=workspace,
        user_id_header="X-User-Id",
        user_daily_token_limit=250,
    )
    async with client_for(app) as client:
        ends = [(await ask(client, "alice"))["event"] for _ in range(4)]
        refused = await ask(client, "alice")
        bob = await ask(client, "bob")
        anonymous = await ask(client, None)

    # 0, 100 and 200 spent before the first three: under 250, they run; 300 is not
    assert ends == ["complete", "complete", "complete", "error"]
    assert refused["data"]["type"] == "UsageLimitExceeded"
    assert refused["data"]["limit"] == "user_daily_token_limit"
    assert bob["event"] == "complete"
    assert anonymous["event"] == "complete"
    assert runtime.calls == 3 + 1 + 1


async def test_the_embedded_counter_keeps_only_the_current_day() -> None:
    counter = InProcessUserTokens()
    assert await counter.add("alice", "2026-01-01", 5) == 5
    assert await counter.add("alice", "2026-01-01", 7) == 12
    assert await counter.add("alice", "2026-01-02", 1) == 1
    assert await counter.spent("alice", "2026-01-01") == 0
    assert utc_day(0) == "1970-01-01"


async def test_a_reservation_is_refused_at_the_cap_floored_by_the_last_call_and_settled() -> None:
    counter = InProcessUserTokens()
    day = "2026-01-01"
    assert await counter.reserve("alice", day, 5, limit=100) == 5
    await counter.settle("alice", day, 5, 60, remember=True)
    assert await counter.spent("alice", day) == 60
    # the next reservation is at least the user's last call; it counts at once
    assert await counter.reserve("alice", day, 5, limit=100) == 60
    assert await counter.spent("alice", day) == 120
    assert await counter.reserve("alice", day, 5, limit=100) is None
    # a failed call gives its reservation back; a harness call is not remembered
    await counter.settle("alice", day, 60, 0, remember=True)
    assert await counter.spent("alice", day) == 60
    assert await counter.reserve("alice", day, 1, limit=100) == 60
    await counter.settle("alice", day, 60, 500, remember=False)
    assert await counter.spent("alice", day) == 560
    assert await counter.reserve("bob", day, 0, limit=100) == 1


class FailsOnce(HundredTokens):
    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        if self.calls == 0:
            self.calls += 1
            raise RuntimeError("the provider failed")
        return await super().complete(request, on_text=on_text)


async def test_a_failed_call_gives_its_reservation_back(workspace: Path) -> None:
    runtime = FailsOnce()
    app = make_app(
        [capped_agent()],
        runtime=runtime,
        workspace=workspace,
        user_id_header="X-User-Id",
        user_daily_token_limit=150,
    )
    async with client_for(app) as client:
        ends = [(await ask(client, "alice"))["event"] for _ in range(4)]
    # the failed call costs nothing; then 0 and 100 spent are under 150, 200 is not
    assert ends == ["error", "complete", "complete", "error"]
