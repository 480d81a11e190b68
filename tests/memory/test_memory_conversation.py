"""ConversationMemory on both history backends: storage, isolation, compaction, stored form."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import ConversationMemory, Message, ToolCall
from atmosphere_harness._contracts import LockedReader, TypedMap
from atmosphere_harness._memory import codec, sqlite_history
from atmosphere_harness._memory.compaction import SummarizingCompaction
from atmosphere_harness._memory.history import (
    ConversationKey,
    HistoryBackend,
    HistoryRead,
    InMemoryHistory,
)
from atmosphere_harness._memory.sqlite import SqliteDatabase
from atmosphere_harness._memory.sqlite_history import SqliteHistory


class FakeRun:
    """The attributes ConversationMemory reads from a run."""

    def __init__(self, conversation_id: str, user_id: str | None = None) -> None:
        self.conversation_id = conversation_id
        self.user_id = user_id
        self.state = TypedMap()


def run(conversation_id: str, user_id: str | None = None) -> Any:
    return FakeRun(conversation_id, user_id)


async def check_payloads_decoded_once(
    a: HistoryBackend, b: HistoryBackend, key: ConversationKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For a shared history backend's replicas `a` and `b` (`codec.decode_plain`): a payload
    read again is not decoded again (by its bytes, so another replica's turn is still read,
    and decoded), except one too large to keep."""
    decoded: list[bytes] = []
    decode = codec.decode

    def counting(kind: int, payload: bytes) -> Message:
        decoded.append(payload)
        return decode(kind, payload)

    monkeypatch.setattr(codec, "decode", counting)
    tag = uuid.uuid4().hex  # (payloads no other test stored: decoded nowhere before)
    large = "x" * (codec.DECODED_MAX_BYTES + 1)
    await a.append(key, [Message.user(f"{tag} 1"), Message.assistant(large)])
    first = await a.tail(key, 10)
    assert len(decoded) == 2
    assert await a.tail(key, 10) == first
    assert len(decoded) == 3, "only the large payload is decoded again"
    await b.append(key, [Message.user(f"{tag} 2"), Message.assistant(f"{tag} 3")])
    assert [m.content for m in await a.tail(key, 10)] == [f"{tag} 1", large, f"{tag} 2", f"{tag} 3"]
    assert len(decoded) == 6, "the other replica's turn and the large payload"


@pytest.fixture(params=["memory", "sqlite"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[HistoryBackend]:
    if request.param == "memory":
        yield InMemoryHistory()
        return
    database = SqliteDatabase(tmp_path / "history.db")
    history = SqliteHistory(database)
    yield history
    await history.aclose()
    await database.aclose()


def turn(i: int) -> list[Message]:
    return [Message.user(f"q{i}"), Message.assistant(f"a{i}")]


async def test_turns_round_trip_in_order(backend: HistoryBackend) -> None:
    memory = ConversationMemory(backend, endpoint="/e")
    call = ToolCall("write_file", {"path": "a.md", "content": "é" * 2000}, id="c1")
    stored = [
        Message.user("save it"),
        Message.assistant("", [call]),
        Message.tool(call, "Wrote a.md"),
        Message.assistant("Saved."),
    ]
    await memory.append(run("c"), stored)
    assert await memory.load(run("c")) == stored
    assert await memory.messages("c") == stored


async def test_conversations_are_isolated(backend: HistoryBackend) -> None:
    memory = ConversationMemory(backend, endpoint="/e")
    await memory.append(run("one"), turn(1))
    await memory.append(run("two"), turn(2))
    assert await memory.load(run("one")) == turn(1)
    assert await memory.load(run("two")) == turn(2)
    assert await memory.load(run("three")) == []


async def test_users_and_endpoints_are_isolated(backend: HistoryBackend) -> None:
    alice = ConversationMemory(backend, endpoint="/e")
    other_endpoint = ConversationMemory(backend, endpoint="/f")
    await alice.append(run("c", "alice"), turn(1))
    assert await alice.load(run("c", "bob")) == [], "same id, other user: another conversation"
    assert await alice.load(run("c")) == [], "anonymous is another user too"
    assert await other_endpoint.load(run("c", "alice")) == []
    assert await alice.load(run("c", "alice")) == turn(1)


async def test_clear_forgets_one_conversation(backend: HistoryBackend) -> None:
    memory = ConversationMemory(backend, endpoint="/e")
    await memory.append(run("one"), turn(1))
    await memory.append(run("two"), turn(2))
    await memory.clear("one")
    assert await memory.load(run("one")) == []
    assert await memory.load(run("two")) == turn(2)


async def test_the_view_is_compacted_but_storage_keeps_everything(backend: HistoryBackend) -> None:
    memory = ConversationMemory(backend, endpoint="/e", max_messages=4)
    for i in range(10):
        await memory.append(run("c"), turn(i))
    assert await memory.load(run("c")) == [*turn(8), *turn(9)]
    assert len(await memory.messages("c")) == 20


def test_default_is_twenty_and_two_is_the_minimum() -> None:
    assert ConversationMemory().max_messages == 20
    ConversationMemory(max_messages=2)
    with pytest.raises(ValueError, match="maxMessages must be >= 2, got 1"):
        ConversationMemory(max_messages=1)


async def test_loaded_lists_are_copies(backend: HistoryBackend) -> None:
    memory = ConversationMemory(backend, endpoint="/e")
    await memory.append(run("c"), turn(1))
    view = await memory.load(run("c"))
    view.append(Message.user("mutated"))
    assert await memory.load(run("c")) == turn(1)


async def test_summaries_are_checkpointed_and_absorb_each_other(backend: HistoryBackend) -> None:
    memory = ConversationMemory(
        backend, endpoint="/e", max_messages=6, strategy=SummarizingCompaction(recent_window=2)
    )
    for i in range(12):
        await memory.append(run("c"), turn(i))
        view = await memory.load(run("c"))
        assert len(view) <= 6
        assert sum(1 for m in view if m.role == "system") <= 1
    summary, *recent = await memory.load(run("c"))
    assert summary.role == "system"
    assert summary.content.startswith("[Conversation summary of 22 earlier messages]")
    assert "user: q0" in summary.content, "the first summary was absorbed, not dropped"
    assert recent == turn(11)
    assert len(await memory.messages("c")) == 24


async def test_close_and_extraction_bookkeeping(backend: HistoryBackend) -> None:
    key = ConversationKey("/e", "alice", "c")
    assert not await backend.close(key), "unknown conversations are not closed"
    await backend.append(key, turn(1))
    assert await backend.idle(float("inf"), 10) == [key]
    assert await backend.close(key)
    assert await backend.idle(float("inf"), 10) == []
    fresh, last = await backend.unextracted(key, 100)
    assert (fresh, last) == (turn(1), 2)
    await backend.mark_extracted(key, last)
    await backend.append(key, turn(2))
    assert await backend.idle(float("inf"), 10) == [key], "a new turn re-opens it"
    assert await backend.unextracted(key, 100) == (turn(2), 4)


def test_large_payloads_pack_and_round_trip() -> None:
    call = ToolCall("write_file", {"path": "big.md", "content": "line of text\n" * 4000})
    message = Message.assistant("", [call])
    plain = codec.encode(message)
    packed = codec.pack(plain)
    assert packed is not None
    assert len(packed) < len(plain) / 10
    assert codec.decode(codec.BZ2, packed) == message
    assert codec.decode(codec.PLAIN, plain) == message
    assert codec.pack(codec.encode(Message.user("hi"))) is None, "small payloads stay plain"
    assert codec.pack(os.urandom(4096)) is None, "incompressible payloads stay plain"


async def test_sqlite_history_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    first = SqliteDatabase(path)
    history = SqliteHistory(first)
    await ConversationMemory(history, endpoint="/e").append(run("c"), turn(1))
    await history.aclose()
    await first.aclose()
    wal = tmp_path / "history.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0, "closing checkpoints the WAL"
    second = SqliteDatabase(path)
    try:
        memory = ConversationMemory(SqliteHistory(second), endpoint="/e")
        assert await memory.load(run("c")) == turn(1)
    finally:
        await second.aclose()


async def test_large_payloads_are_packed_in_the_background(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    database = SqliteDatabase(path)
    history = SqliteHistory(database)
    memory = ConversationMemory(history, endpoint="/e")
    content = "a line the model wrote into a file\n" * 2000
    call = ToolCall("write_file", {"path": "big.md", "content": content}, id="c1")
    stored = [Message.user("write"), Message.assistant("", [call]), Message.tool(call, "Wrote")]
    await memory.append(run("c"), stored)
    await history.aclose()  # finishes the packing backlog
    await database.aclose()
    connection = sqlite3.connect(path)
    try:
        rows = connection.execute(
            "SELECT codec, length(payload) FROM memory_messages ORDER BY seq"
        ).fetchall()
    finally:
        connection.close()
    assert [kind for kind, _size in rows] == [1, codec.BZ2, 1]
    assert rows[1][1] < len(content) / 20
    reopened = SqliteDatabase(path)
    try:
        assert await ConversationMemory(SqliteHistory(reopened), endpoint="/e").messages("c") == (
            stored
        )
    finally:
        await reopened.aclose()


async def test_a_second_writer_is_seen_not_served_stale(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    one, two = SqliteDatabase(path), SqliteDatabase(path)
    try:
        first = ConversationMemory(SqliteHistory(one), endpoint="/e")
        second = ConversationMemory(SqliteHistory(two), endpoint="/e")
        await first.append(run("c"), turn(1))
        assert await first.load(run("c")) == turn(1)  # now cached in `first`
        await second.append(run("c"), turn(2))
        assert await first.load(run("c")) == [*turn(1), *turn(2)]
        await second.clear("c")
        assert await first.load(run("c")) == []
        # Cleared and started again elsewhere, reaching the same length as the cached copy.
        await first.append(run("c"), turn(3))
        assert await first.load(run("c")) == turn(3)
        await second.clear("c")
        await second.append(run("c"), turn(4))
        assert await first.load(run("c")) == turn(4)
    finally:
        await one.aclose()
        await two.aclose()


async def test_a_closed_database_refuses_work(tmp_path: Path) -> None:
    database = SqliteDatabase(tmp_path / "x.db")
    await database.open()
    await database.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await database.open()


async def test_the_packer_works_in_the_pause_after_a_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_history, "PACK_AFTER_QUIET", 0.05)
    database = SqliteDatabase(tmp_path / "history.db")
    history = SqliteHistory(database)
    memory = ConversationMemory(history, endpoint="/e")
    big = Message.user("notes " * 1000)
    await memory.append(run("c"), [big, Message.assistant("ok")])

    async def codecs() -> list[int]:
        rows = await database.run(
            lambda connection: connection.execute(
                "SELECT codec FROM memory_messages ORDER BY seq"
            ).fetchall()
        )
        return [row[0] for row in rows]

    assert await codecs() == [sqlite_history.UNPACKED, sqlite_history.PLAIN_FINAL]
    for _ in range(200):
        if await codecs() == [codec.BZ2, sqlite_history.PLAIN_FINAL]:
            break
        await asyncio.sleep(0.02)
    assert await codecs() == [codec.BZ2, sqlite_history.PLAIN_FINAL]
    assert await memory.messages("c") == [big, Message.assistant("ok")]
    await history.aclose()
    await database.aclose()


# --- the first read, made by the conversation's lock ------------------------------------------


class NetworkedHistory(InMemoryHistory):
    """An `InMemoryHistory` that says its lock can read it (as PostgreSQL's and Redis's do)."""

    locked_reads = True


def delivered_by_the_lock(memory: ConversationMemory, a_run: Any, *said: str) -> HistoryRead:
    """What a networked lock does with the read the kernel offers it: deliver `said`."""
    read = memory.locked_read(a_run)
    assert isinstance(read, HistoryRead)
    read.deliver((None, [(n + 1, Message.user(text)) for n, text in enumerate(said)]))
    return read


async def test_a_history_on_this_process_offers_the_lock_nothing(backend: HistoryBackend) -> None:
    memory = ConversationMemory(backend, endpoint="/e")
    assert isinstance(memory, LockedReader)
    assert memory.locked_read(run("c")) is None


async def test_what_the_lock_read_serves_the_runs_first_load_only() -> None:
    memory = ConversationMemory(NetworkedHistory(), endpoint="/e")
    await memory.append(run("c"), turn(1))
    first = run("c")
    read = delivered_by_the_lock(memory, first, "as the lock read it")
    assert (read.key, read.after_seq, read.limit) == (ConversationKey("/e", None, "c"), 0, 20)
    assert [m.content for m in await memory.load(first)] == ["as the lock read it"]
    assert await memory.load(first) == turn(1), "a second load reads again"
    assert await memory.load(run("c")) == turn(1), "another run never sees it"


async def test_a_write_before_the_first_load_drops_what_the_lock_read() -> None:
    memory = ConversationMemory(NetworkedHistory(), endpoint="/e")
    await memory.append(run("c", "ann"), turn(1))
    cleared, appended, elsewhere = run("c", "ann"), run("c", "ann"), run("c", "ann")
    delivered_by_the_lock(memory, cleared, "stale")
    delivered_by_the_lock(memory, elsewhere, "still good")
    await memory.clear("c", "bob")  # another user's conversation: nothing dropped
    assert [m.content for m in await memory.load(elsewhere)] == ["still good"]
    await memory.clear("c", "ann")
    assert await memory.load(cleared) == []
    delivered_by_the_lock(memory, appended, "stale")
    await memory.append(appended, turn(2))
    assert await memory.load(appended) == turn(2)


async def test_a_summarizing_memory_asks_the_lock_for_the_summary_and_what_follows() -> None:
    memory = ConversationMemory(NetworkedHistory(), endpoint="/e", strategy=SummarizingCompaction())
    read = memory.locked_read(run("c"))
    assert read is not None
    assert (read.after_seq, read.limit) == (None, 500)


async def test_a_chat_turn_is_loaded_and_written_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short turn needs no hop to the database thread once the file is open: the load's
    check of its cached copy and the write of a small turn run on the loop (`run_small`);
    a load that must read rows and a large turn go to the thread."""
    path = tmp_path / "history.db"
    database = SqliteDatabase(path)
    hops: list[str] = []
    hop = database.run

    async def counted(work: Any) -> Any:
        hops.append(getattr(work, "__qualname__", ""))
        return await hop(work)

    monkeypatch.setattr(database, "run", counted)
    history = SqliteHistory(database, pack=False)
    memory = ConversationMemory(history, endpoint="/e")
    try:
        await database.open()
        hops.clear()
        assert await memory.load(run("c")) == []  # a new conversation
        await memory.append(run("c"), turn(1))
        assert await memory.load(run("c")) == turn(1)  # the cached copy, checked
        assert hops == []
        many = [Message.user(f"m{i}") for i in range(sqlite_history.INLINE_MESSAGES + 1)]
        await memory.append(run("c"), many)
        large = [Message.user("x" * sqlite_history.INLINE_BYTES)]
        await memory.append(run("c"), large)
        assert len(hops) == 2
        # Another instance has no cached copy: it reads the rows on the thread.
        other = SqliteDatabase(path)
        try:
            fresh = ConversationMemory(SqliteHistory(other, pack=False), endpoint="/e")
            await other.open()
            assert await fresh.load(run("c")) == (await memory.load(run("c")))
            assert [*turn(1), *many, *large][-20:] == await fresh.load(run("c"))
        finally:
            await other.aclose()
    finally:
        await history.aclose()
        await database.aclose()


async def test_a_turn_written_while_another_process_holds_the_lock_waits_for_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "history.db"
    database = SqliteDatabase(path)
    history = SqliteHistory(database, pack=False)
    memory = ConversationMemory(history, endpoint="/e")
    other = sqlite3.connect(path, isolation_level=None)
    try:
        await database.open()
        other.execute("BEGIN IMMEDIATE")
        writing = asyncio.ensure_future(memory.append(run("c"), turn(1)))
        await asyncio.sleep(0.2)
        assert not writing.done()  # refused on the loop, waiting on the thread
        other.execute("COMMIT")
        await writing
        assert await memory.load(run("c")) == turn(1)
    finally:
        other.close()
        await history.aclose()
        await database.aclose()
