"""A run's turn rides on its conversation lock's release, with the run's end (PostgreSQL).

Where the PostgreSQL lock stored the run's status in the statement that took it,
`ConversationMemory` hands the turn to the lock (`contracts.LockedStatus.hand`), and the release
stores the turn and the run's end in one statement on a pooled connection (`locks.APPEND_END`,
committed with the turn's WAL flush), tells the run, and only then frees the advisory lock on the
lock connection, without the run waiting for it. Whatever fails, the turn is stored before the
lock is freed (alone if that statement failed; sent again with its write key after a lost
acknowledgement: stored once), and the run learns a turn that could not be stored (`written`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx2
import pytest

from atmosphere_harness._backends.postgres import PostgresDatabase
from atmosphere_harness._backends.postgres.control import (
    UPSERT,
    PostgresRunRegistry,
    run_values,
)
from atmosphere_harness._backends.postgres.history import PostgresHistory
from atmosphere_harness._backends.postgres.locks import (
    APPEND_END,
    PostgresConversationLocks,
    lock_key,
)
from atmosphere_harness._contracts import LockedStatus
from atmosphere_harness._memory import codec
from atmosphere_harness._memory.conversation import ConversationMemory
from atmosphere_harness._memory.history import ConversationKey
from atmosphere_harness._runtimes.base import Message
from tests.reliability.server import ServerProcess

from .postgres_service import create_database, drop_database
from .replicas import prompt, summary
from .tcp_proxy import LossyProxy
from .test_locked_end import record
from .test_locked_turn import Run
from .wire import WireCounter

pytestmark = pytest.mark.services

PATH = "/p"
UNLOCK = "pg_advisory_unlock"
"""What the lock's release statement holds (and no other statement of a turn)."""


@dataclass
class Replica:
    database: PostgresDatabase
    locks: PostgresConversationLocks
    registry: PostgresRunRegistry
    history: PostgresHistory
    memory: ConversationMemory
    direct: Any
    """A connection of the test's own, straight to the server (not through any proxy)."""

    async def free(self, conversation: str) -> bool:
        """Whether another replica could take the conversation's lock at once."""
        key = lock_key(PATH, conversation)
        got = bool(await self.direct.fetchval("SELECT pg_try_advisory_lock($1)", key))
        if got:
            await self.direct.fetchval("SELECT pg_advisory_unlock($1)", key)
        return got

    async def releases_done(self) -> None:
        await asyncio.gather(*self.locks._releasing.values(), return_exceptions=True)

    async def stored_texts(self, conversation: str) -> list[str]:
        rows = await self.direct.fetch(
            "SELECT m.payload FROM atmosphere_messages AS m "
            "JOIN atmosphere_conversations AS c ON c.id = m.conversation "
            "WHERE c.conversation_id = $1 ORDER BY m.seq",
            conversation,
        )
        return [codec.decode_plain(bytes(row["payload"])).content for row in rows]

    async def status_of(self, run_id: str) -> str | None:
        status: str | None = await self.direct.fetchval(
            "SELECT status FROM atmosphere_run_control WHERE run_id = $1", run_id
        )
        return status


@pytest.fixture
async def url() -> AsyncIterator[str]:
    made = await asyncio.to_thread(create_database)
    try:
        yield made
    finally:
        await asyncio.to_thread(drop_database, made)


async def open_replica(url: str, through: str) -> Replica:
    """A replica's stores on `through` (a proxy's URL, or `url`), and a direct connection."""
    database = PostgresDatabase(through)
    await database.open()
    history = PostgresHistory(database)
    return Replica(
        database,
        PostgresConversationLocks(database),
        PostgresRunRegistry(database),
        history,
        ConversationMemory(history, endpoint=PATH),
        await asyncpg.connect(url),
    )


async def close_replica(replica: Replica) -> None:
    await replica.locks.aclose()
    await replica.database.aclose()
    await replica.direct.close()


def turn(text: str) -> list[Message]:
    return [Message.user(text), Message.assistant(f"answer to {text}")]


async def a_turn(
    replica: Replica, conversation: str, text: str, *, inside: Any = None, durable: bool = False
) -> tuple[str, LockedStatus]:
    """A run that takes the conversation's lock with its read and status offered (as the
    kernel does), loads, appends `text`'s turn through the memory and leaves the block;
    `inside()` runs in the block after the append."""
    run = Run(conversation)
    run_id = uuid.uuid4().hex
    read = replica.memory.locked_read(run)  # type: ignore[arg-type]
    assert read is not None
    status = read.status = LockedStatus(replica.registry, lambda s: record(run_id, conversation, s))
    status.keeps_writes = durable
    async with replica.locks.hold(PATH, conversation, read):
        assert status.stored == "running"
        carried = (status.carries_end, status.carries_write)
        await replica.memory.load(run)  # type: ignore[arg-type]
        await replica.memory.append(run, turn(text))  # type: ignore[arg-type]
        if inside is not None:
            await inside()
    assert carried == (True, True)
    assert not status.carries_write  # (a turn written after the block is its writer's)
    return run_id, status


def conversation_id() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


async def test_the_turn_and_the_end_are_one_statement_and_the_unlock_follows(url: str) -> None:
    async with WireCounter("127.0.0.1", 5432) as proxy:
        replica = await open_replica(url, url.replace(":5432/", f":{proxy.port}/"))
        try:
            conversation = conversation_id()
            run_id, status = await a_turn(replica, conversation, "one")
            assert status.handed
            # Handed, not stored: the release waits for the run's end, the lock stays taken.
            assert await replica.stored_texts(conversation) == []
            assert not await replica.free(conversation)
            proxy.reset()
            assert await status.end(record(run_id, conversation, "completed"))
            assert await status.written() is None
            await replica.releases_done()
            sent = [burst for burst in proxy.bursts() if burst.label != "SELECT 1"]
            assert await replica.stored_texts(conversation) == ["one", "answer to one"]
            assert await replica.status_of(run_id) == "completed"
            assert await replica.free(conversation)
            # The turn and the end: one round trip, on a pooled connection; then the unlock,
            # on the lock connection, once the turn is stored.
            assert len(sent) == 2, [burst.label for burst in sent]
            stored, unlocked = sent
            assert "INSERT INTO atmosphere_messages" in stored.label
            assert "INSERT INTO atmosphere_run_control" in stored.label
            assert UNLOCK not in stored.label
            assert UNLOCK in unlocked.label
            assert stored.connection != unlocked.connection
            assert stored.answered is not None
            assert stored.answered <= unlocked.sent
            # The next turn reads it under the lock, and appends after it.
            run_id, status = await a_turn(replica, conversation, "two")
            assert await status.end(record(run_id, conversation, "completed"))
            assert await replica.stored_texts(conversation) == [
                *["one", "answer to one"],
                *["two", "answer to two"],
            ]
        finally:
            await close_replica(replica)


async def test_the_run_s_end_does_not_wait_for_the_unlock(url: str) -> None:
    """The unlock is held back on its way to the server: the run's end is stored and the run
    told so all the same (its last frame goes); the conversation is freed once the unlock
    arrives."""
    async with WireCounter("127.0.0.1", 5432) as proxy:
        replica = await open_replica(url, url.replace(":5432/", f":{proxy.port}/"))
        try:
            conversation = conversation_id()
            run_id, status = await a_turn(replica, conversation, "one")
            gate = proxy.hold(UNLOCK)
            async with asyncio.timeout(20):  # (hang guard: the code before waited here)
                assert await status.end(record(run_id, conversation, "completed"))
                assert await status.written() is None
                while proxy.holding == 0:
                    await asyncio.sleep(0.01)
            assert await replica.stored_texts(conversation) == ["one", "answer to one"]
            assert await replica.status_of(run_id) == "completed"
            assert not await replica.free(conversation)  # (the unlock has not arrived)
            gate.set()
            await replica.releases_done()
            assert await replica.free(conversation)
        finally:
            await close_replica(replica)


async def test_a_lost_reply_to_the_turn_and_the_end_stores_the_turn_once(url: str) -> None:
    """The statement committed (turn and end) but its answer never came back: sent again on a
    fresh connection, its write key skips the turn, the end is stored again as it was."""
    proxy = await LossyProxy("127.0.0.1", 5432).start()
    replica = await open_replica(url, proxy.url(url))
    try:
        conversation = conversation_id()
        run_id, status = await a_turn(replica, conversation, "warm-up")
        assert await status.end(record(run_id, conversation, "completed"))
        lost = f"lost-{uuid.uuid4().hex[:8]}"
        proxy.lose_reply_to(lost.encode())
        run_id, status = await a_turn(replica, conversation, lost)
        assert await status.end(record(run_id, conversation, "completed"))
        assert proxy.cuts == 1
        assert await status.written() is None
        assert await replica.stored_texts(conversation) == [
            *["warm-up", "answer to warm-up"],
            *[lost, f"answer to {lost}"],
        ]
        assert await replica.status_of(run_id) == "completed"
        await replica.releases_done()
        assert await replica.free(conversation)
    finally:
        await close_replica(replica)
        await proxy.aclose()


async def test_a_turn_whose_statement_with_the_end_fails_is_stored_alone(url: str) -> None:
    """The run's end cannot be stored (a constraint refuses it): the turn is stored on its own
    before the lock is freed, and the run's ticket is left to store the end (`False`)."""
    replica = await open_replica(url, url)
    try:
        conversation = conversation_id()
        await replica.direct.execute(
            "ALTER TABLE atmosphere_run_control ADD CONSTRAINT refuse_completed "
            "CHECK (status <> 'completed') NOT VALID"
        )
        run_id, status = await a_turn(replica, conversation, "alone")
        assert not await status.end(record(run_id, conversation, "completed"))
        assert await status.written() is None
        assert await replica.stored_texts(conversation) == ["alone", "answer to alone"]
        assert await replica.status_of(run_id) == "running"
        await replica.releases_done()
        assert await replica.free(conversation)
    finally:
        await close_replica(replica)


async def test_a_turn_that_cannot_be_stored_fails_the_run_and_the_lock_is_freed(
    url: str,
) -> None:
    replica = await open_replica(url, url)
    try:
        conversation = conversation_id()
        await replica.direct.execute(
            "ALTER TABLE atmosphere_messages ADD CONSTRAINT refuse_all "
            "CHECK (octet_length(payload) < 0) NOT VALID"
        )
        run_id, status = await a_turn(replica, conversation, "refused")
        assert not await status.end(record(run_id, conversation, "completed"))
        failure = await status.written()
        assert isinstance(failure, asyncpg.CheckViolationError)
        assert await replica.stored_texts(conversation) == []
        assert await replica.status_of(run_id) == "running"  # (the run's ticket stores `failed`)
        await replica.releases_done()
        assert await replica.free(conversation)
    finally:
        await close_replica(replica)


async def test_a_lost_lock_connection_still_stores_the_turn_and_the_end(url: str) -> None:
    """The lock connection died while the run went on (PostgreSQL dropped the lock): the
    release stores the turn and the end on a pooled connection all the same, and has nothing
    left to unlock."""
    replica = await open_replica(url, url)
    try:
        conversation = conversation_id()

        async def kill_lock_connection() -> None:
            pid = replica.locks._connection.get_server_pid()
            assert await replica.direct.fetchval("SELECT pg_terminate_backend($1)", pid)

        run_id, status = await a_turn(replica, conversation, "late", inside=kill_lock_connection)
        assert await status.end(record(run_id, conversation, "completed"))
        assert await status.written() is None
        assert await replica.stored_texts(conversation) == ["late", "answer to late"]
        assert await replica.status_of(run_id) == "completed"
        await replica.releases_done()
        assert await replica.free(conversation)
    finally:
        await close_replica(replica)


async def test_a_durable_run_stores_its_turn_itself_and_its_end_rides_on_the_release(
    url: str,
) -> None:
    replica = await open_replica(url, url)
    try:
        conversation = conversation_id()

        async def stored_already() -> None:
            assert await replica.stored_texts(conversation) == ["kept", "answer to kept"]

        run_id, status = await a_turn(
            replica, conversation, "kept", inside=stored_already, durable=True
        )
        assert not status.handed
        assert await status.end(record(run_id, conversation, "completed"))
        assert await replica.status_of(run_id) == "completed"
        await replica.releases_done()
        assert await replica.free(conversation)
    finally:
        await close_replica(replica)


async def test_the_turn_s_statement_keeps_the_turn_s_wal_flush(url: str) -> None:
    """The run's status is committed without waiting for the WAL flush when it is alone
    (`control.UPSERT`), never when it rides with a turn: the turn's commit keeps the server's
    `synchronous_commit`."""
    connection = await asyncpg.connect(url)
    try:
        await PostgresDatabase(url).open()  # (the schema)
        await connection.execute("SET synchronous_commit = on")
        run_id, conversation = uuid.uuid4().hex, conversation_id()
        end = run_values(record(run_id, conversation, "completed"))
        history = PostgresHistory(None)  # type: ignore[arg-type]
        made = history.turn(ConversationKey(PATH, None, conversation), turn("flushed"))
        settings = []
        for statement, args in ((UPSERT, end), (APPEND_END, (*made, *end))):
            async with connection.transaction():
                await connection.execute(statement, *args)
                settings.append(await connection.fetchval("SHOW synchronous_commit"))
        assert settings == ["off", "on"]
    finally:
        await connection.close()


async def test_a_server_s_complete_frame_does_not_wait_for_the_unlock(
    url: str, tmp_path: Path
) -> None:
    """On a real server whose lock releases are held back on their way to PostgreSQL: the
    turn's `complete` frame comes with the run's end stored (the code before waited for the
    unlock to store it, and sent the frame without it after `SETTLE_SECONDS`), and the next
    prompt, once the unlock went, sees the turn."""
    async with WireCounter("127.0.0.1", 5432) as proxy:
        env = {
            "ATMOSPHERE_POSTGRES_URL": url.replace(":5432/", f":{proxy.port}/"),
            "ATMOSPHERE_DURABLE_RUNS_ENABLED": "false",
        }
        workspace = tmp_path / "workspace"
        workspace.mkdir()
        server = ServerProcess("postgres", workspace, tmp_path / "server.log", env)
        await asyncio.to_thread(server.start)
        conversation = conversation_id()
        try:
            async with httpx2.AsyncClient(timeout=30) as client:
                gate = proxy.hold(UNLOCK)
                async with asyncio.timeout(20):  # (hang guard: the code before waited here)
                    frames = await prompt(client, server.url, "first", conversation)
                    while proxy.holding == 0:
                        await asyncio.sleep(0.01)
                assert frames[-1]["event"] == "complete", frames[-1]
                direct = await asyncpg.connect(url)
                try:
                    ended = await direct.fetchval(
                        "SELECT status FROM atmosphere_run_control WHERE conversation_id = $1",
                        conversation,
                    )
                finally:
                    await direct.close()
                assert ended == "completed"
                assert proxy.holding == 1  # (the unlock still waits)
                gate.set()
                frames = await prompt(client, server.url, "history?", conversation)
                assert summary(frames) == "seen: first"
        finally:
            server.kill()
