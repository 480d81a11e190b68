"""The conversation list of every ownership store agrees: in memory, SQLite, PostgreSQL and
Redis, a user's conversations page newest first (equal times by id, descending) with no entry
lost or repeated across pages, a stranger's claim neither takes nor moves a conversation, the
title is the first claim's, and `forget` drops a conversation from its owner's list.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from unittest import mock

import pytest

from atmosphere_harness._backends import SqliteConversationOwners
from atmosphere_harness._backends.postgres.owners import PostgresConversationOwners
from atmosphere_harness._backends.redis.connection import RedisConnection
from atmosphere_harness._backends.redis.owners import RedisConversationOwners
from atmosphere_harness._contracts import ConversationOwners
from atmosphere_harness._kernel.owners import InMemoryConversationOwners

from .postgres_service import opened_database

pytestmark = pytest.mark.services


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis"])
async def owners(
    request: pytest.FixtureRequest, tmp_path: Path, connection: RedisConnection
) -> AsyncIterator[ConversationOwners]:
    if request.param == "memory":
        yield InMemoryConversationOwners()
    elif request.param == "sqlite":
        store = SqliteConversationOwners.under(tmp_path)
        await store.open()
        try:
            yield store
        finally:
            await store.aclose()
    elif request.param == "postgres":
        async with opened_database() as database:
            yield PostgresConversationOwners(database)
    else:
        yield RedisConversationOwners(connection)


async def test_pages_newest_first_and_forget_drops_from_the_list(
    owners: ConversationOwners,
) -> None:
    clock = iter(float(t) for t in range(1000, 2000))
    with mock.patch("time.time", side_effect=lambda: next(clock)):
        for name in ("a", "b", "c", "d", "e"):
            assert await owners.claim("/p", name, "alice", f"title {name}") == "alice"
        assert await owners.claim("/p", "b", "bob", "bob's") == "alice", "never taken"
        assert await owners.claim("/p", "a", "alice", "later words") == "alice"  # a moves up
        assert await owners.claim("/p", "z", "bob", "bob's own") == "bob"
        assert await owners.claim("/other", "q", "alice") == "alice"
    seen = []
    after = None
    while page := await owners.page("/p", "alice", 2, after):
        seen.append([(row.conversation_id, row.title) for row in page])
        after = (page[-1].updated_at, page[-1].conversation_id)
    assert seen == [
        [("a", "title a"), ("e", "title e")],
        [("d", "title d"), ("c", "title c")],
        [("b", "title b")],
    ]
    await owners.forget("/p", "d")
    assert [row.conversation_id for row in await owners.page("/p", "alice", 10)] == [
        "a",
        "e",
        "c",
        "b",
    ]
    assert [row.conversation_id for row in await owners.page("/p", "bob", 10)] == ["z"]
    assert await owners.owner("/p", "d") is None


async def test_equal_times_page_by_id_descending(owners: ConversationOwners) -> None:
    with mock.patch("time.time", return_value=1234.5):
        for n in range(7):
            await owners.claim("/p", f"c{n}", "alice")
    seen = []
    after = None
    while page := await owners.page("/p", "alice", 3, after):
        seen += [row.conversation_id for row in page]
        after = (page[-1].updated_at, page[-1].conversation_id)
    assert seen == [f"c{n}" for n in reversed(range(7))]


async def test_derived_conversations_are_found_by_their_parent_and_never_expire_alone(
    owners: ConversationOwners,
) -> None:
    with mock.patch("time.time", return_value=1000.0):
        assert await owners.claim("/lead", "top", "alice", "the task") == "alice"
        assert await owners.claim("/member", "m1", "alice", "x", ("/lead", "top")) == "alice"
        assert await owners.claim("/member", "m2", "alice", "y", ("/lead", "top")) == "alice"
        assert await owners.claim("/deep", "d1", "alice", "", ("/member", "m1")) == "alice"
        assert await owners.claim("/lead", "other", "alice") == "alice"
        # A stranger's claim records nothing; a parent, once recorded, stays.
        assert await owners.claim("/member", "m3", "bob", "", ("/lead", "other")) == "bob"
        assert await owners.claim("/member", "m3", "alice", "", ("/lead", "top")) == "bob"
    with mock.patch("time.time", return_value=1001.0):
        assert await owners.claim("/member", "m1", "alice") == "alice"
        assert await owners.claim("/member", "m1", "alice", "", ("/lead", "other")) == "alice"
    assert await owners.children("/lead", "top") == [("/member", "m1"), ("/member", "m2")]
    assert await owners.children("/member", "m1") == [("/deep", "d1")]
    assert await owners.children("/lead", "other") == [("/member", "m3")]
    assert await owners.children("/member", "m2") == []
    expired = await owners.expired(2000.0, 10, 60.0)
    assert sorted((row.path, row.conversation_id) for row in expired) == [
        ("/lead", "other"),
        ("/lead", "top"),
    ], "a derived conversation goes with its parent, never alone"
    assert await owners.forget("/member", "m2")
    assert await owners.children("/lead", "top") == [("/member", "m1")]
    assert [row.conversation_id for row in await owners.page("/member", "alice", 10)] == ["m1"]
