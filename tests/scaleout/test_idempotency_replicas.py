"""`Idempotency-Key` across two real replicas: a prompt sent to A and resent to B with the same
key (the client never saw A's answer) makes one turn, on PostgreSQL and on Redis; B streams A's
run instead of starting another."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.scaleout import redis_app

from .postgres_service import create_database, drop_database
from .redis_service import delete_prefix, new_prefix, require_redis
from .redis_service import url_for as redis_url_for
from .replicas import PATH, USER, prompt, summary, two_replicas

pytestmark = pytest.mark.services


@pytest.fixture(params=["postgres", "redis"])
def servers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """`(prompt path, [A's URL, B's URL])` of two replicas on one fresh store."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    if request.param == "postgres":
        url = create_database()
        try:
            with two_replicas(
                "postgres", workspace, tmp_path, {"ATMOSPHERE_POSTGRES_URL": url}
            ) as (
                a,
                b,
            ):
                yield PATH, [a.url, b.url]
        finally:
            drop_database(url)
        return
    require_redis()
    prefix = new_prefix()
    env = {"ATMOSPHERE_REDIS_URL": redis_url_for(prefix), "ATMOSPHERE_AI_HARNESS_ENABLED": "true"}
    try:
        with two_replicas("redis", workspace, tmp_path, env) as (a, b):
            yield redis_app.PATH, [a.url, b.url]
    finally:
        delete_prefix(prefix)


async def test_a_prompt_resent_to_the_other_replica_with_its_key_makes_one_turn(
    servers: tuple[str, list[str]],
) -> None:
    path, (a, b) = servers
    conversation = f"c-{uuid.uuid4().hex[:12]}"
    keyed = {**USER, "Idempotency-Key": f"send-{uuid.uuid4()}"}
    async with httpx2.AsyncClient(timeout=60) as client:
        first = await prompt(client, a, "first words", conversation, headers=keyed, path=path)
        again = await prompt(client, b, "first words", conversation, headers=keyed, path=path)
        assert [f["sessionId"] for f in again] == [f["sessionId"] for f in first]
        assert [f["seq"] for f in again] == [f["seq"] for f in first]
        check = "history?" if path == PATH else "what did I say?"
        seen = summary(await prompt(client, b, check, conversation, path=path))
    assert seen.startswith("seen: first words")
    assert seen.count("first words") == 1, seen
