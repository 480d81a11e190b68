"""Retention (`ATMOSPHERE_AI_CONVERSATION_TTL`) on two real replicas sharing one PostgreSQL or
Redis store: both sweep the same conversations at once; each idle conversation is deleted
exactly once (one replica logs its deletion), a conversation whose run waits for an approval
and one prompted all along are untouched.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.reliability.server import ServerProcess

from .postgres_service import create_database, drop_database
from .redis_app import PATH
from .redis_service import delete_prefix, new_prefix, require_redis
from .redis_service import url_for as redis_url_for
from .replicas import USER, prompt, two_replicas

pytestmark = pytest.mark.services

TTL = 4.0
IDLE = 12


@pytest.fixture(params=["postgres", "redis"])
def servers(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[ServerProcess, ServerProcess, Path]]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {"ATMOSPHERE_AI_CONVERSATION_TTL": str(TTL), "TEST_SERVER_LOG_LEVEL": "INFO"}
    if request.param == "postgres":
        url = create_database()
        try:
            with two_replicas(
                "redis", workspace, tmp_path, {**env, "ATMOSPHERE_POSTGRES_URL": url}
            ) as pair:
                yield (*pair, tmp_path)
        finally:
            drop_database(url)
        return
    require_redis()
    prefix = new_prefix()
    try:
        env["ATMOSPHERE_REDIS_URL"] = redis_url_for(prefix)
        with two_replicas("redis", workspace, tmp_path, env) as pair:
            yield (*pair, tmp_path)
    finally:
        delete_prefix(prefix)


def deletions(logs: Path, conversation: str) -> int:
    """How many times the replicas' logs say they deleted `conversation`."""
    pattern = re.compile(rf"conversation deleted .*conversation='{re.escape(conversation)}'")
    return sum(
        1
        for name in ("a.log", "b.log")
        for line in (logs / name).read_text(errors="replace").splitlines()
        if pattern.search(line)
    )


async def test_two_replicas_delete_each_idle_conversation_once(
    servers: tuple[ServerProcess, ServerProcess, Path],
) -> None:
    a, b, logs = servers
    tag = uuid.uuid4().hex[:6]
    idle = [f"idle-{tag}-{n}" for n in range(IDLE)]
    busy, lively = f"busy-{tag}", f"lively-{tag}"
    async with httpx2.AsyncClient(timeout=30) as client:
        for n, conversation in enumerate(idle):
            frames = await prompt(client, (a, b)[n % 2].url, "hello", conversation, path=PATH)
            assert frames[-1]["event"] == "complete"
        started = await client.post(
            a.url + PATH,
            json={"message": "transfer 5", "conversationId": busy, "background": True},
            headers=USER,
        )
        assert started.status_code == 202, started.text
        run_id = started.json()["runId"]

        async def keep_prompting() -> None:
            """A conversation prompted all along (well within the ttl), on either replica."""
            turns = 0
            while True:
                await prompt(client, (a, b)[turns % 2].url, "still here", lively, path=PATH)
                turns += 1
                await asyncio.sleep(0.5)

        lively_prompts = asyncio.create_task(keep_prompting())
        try:
            deadline = time.monotonic() + 90
            remaining = set(idle)
            while remaining:
                assert time.monotonic() < deadline, f"never deleted: {sorted(remaining)}"
                for conversation in list(remaining):
                    found = await client.get(
                        f"{b.url}{PATH}/conversations/{conversation}/messages", headers=USER
                    )
                    if found.status_code == 404:
                        remaining.discard(conversation)
                await asyncio.sleep(0.3)
            await asyncio.sleep(TTL)  # a few more sweeps of both replicas
        finally:
            lively_prompts.cancel()
        for conversation in idle:
            assert deletions(logs, conversation) == 1, conversation
        status = (await client.get(f"{a.url}{PATH}/runs/{run_id}", headers=USER)).json()
        assert status["status"] == "waiting-approval"
        for conversation in (busy, lively):
            kept = await client.get(
                f"{b.url}{PATH}/conversations/{conversation}/messages", headers=USER
            )
            assert kept.status_code == 200, conversation
            assert deletions(logs, conversation) == 0
        await client.post(f"{a.url}{PATH}/runs/{run_id}/cancel", headers=USER)
