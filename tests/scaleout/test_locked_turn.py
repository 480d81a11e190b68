"""A run's turn rides on its conversation lock's release, with the run's end (Redis).

Where the Redis lock stored the run's status in the script that took it, `ConversationMemory`
hands the turn to the lock (`contracts.LockedStatus.hand`) instead of storing it, and the
release stores the turn, the run's end and the unlock in one script (`_APPEND_RELEASE_RUN`):
one round trip a turn fewer. Whatever fails, the turn is stored before the lock is freed (alone,
sent again with its write key, if the script's reply was lost: stored once), the run learns a
turn that could not be stored (`written`), and the lock is never left held.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from atmosphere_harness._backends.redis import RedisConnection
from atmosphere_harness._backends.redis.control import RedisRunRegistry
from atmosphere_harness._backends.redis.history import RedisHistory
from atmosphere_harness._backends.redis.locks import RedisConversationLocks, lock_key
from atmosphere_harness._contracts import LockedStatus, TypedMap
from atmosphere_harness._memory.conversation import ConversationMemory
from atmosphere_harness._memory.history import ConversationKey, HistoryWrite
from atmosphere_harness._runtimes.base import Message
from tests.reliability.server import ServerProcess

from .redis_service import delete_prefix, new_prefix, require_redis, url_for
from .tcp_proxy import LossyProxy
from .test_locked_end import record

pytestmark = pytest.mark.services

PATH = "/p"


@dataclass
class Run:
    """What `ConversationMemory` reads of a run: its conversation, user and state."""

    conversation_id: str
    user_id: str | None = None
    state: TypedMap = field(default_factory=TypedMap)


@dataclass
class Replica:
    connection: RedisConnection
    locks: RedisConversationLocks
    registry: RedisRunRegistry
    history: RedisHistory
    memory: ConversationMemory

    async def free(self, conversation: str) -> bool:
        return not await self.connection.client.exists(
            lock_key(self.connection, PATH, conversation)
        )

    async def releases_done(self) -> None:
        await asyncio.gather(*self.locks._releasing.values(), return_exceptions=True)


async def open_replica(url: str) -> Replica:
    connection = RedisConnection(url)
    await connection.open()
    history = RedisHistory(connection)
    return Replica(
        connection,
        RedisConversationLocks(connection),
        RedisRunRegistry(connection),
        history,
        ConversationMemory(history, endpoint=PATH),
    )


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    require_redis()
    made = new_prefix()
    try:
        yield made
    finally:
        await asyncio.to_thread(delete_prefix, made)


@pytest.fixture
async def replica(prefix: str) -> AsyncIterator[Replica]:
    opened = await open_replica(url_for(prefix))
    try:
        yield opened
    finally:
        await opened.connection.aclose()


def turn(text: str) -> list[Message]:
    return [Message.user(text), Message.assistant(f"answer to {text}")]


async def a_turn(
    replica: Replica, conversation: str, text: str, *, inside: Any = None
) -> tuple[str, LockedStatus]:
    """A run that takes the conversation's lock with its read and status offered (as the
    kernel does), loads, appends `text`'s turn through the memory and leaves the block;
    `inside(run)` runs in the block after the append."""
    run = Run(conversation)
    run_id = uuid.uuid4().hex
    read = replica.memory.locked_read(run)  # type: ignore[arg-type]
    assert read is not None
    status = read.status = LockedStatus(replica.registry, lambda s: record(run_id, conversation, s))
    async with replica.locks.hold(PATH, conversation, read):
        assert status.carries_end
        assert status.carries_write
        await replica.memory.load(run)  # type: ignore[arg-type]
        await replica.memory.append(run, turn(text))  # type: ignore[arg-type]
        if inside is not None:
            await inside(run)
    assert not status.carries_write  # (a turn written after the block is its writer's)
    return run_id, status


async def stored_texts(replica: Replica, conversation: str) -> list[str]:
    messages = await replica.history.messages(ConversationKey(PATH, None, conversation))
    return [message.content for message in messages]


async def test_the_turn_the_end_and_the_unlock_are_one_script(replica: Replica) -> None:
    conversation = f"c-{uuid.uuid4().hex[:8]}"
    run_id, status = await a_turn(replica, conversation, "one")
    assert status.handed
    # Handed, not stored: the release waits for the run's end, the conversation stays taken.
    assert await stored_texts(replica, conversation) == []
    assert not await replica.free(conversation)
    assert await status.end(record(run_id, conversation, "completed"))
    assert await status.written() is None
    assert await stored_texts(replica, conversation) == ["one", "answer to one"]
    stored = await replica.registry.get(run_id)
    assert stored is not None
    assert stored.status == "completed"
    assert await replica.free(conversation)
    # The next turn reads it under the lock, and appends after it.
    run_id, status = await a_turn(replica, conversation, "two")
    assert await status.end(record(run_id, conversation, "completed"))
    assert await stored_texts(replica, conversation) == [
        *["one", "answer to one"],
        *["two", "answer to two"],
    ]


async def test_a_lost_reply_to_the_release_stores_the_turn_once(prefix: str) -> None:
    """The script ran (turn, end, unlock) but its reply never came back: the release stores
    the turn on its own with the same write key (stored once), the run's end is left to the
    run's ticket (`False`), and the lock is free."""
    from atmosphere_harness._backends.redis.locks import _APPEND_RELEASE_RUN

    sha = hashlib.sha1(_APPEND_RELEASE_RUN.encode()).hexdigest().encode()  # (its EVALSHA)
    proxy = await LossyProxy("127.0.0.1", 6379).start()
    replica = await open_replica(url_for(prefix, port=proxy.port))
    try:
        conversation = f"c-{uuid.uuid4().hex[:8]}"
        run_id, status = await a_turn(replica, conversation, "warm-up")  # (loads the script)
        assert await status.end(record(run_id, conversation, "completed"))
        proxy.lose_reply_to(sha)
        run_id, status = await a_turn(replica, conversation, "lost")
        assert not await status.end(record(run_id, conversation, "completed"))
        assert proxy.cuts == 1
        assert await status.written() is None
        assert await stored_texts(replica, conversation) == [
            *["warm-up", "answer to warm-up"],
            *["lost", "answer to lost"],
        ]
        await replica.releases_done()
        assert await replica.free(conversation)
    finally:
        await replica.connection.aclose()
        await proxy.aclose()


async def test_a_turn_that_cannot_be_stored_is_reported_and_the_lock_is_freed(
    replica: Replica,
) -> None:
    conversation = f"c-{uuid.uuid4().hex[:8]}"
    key = ConversationKey(PATH, None, conversation)
    run_id, status = await a_turn(replica, conversation, "first")
    assert await status.end(record(run_id, conversation, "completed"))

    async def broken(run: Run) -> None:
        # The conversation's bookkeeping is no hash any more: the turn's script fails on its
        # first read of it, before any write; the turn sent alone fails the same way.
        await replica.connection.client.set(replica.history._meta(key), "not a hash")

    run_id, status = await a_turn(replica, conversation, "second", inside=broken)
    assert not await status.end(record(run_id, conversation, "completed"))
    failure = await status.written()
    assert failure is not None
    assert "WRONGTYPE" in str(failure)
    await replica.releases_done()
    assert await replica.free(conversation)
    stored = await replica.registry.get(run_id)
    assert stored is not None
    assert stored.status == "running"


async def test_a_lock_another_replica_took_keeps_its_holder_and_the_turn_is_stored(
    replica: Replica,
) -> None:
    """The lock lapsed and another replica took it while the run went on (Redis was away
    longer than the lease): as a turn stored alone would be, the turn is stored, and the
    lock is left to its new holder."""
    conversation = f"c-{uuid.uuid4().hex[:8]}"
    lock = lock_key(replica.connection, PATH, conversation)

    async def taken_over(run: Run) -> None:
        await replica.connection.client.set(lock, "another-replica", px=15000)

    run_id, status = await a_turn(replica, conversation, "late", inside=taken_over)
    assert await status.end(record(run_id, conversation, "completed"))
    assert await stored_texts(replica, conversation) == ["late", "answer to late"]
    assert await replica.connection.client.get(lock) == "another-replica"
    stored = await replica.registry.get(run_id)
    assert stored is not None
    assert stored.status == "completed"


async def test_a_release_that_gave_up_waiting_for_the_end_stores_the_turn_first(
    replica: Replica, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(LockedStatus, "END_WAIT_SECONDS", 0.0)
    conversation = f"c-{uuid.uuid4().hex[:8]}"
    run_id, status = await a_turn(replica, conversation, "alone")
    await replica.releases_done()
    assert await status.written() is None
    assert await stored_texts(replica, conversation) == ["alone", "answer to alone"]
    assert await replica.free(conversation)
    assert not await status.end(record(run_id, conversation, "completed"))  # (the ticket's)


async def test_reading_the_conversation_in_the_run_stores_the_handed_turn_first(
    replica: Replica,
) -> None:
    """A prompt method that reads its conversation after its turn (or streams a second one)
    sees the turn: the memory takes it back from the lock and stores it; only the last turn
    rides on the release."""
    conversation = f"c-{uuid.uuid4().hex[:8]}"
    seen: list[list[str]] = []

    async def read_back(run: Run) -> None:
        messages = await replica.memory.messages(conversation)
        seen.append([message.content for message in messages])
        await replica.memory.append(run, turn("again"))  # type: ignore[arg-type]

    run_id, status = await a_turn(replica, conversation, "once", inside=read_back)
    assert seen == [["once", "answer to once"]]
    assert await status.end(record(run_id, conversation, "completed"))
    assert await status.written() is None
    assert await stored_texts(replica, conversation) == [
        *["once", "answer to once"],
        *["again", "answer to again"],
    ]


async def test_a_durable_run_or_a_run_outside_its_block_stores_its_turn_itself(
    replica: Replica,
) -> None:
    conversation = f"c-{uuid.uuid4().hex[:8]}"
    run = Run(conversation)
    run_id = uuid.uuid4().hex
    read = replica.memory.locked_read(run)  # type: ignore[arg-type]
    assert read is not None
    status = read.status = LockedStatus(replica.registry, lambda s: record(run_id, conversation, s))
    status.keeps_writes = True  # (what the kernel sets for a durable run)
    async with replica.locks.hold(PATH, conversation, read):
        await replica.memory.append(run, turn("kept"))  # type: ignore[arg-type]
        assert not status.handed
        assert await stored_texts(replica, conversation) == ["kept", "answer to kept"]
    status.keeps_writes = False
    assert not status.hand(HistoryWrite(replica.history, read.key, turn("late"), status))
    assert await status.end(record(run_id, conversation, "completed"))


async def test_the_trim_and_the_conversation_cap_hold_for_turns_the_release_stores(
    replica: Replica,
) -> None:
    bounded = RedisHistory(replica.connection, max_messages=3, max_conversations=4, min_idle=0)
    replica.history = bounded
    replica.memory = ConversationMemory(bounded, endpoint=PATH)
    for text in ("one", "two"):
        run_id, status = await a_turn(replica, "trimmed", text)
        assert await status.end(record(run_id, "trimmed", "completed"))
    assert await stored_texts(replica, "trimmed") == ["answer to one", "two", "answer to two"]
    for n in range(5):
        run_id, status = await a_turn(replica, f"many-{n}", "hello")
        assert await status.end(record(run_id, f"many-{n}", "completed"))
    kept = await replica.connection.client.zcard(bounded._all)
    assert kept <= 4
    assert await stored_texts(replica, "many-4") == ["hello", "answer to hello"]
    assert await stored_texts(replica, "trimmed") == []  # (the least recently active went)


async def start_server(tmp_path: Any, redis_url: str) -> ServerProcess:
    """A real server process of `redis_app` on `redis_url`, durable runs off."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {
        "ATMOSPHERE_REDIS_URL": redis_url,
        "ATMOSPHERE_DURABLE_RUNS_ENABLED": "false",
        "ATMOSPHERE_AI_HARNESS_ENABLED": "true",
    }
    return await asyncio.to_thread(
        ServerProcess("redis", workspace, tmp_path / "server.log", env).start
    )


async def test_a_server_s_turn_that_cannot_be_stored_ends_its_run_failed(
    prefix: str, tmp_path: Any
) -> None:
    """On a real server: the turn rides on the release and cannot be stored (the
    conversation's bookkeeping broke while the model answered), so the run ends as a failed
    write always made it end: an `error` frame naming the write, its status `failed` with that
    error, the conversation free at once for the next prompt (never held for a lease)."""
    import httpx2

    from atmosphere_harness._backends.redis.connection import digest

    from .redis_app import PATH as APP_PATH

    server = await start_server(tmp_path, url_for(prefix))
    helper = RedisConnection(url_for(prefix))
    await helper.open()
    conversation = f"c-{uuid.uuid4().hex[:8]}"
    meta = helper.key("h", digest(APP_PATH, "alice", conversation))
    headers = {"X-User-Id": "alice"}
    try:
        async with httpx2.AsyncClient(timeout=30) as client:

            async def send(message: str) -> tuple[str, list[dict[str, Any]]]:
                frames: list[dict[str, Any]] = []
                body = {"message": message, "conversationId": conversation}
                async with client.stream(
                    "POST", server.url + APP_PATH, json=body, headers=headers
                ) as response:
                    assert response.status_code == 200, await response.aread()
                    run_id = response.headers["X-Run-Id"]
                    async for line in response.aiter_lines():
                        if line.startswith("data:"):
                            frames.append(json.loads(line[5:].strip()))
                            if frames[-1]["event"] in ("complete", "error"):
                                break
                return run_id, frames

            _, frames = await send("first")
            assert frames[-1]["event"] == "complete"

            async def break_it() -> None:
                await asyncio.sleep(0.5)  # (the run has read its history and waits on the model)
                await helper.client.set(meta, "not a hash")

            breaking = asyncio.create_task(break_it())
            run_id, frames = await send("slow 1500 second")
            await breaking
            assert frames[-1]["event"] == "error", frames[-1]
            assert "WRONGTYPE" in str(frames[-1]["data"]), frames[-1]
            record = (
                await client.get(f"{server.url}{APP_PATH}/runs/{run_id}", headers=headers)
            ).json()
            assert record["status"] == "failed", record
            assert "WRONGTYPE" in str(record.get("error")), record
            await helper.client.delete(meta, meta + ":m")
            started = time.monotonic()
            _, frames = await send("third")
            assert frames[-1]["event"] == "complete", frames[-1]
            assert time.monotonic() - started < 5  # (the lock was freed, not left to lapse)
    finally:
        server.kill()
        await helper.aclose()


async def test_a_server_s_turn_whose_reply_is_lost_is_stored_once_and_completes(
    prefix: str, tmp_path: Any
) -> None:
    """On a real server behind a proxy that loses the reply to the script storing the turn
    (Redis ran it): the release sends the turn again on its own with its write key, so the
    turn is stored once and the run completes, where a lost reply to the turn's own write
    used to end the run with an error."""
    import httpx2

    from .redis_app import PATH as APP_PATH
    from .replicas import prompt, summary

    proxy = await LossyProxy("127.0.0.1", 6379).start()
    server = await start_server(tmp_path, url_for(prefix, port=proxy.port))
    conversation = f"c-{uuid.uuid4().hex[:8]}"
    lost = f"lost-{uuid.uuid4().hex[:8]}"
    try:
        async with httpx2.AsyncClient(timeout=30) as client:
            said = await prompt(client, server.url, "warm-up", conversation, path=APP_PATH)
            assert summary(said) == "seen: warm-up"
            proxy.lose_reply_to(
                json.dumps({"r": "user", "c": lost}, separators=(",", ":")).encode()
            )
            said = await prompt(client, server.url, lost, conversation, path=APP_PATH)
            assert proxy.cuts == 1
            assert summary(said) == f"seen: warm-up | {lost}"
            said = await prompt(client, server.url, "third", conversation, path=APP_PATH)
            assert summary(said) == f"seen: warm-up | {lost} | third"  # (stored once)
    finally:
        server.kill()
        await proxy.aclose()


async def test_a_server_s_run_cancelled_mid_turn_stores_its_turn_with_its_end(
    prefix: str, tmp_path: Any
) -> None:
    """A run cancelled while the model answers: its turn (the user's message, without an
    answer) rides on the release with the `cancelled` end; the next prompt sees it, at once."""
    import httpx2

    from .redis_app import PATH as APP_PATH
    from .replicas import prompt, summary

    server = await start_server(tmp_path, url_for(prefix))
    conversation = f"c-{uuid.uuid4().hex[:8]}"
    headers = {"X-User-Id": "alice"}
    try:
        async with httpx2.AsyncClient(timeout=30) as client:
            frames: list[dict[str, Any]] = []
            body = {"message": "slow 3000 stopped", "conversationId": conversation}
            async with client.stream(
                "POST", server.url + APP_PATH, json=body, headers=headers
            ) as response:
                run_id = response.headers["X-Run-Id"]
                await asyncio.sleep(0.5)
                cancel = await client.post(
                    f"{server.url}{APP_PATH}/runs/{run_id}/cancel", headers=headers
                )
                assert cancel.status_code == 202, cancel.text
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        frames.append(json.loads(line[5:].strip()))
                        if frames[-1]["event"] in ("complete", "error"):
                            break
            assert frames[-1]["data"]["type"] == "RunCancelled", frames[-1]
            answer = await client.get(f"{server.url}{APP_PATH}/runs/{run_id}", headers=headers)
            assert answer.json()["status"] == "cancelled", answer.json()
            started = time.monotonic()
            said = await prompt(client, server.url, "next", conversation, path=APP_PATH)
            assert summary(said) == "seen: slow 3000 stopped | next"
            assert time.monotonic() - started < 2.5  # (the lock was freed with the end)
    finally:
        server.kill()
