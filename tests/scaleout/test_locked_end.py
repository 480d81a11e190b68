"""A run's end rides on its conversation lock's release (`contracts.LockedStatus.end`).

Where the lock stored the run's status in the round trip that took it, its release waits for
the run's final record and stores it: with the unlock in one script on Redis (once `end`
returned `True`, the conversation is free for any replica), in a statement of its own on a
pooled connection on PostgreSQL, the unlock following without the run waiting for it. A run
that ends elsewhere (`no_end`: a durable run suspended to resume) frees the lock without an
end, and an end that comes after the release went is refused (`False`: the run's ticket stores
it itself).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from atmosphere_harness._contracts import LockedStatus, LockedWrite, RunRecord
from atmosphere_harness._memory.history import ConversationKey, HistoryRead

from .postgres_service import create_database, drop_database

pytestmark = pytest.mark.services

PATH = "/p"


@dataclass
class Backend:
    name: str
    locks: Any
    registry: Any
    history: Any
    free: Any
    """`await free(conversation)`: whether another replica could take the lock at once."""


def record(run_id: str, conversation: str, status: str) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        path=PATH,
        conversation_id=conversation,
        user_id=None,
        status=status,
        usage={"inputTokens": 3} if status == "completed" else None,
        owner="this-replica",
        lease_until=time.time() + 15 if status == "running" else 0.0,
        started_at=time.time(),
    )


@pytest.fixture(params=["postgres", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "postgres":
        import asyncpg

        from atmosphere_harness._backends.postgres import PostgresDatabase
        from atmosphere_harness._backends.postgres.control import PostgresRunRegistry
        from atmosphere_harness._backends.postgres.history import PostgresHistory
        from atmosphere_harness._backends.postgres.locks import PostgresConversationLocks, lock_key

        url = await asyncio.to_thread(create_database)
        database = PostgresDatabase(url)
        await database.open()
        other = await asyncpg.connect(url)

        async def pg_free(conversation: str) -> bool:
            key = lock_key(PATH, conversation)
            got = bool(await other.fetchval("SELECT pg_try_advisory_lock($1)", key))
            if got:
                await other.fetchval("SELECT pg_advisory_unlock($1)", key)
            return got

        locks = PostgresConversationLocks(database)
        try:
            yield Backend(
                "postgres", locks, PostgresRunRegistry(database), PostgresHistory(database), pg_free
            )
        finally:
            await locks.aclose()
            await other.close()
            await database.aclose()
            await asyncio.to_thread(drop_database, url)
        return
    from atmosphere_harness._backends.redis import RedisConnection
    from atmosphere_harness._backends.redis.control import RedisRunRegistry
    from atmosphere_harness._backends.redis.history import RedisHistory
    from atmosphere_harness._backends.redis.locks import RedisConversationLocks
    from atmosphere_harness._backends.redis.locks import lock_key as redis_lock_key

    from .redis_service import delete_prefix, new_prefix, require_redis, url_for

    require_redis()
    prefix = new_prefix()
    connection = RedisConnection(url_for(prefix))
    await connection.open()

    async def redis_free(conversation: str) -> bool:
        key = redis_lock_key(connection, PATH, conversation)
        return not await connection.client.exists(key)

    try:
        yield Backend(
            "redis",
            RedisConversationLocks(connection),
            RedisRunRegistry(connection),
            RedisHistory(connection),
            redis_free,
        )
    finally:
        await connection.aclose()
        await asyncio.to_thread(delete_prefix, prefix)


async def held_once(backend: Backend) -> tuple[str, str, LockedStatus]:
    """A run that took its conversation's lock with its status offered, and left the block."""
    conversation, run_id = f"c-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    status = LockedStatus(backend.registry, lambda s: record(run_id, conversation, s))
    read = HistoryRead(backend.history, ConversationKey(PATH, None, conversation), 0, 20)
    read.status = status
    async with backend.locks.hold(PATH, conversation, read):
        assert status.stored == "running"
        assert status.carries_end
        assert not await backend.free(conversation)
    return conversation, run_id, status


async def releases_done(backend: Backend) -> None:
    await asyncio.gather(*backend.locks._releasing.values(), return_exceptions=True)


async def test_the_run_s_end_is_stored_by_the_release_that_frees_the_conversation(
    backend: Backend,
) -> None:
    conversation, run_id, status = await held_once(backend)
    # The block is over, but the release waits for the end: the conversation stays taken.
    assert not await backend.free(conversation)
    assert await status.end(record(run_id, conversation, "completed"))
    # Once `end` said so, the end is stored; the lock is free (on PostgreSQL, once the
    # release's unlock, which the run does not wait for, went).
    stored = await backend.registry.get(run_id)
    assert stored is not None
    assert (stored.status, stored.usage) == ("completed", {"inputTokens": 3})
    if backend.name == "postgres":
        await releases_done(backend)
    assert await backend.free(conversation)


async def test_a_run_that_ends_elsewhere_frees_the_lock_without_an_end(backend: Backend) -> None:
    conversation, run_id, status = await held_once(backend)
    status.no_end()
    await releases_done(backend)
    assert await backend.free(conversation)
    stored = await backend.registry.get(run_id)
    assert stored is not None
    assert stored.status == "running"
    assert not await status.end(record(run_id, conversation, "completed"))


async def test_an_end_after_the_release_gave_up_waiting_is_refused(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(LockedStatus, "END_WAIT_SECONDS", 0.0)
    conversation, run_id, status = await held_once(backend)
    await releases_done(backend)
    assert await backend.free(conversation)
    # Refused: the run's ticket stores its end itself (`RunTicket._write`).
    assert not await status.end(record(run_id, conversation, "completed"))
    stored = await backend.registry.get(run_id)
    assert stored is not None
    assert stored.status == "running"


class _Turn(LockedWrite):
    """A handed write that records whether anything stored it."""

    def __init__(self) -> None:
        self.stored = False

    async def store(self) -> None:
        self.stored = True


async def test_a_release_stopped_before_it_ran_fails_the_handed_turn_at_once(
    backend: Backend,
) -> None:
    # A server shutting down cancels the releases it has not run: the run waiting for its
    # handed turn must learn at once that it was not stored, and store its end itself.
    conversation, run_id = f"c-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    status = LockedStatus(backend.registry, lambda s: record(run_id, conversation, s))
    read = HistoryRead(backend.history, ConversationKey(PATH, None, conversation), 0, 20)
    read.status = status
    turn = _Turn()
    async with backend.locks.hold(PATH, conversation, read):
        assert status.hand(turn)
    (release,) = backend.locks._releasing.values()
    release.cancel()
    await asyncio.gather(release, return_exceptions=True)
    failure = await asyncio.wait_for(status.written(), 5)
    assert isinstance(failure, RuntimeError)
    assert "not stored" in str(failure)
    assert not turn.stored
    assert not await status.end(record(run_id, conversation, "completed"))
