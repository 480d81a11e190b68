"""The per-user daily token cap across two replicas on one PostgreSQL or Redis.

Two apps (two hosts, each with its own pool) share the backend, as two replicas do. A user's
tokens spent on one count on the other; 16 concurrent runs on each replica, started when the
user is one turn short of the cap, pass it by at most one turn all together: each call reserves
the user's last call's size in the backend before it is made.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from atmosphere_harness import ModelRequest, ModelResponse, StreamingSession, Usage, prompt
from atmosphere_harness._registry import AgentRegistry
from atmosphere_harness._runtimes.base import AiCapability, TextSink
from tests.scaleout.postgres_service import create_database, drop_database
from tests.scaleout.redis_service import delete_prefix, new_prefix, require_redis, url_for
from tests.support import client_for, make_app, parse_sse

PATH = "/atmosphere/agent/capped"
TURN = 100
RUNS_PER_REPLICA = 16
MODEL_SECONDS = 0.3
"""Long enough for every concurrent run to ask before the first one's turn ends."""


class SlowHundred:
    """100 tokens per turn, after a wait, so concurrent runs overlap."""

    name = "scripted"
    capabilities = frozenset({AiCapability.STREAMING})

    def __init__(self) -> None:
        self.calls = 0

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        self.calls += 1
        await asyncio.sleep(MODEL_SECONDS)
        return ModelResponse(text="ok", usage=Usage(input_tokens=60, output_tokens=40))


registry = AgentRegistry()


@registry.agent(name="capped", harness=())
class Capped:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


@pytest.fixture(params=["postgres", "redis"])
def backend(request: pytest.FixtureRequest) -> Any:
    if request.param == "redis":
        require_redis()
        prefix = new_prefix()
        yield {"redis_url": url_for(prefix)}
        delete_prefix(prefix)
    else:
        url = create_database()
        yield {"postgres_url": url}
        drop_database(url)


@asynccontextmanager
async def replicas(
    tmp_path: Path, settings: dict[str, Any], limit: int
) -> AsyncIterator[list[tuple[httpx2.AsyncClient, SlowHundred]]]:
    async with AsyncExitStack() as stack:
        out = []
        for name in ("a", "b"):
            runtime = SlowHundred()
            workspace = tmp_path / name
            workspace.mkdir()
            app = make_app(
                [Capped],
                runtime=runtime,
                workspace=workspace,
                user_id_header="X-User-Id",
                user_daily_token_limit=limit,
                **settings,
            )
            out.append((await stack.enter_async_context(client_for(app)), runtime))
        yield out


async def ask(client: httpx2.AsyncClient, user: str) -> str:
    response = await client.post(PATH, json={"message": "hi"}, headers={"X-User-Id": user})
    frames = parse_sse(response.text)
    event: str = frames[-1]["event"]
    return event


async def test_one_users_tokens_count_on_every_replica(tmp_path: Path, backend: Any) -> None:
    async with replicas(tmp_path, backend, limit=150) as ((first, _), (second, runtime)):
        assert await ask(first, "alice") == "complete"  # 0 spent -> 100
        assert await ask(second, "alice") == "complete"  # 100 < 150 -> 200
        assert await ask(second, "alice") == "error"  # 200 >= 150: refused on either
        assert await ask(first, "alice") == "error"
        assert await ask(first, "bob") == "complete"
    assert runtime.calls == 1


async def test_concurrent_runs_overshoot_by_at_most_one_turn_in_all(
    tmp_path: Path, backend: Any
) -> None:
    limit = 1000
    async with replicas(tmp_path, backend, limit=limit) as ((first, one), (second, two)):
        # the cap is already nearly reached when 2 x 16 runs of the same user start at once
        for _ in range(9):
            assert await ask(first, "carol") == "complete"
        ends = await asyncio.gather(
            *(ask(client, "carol") for client in (first, second) for _ in range(RUNS_PER_REPLICA))
        )
        late = await ask(second, "carol")
    spent = (one.calls + two.calls) * TURN
    overshoot = spent - limit
    print(
        f"daily cap {limit}: spent {spent}, over by {overshoot} ({ends.count('complete')} of "
        f"{len(ends)} concurrent runs completed)"
    )
    assert late == "error"
    # the first reservation (at least the user's last call: 100) takes the last 100 tokens,
    # every other run sees it and is refused: the cap is met exactly
    assert overshoot == 0
    assert ends.count("complete") == 1
