"""Conversation ownership across two real uvicorn replicas, on PostgreSQL and on Redis alone:
a conversation alice started on replica A is hers on replica B too, on every route; and two
users racing for one new id on two replicas get one owner.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import httpx2
import pytest

from tests.http.test_tenancy_http import call, refused_everywhere
from tests.reliability.server import ServerProcess

from .postgres_service import create_database, drop_database
from .redis_service import delete_prefix, new_prefix, require_redis
from .redis_service import url_for as redis_url_for
from .replicas import ADMIN_TOKEN, PATH, prompt, summary, two_replicas

pytestmark = pytest.mark.services

ALICE = {"X-User-Id": "alice"}
BOB = {"X-User-Id": "bob"}
ADMIN = {"X-Atmosphere-Auth": ADMIN_TOKEN}
KIND = "postgres-files"
"""The two-replica app without the approval gate on `write_file` (`tests.reliability.apps`)."""


@pytest.fixture(scope="module", params=["postgres", "redis"])
def servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Both replicas on one shared state backend: PostgreSQL alone, or Redis alone."""
    base = tmp_path_factory.mktemp("tenancy")
    workspace = base / "workspace"
    workspace.mkdir()
    if request.param == "postgres":
        url = create_database()
        try:
            with two_replicas(KIND, workspace, base, {"ATMOSPHERE_POSTGRES_URL": url}) as pair:
                yield pair
        finally:
            drop_database(url)
        return
    require_redis()
    prefix = new_prefix()
    try:
        with two_replicas(
            KIND, workspace, base, {"ATMOSPHERE_REDIS_URL": redis_url_for(prefix)}
        ) as pair:
            yield pair
    finally:
        delete_prefix(prefix)


def write(content: str) -> str:
    return "call: write_file " + json.dumps({"path": "salary.txt", "content": content})


async def test_a_conversation_started_on_a_is_refused_to_others_on_b(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    conversation = f"project-plan-{uuid.uuid4().hex[:8]}"
    async with (
        httpx2.AsyncClient(timeout=30) as client,
        httpx2.AsyncClient(base_url=b.url, timeout=30) as on_b,
    ):
        frames = await prompt(client, a.url, write("alice: 100"), conversation, headers=ALICE)
        assert summary(frames).startswith("result: "), summary(frames)
        for stranger in (BOB, {}):
            async with asyncio.timeout(30):
                await refused_everywhere(on_b, b.url, conversation, stranger, path=PATH)
        # The owner reaches it on B.
        seen = await prompt(client, b.url, "history?", conversation, headers=ALICE)
        plan = await call(
            on_b,
            "GET",
            PATH + "/plan/events",
            params={"conversationId": conversation},
            headers=ALICE,
        )
        content = await on_b.get(
            "/api/admin/agents/assistant/files/content",
            params={"conversationId": conversation, "path": "salary.txt"},
            headers=ADMIN,
        )
    assert summary(seen) == f"seen: {write('alice: 100')}"
    assert plan.status_code == 200
    assert content.status_code == 200, content.text
    assert content.json()["content"] == "alice: 100", "alice's file is intact"


async def test_two_users_racing_for_a_new_id_on_two_replicas_get_one_owner(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    async with httpx2.AsyncClient(timeout=30) as client:
        for _ in range(5):
            conversation = f"race-{uuid.uuid4().hex[:8]}"
            answers = await asyncio.gather(
                call(
                    client,
                    "POST",
                    a.url + PATH,
                    json={"message": "history?", "conversationId": conversation},
                    headers=ALICE,
                ),
                call(
                    client,
                    "POST",
                    b.url + PATH,
                    json={"message": "history?", "conversationId": conversation},
                    headers=BOB,
                ),
            )
            assert sorted(answer.status_code for answer in answers) == [200, 404], conversation
