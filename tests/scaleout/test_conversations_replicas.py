"""A user's conversations and their history across two real uvicorn replicas, on PostgreSQL
and on Redis alone: conversations prompted on replica A are listed, newest first, and their
history paged, on replica B; another user sees neither.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.reliability.server import ServerProcess

from .postgres_service import create_database, drop_database
from .redis_service import delete_prefix, new_prefix, require_redis
from .redis_service import url_for as redis_url_for
from .replicas import PATH, prompt, two_replicas

pytestmark = pytest.mark.services

KIND = "postgres-files"


@pytest.fixture(scope="module", params=["postgres", "redis"])
def servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess, str]]:
    """Both replicas on one shared state backend, and that backend's URL."""
    base = tmp_path_factory.mktemp("conversations")
    workspace = base / "workspace"
    workspace.mkdir()
    if request.param == "postgres":
        url = create_database()
        try:
            with two_replicas(KIND, workspace, base, {"ATMOSPHERE_POSTGRES_URL": url}) as pair:
                yield (*pair, url)
        finally:
            drop_database(url)
        return
    require_redis()
    prefix = new_prefix()
    try:
        url = redis_url_for(prefix)
        with two_replicas(KIND, workspace, base, {"ATMOSPHERE_REDIS_URL": url}) as pair:
            yield (*pair, prefix)
    finally:
        delete_prefix(prefix)


def user() -> dict[str, str]:
    """A user of this test alone (the module's replicas are shared by its tests)."""
    return {"X-User-Id": f"user-{uuid.uuid4().hex[:8]}"}


def write(content: str) -> str:
    return "call: write_file " + json.dumps({"path": "salary.txt", "content": content})


async def listed(client: httpx2.AsyncClient, base: str, who: Any, limit: int) -> list[Any]:
    rows: list[Any] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        page = await client.get(base + PATH + "/conversations", params=params, headers=who)
        assert page.status_code == 200, page.text
        rows += page.json()["conversations"]
        cursor = page.json()["nextCursor"]
        if cursor is None:
            return rows


async def test_conversations_prompted_on_a_are_listed_and_read_on_b(
    servers: tuple[ServerProcess, ServerProcess, str],
) -> None:
    a, b, _store = servers
    alice, bob = user(), user()
    async with httpx2.AsyncClient(timeout=30) as client:
        for name in ("one", "two", "three"):
            await prompt(
                client, a.url, f"history? {name}", name + alice["X-User-Id"], headers=alice
            )
        await prompt(client, a.url, write("100"), "one" + alice["X-User-Id"], headers=alice)
        await prompt(client, a.url, "history?", "bobs" + bob["X-User-Id"], headers=bob)
        rows = await listed(client, b.url, alice, 2)
        history = await client.get(
            f"{b.url}{PATH}/conversations/one{alice['X-User-Id']}/messages", headers=alice
        )
        stranger = await client.get(
            f"{b.url}{PATH}/conversations/one{alice['X-User-Id']}/messages", headers=bob
        )
        bobs = await listed(client, b.url, bob, 20)
    suffix = alice["X-User-Id"]
    assert [row["conversationId"] for row in rows] == [
        f"one{suffix}",
        f"three{suffix}",
        f"two{suffix}",
    ]
    assert [row["title"] for row in rows] == ["history? one", "history? three", "history? two"]
    assert [row["conversationId"] for row in bobs] == ["bobs" + bob["X-User-Id"]]
    assert stranger.status_code == 404
    assert history.status_code == 200, history.text
    messages = history.json()["messages"]
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert messages[3]["toolCalls"][0]["name"] == "write_file"
    assert messages[4]["toolCallId"] == messages[3]["toolCalls"][0]["id"]
    assert history.json()["nextCursor"] is None
