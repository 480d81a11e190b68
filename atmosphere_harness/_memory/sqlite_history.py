"""`SqliteHistory`: conversation histories in the harness's SQLite file.

Three things keep it off the request path's critical costs:

- a turn is written as plain JSON in one transaction (no compression while the client waits);
- a *packer* later rewrites large payloads in bz2 form (`codec.pack`) in the background, so the
  file ends up holding about a fifth of their size; it only ever replaces a payload with the
  packed form of the same bytes, returns the freed pages to the file system, and finishes its
  backlog at shutdown;
- the newest messages of recent conversations stay decoded in memory (bounded by count and
  bytes); a load costs one small query that checks the cached copy is still current, so another
  process writing the same file is seen, never served stale;
- that query, and the write of a short turn (`INLINE_MESSAGES`, `INLINE_BYTES`), run right on
  the event loop when the connection is idle (`SqliteDatabase.run_small`): the hop to the
  database thread and back cost more than they do (a one-tool prompt in a new conversation went
  from 1.03-1.46 ms to 0.81-1.15 ms). Reading rows (a conversation not cached) and longer turns
  stay on the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import sqlite3
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .._log import get_logger
from .._runtimes.base import Message
from . import codec
from .compaction import Summary
from .history import ConversationKey
from .sqlite import Elsewhere, SqliteDatabase, Transaction

log = get_logger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS memory_conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    endpoint TEXT NOT NULL,
    user_key TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    updated_at REAL NOT NULL,
    closed_at REAL,
    last_seq INTEGER NOT NULL DEFAULT 0,
    extracted_seq INTEGER NOT NULL DEFAULT 0,
    summary TEXT,
    summary_covered INTEGER NOT NULL DEFAULT 0,
    summary_seq INTEGER NOT NULL DEFAULT 0,
    UNIQUE (endpoint, user_key, conversation_id)
);
CREATE INDEX IF NOT EXISTS memory_conversations_open
    ON memory_conversations (updated_at) WHERE closed_at IS NULL;
CREATE TABLE IF NOT EXISTS memory_messages (
    conversation INTEGER NOT NULL REFERENCES memory_conversations (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    codec INTEGER NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (conversation, seq)
);
CREATE INDEX IF NOT EXISTS memory_messages_unpacked
    ON memory_messages (codec) WHERE codec = 0;
"""

UNPACKED = 0
"""Plain payload the packer has not looked at yet (only large ones are written so)."""
PLAIN_FINAL = 1
"""Plain payload that stays plain (small, or it did not compress)."""

CACHE_MESSAGES = 512
"""Decoded messages kept per conversation (at least what one load reads)."""
CACHE_BYTES = 64 * 1024 * 1024
"""Stored bytes the decoded cache may stand for, over all conversations."""
INLINE_MESSAGES = 32
INLINE_BYTES = 16 * 1024
"""A turn of at most `INLINE_MESSAGES` messages and this many payload bytes is written right
on the event loop when the connection is idle (`SqliteDatabase.run_small`); a larger one on the
database thread. A row costs about 4.5 us (the statement, its index entries, its WAL pages), so
the loop stalls for 0.15-0.2 ms at most, where the hop alone costs 70 us on a quiet machine and
far more on a busy one; a 120-message turn of 1 KiB each takes 0.9 ms either way, better spent
off the loop."""
PACK_BATCH = 8
PACK_AFTER_QUIET = 1.0
"""Seconds without a new turn before the packer starts."""
PACK_DRAIN_SECONDS = 30.0
"""How long shutdown may spend packing what is left (the rest stays plain, still correct)."""

_KEY = "endpoint = ? AND user_key = ? AND conversation_id = ?"


def _key_args(key: ConversationKey) -> tuple[str, str, str]:
    return key.endpoint, key.user_key, key.conversation_id


def _decoded(rows: Sequence[tuple[int, int, bytes]]) -> list[tuple[int, Message, int]]:
    return [(seq, codec.decode(kind, payload), len(payload)) for seq, kind, payload in rows]


@dataclass
class _Tail:
    """A contiguous run of a conversation's newest messages, ending at `last_seq`.

    `row` is the conversation's row id (never reused), so a conversation cleared and started
    again elsewhere is not mistaken for the cached one.
    """

    row: int
    last_seq: int
    items: deque[tuple[int, Message, int]] = field(default_factory=deque)
    size: int = 0

    @property
    def first_seq(self) -> int:
        return self.items[0][0] if self.items else self.last_seq + 1

    def covers(self, row: int, last_seq: int, wanted_from: int) -> bool:
        return self.row == row and self.last_seq == last_seq and self.first_seq <= wanted_from

    def since(self, wanted_from: int) -> list[tuple[int, Message]]:
        return [(seq, message) for seq, message, _size in self.items if seq >= wanted_from]


class _TailCache:
    """LRU of `_Tail`s, bounded per conversation (messages) and overall (stored bytes)."""

    def __init__(self) -> None:
        self._tails: OrderedDict[ConversationKey, _Tail] = OrderedDict()
        self._size = 0

    def get(self, key: ConversationKey) -> _Tail | None:
        tail = self._tails.get(key)
        if tail is not None:
            self._tails.move_to_end(key)
        return tail

    def put(
        self, key: ConversationKey, row: int, items: list[tuple[int, Message, int]], last: int
    ) -> None:
        """Record that `items` (contiguous, ending at `last`) are the conversation's newest."""
        tail = self._tails.get(key)
        if (
            tail is None
            or tail.row != row
            or (items and items[0][0] != tail.last_seq + 1)
            or tail.last_seq > last
        ):
            self.drop(key)
            tail = _Tail(row, last)
            self._tails[key] = tail
        for item in items:
            tail.items.append(item)
            tail.size += item[2]
            self._size += item[2]
        tail.last_seq = last
        while len(tail.items) > CACHE_MESSAGES:
            self._pop_oldest(tail)
        self._tails.move_to_end(key)
        while self._size > CACHE_BYTES and self._tails:
            oldest = next(iter(self._tails))
            self.drop(oldest)

    def _pop_oldest(self, tail: _Tail) -> None:
        _seq, _message, size = tail.items.popleft()
        tail.size -= size
        self._size -= size

    def drop(self, key: ConversationKey) -> None:
        tail = self._tails.pop(key, None)
        if tail is not None:
            self._size -= tail.size


class _Packer:
    """Rewrites large plain payloads in packed form, in the background.

    Reads and writes go through the history's own database thread (short statements, so the
    file keeps a single writer and nobody waits on a lock); compression runs on a thread of its
    own (bz2 releases the GIL while it works).
    """

    def __init__(self, database: SqliteDatabase) -> None:
        self.database = database
        self._executor: ThreadPoolExecutor | None = None
        self._wanted: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_wake = 0.0

    def wake(self) -> None:
        self._last_wake = time.monotonic()
        if self._task is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="atmosphere-packer")
            self._wanted = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="memory-packer")
        assert self._wanted is not None
        self._wanted.set()

    async def _run(self) -> None:
        assert self._wanted is not None
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            # Pack in the pauses between turns, not while the turns are coming.
            while (quiet := time.monotonic() - self._last_wake) < PACK_AFTER_QUIET:  # noqa: ASYNC110
                await asyncio.sleep(PACK_AFTER_QUIET - quiet)
            try:
                await self.drain(math.inf, yield_to_writes=True)
            except Exception as exc:
                log.warning("history packing failed; payloads stay plain", error=str(exc))

    async def drain(self, seconds: float, *, yield_to_writes: bool = False) -> None:
        """Pack until nothing is left or `seconds` have passed; then give free pages back.

        With `yield_to_writes`, a new turn arriving stops the drain (the next pause resumes it).
        """
        deadline = time.monotonic() + seconds
        loop = asyncio.get_running_loop()
        packed_any = False
        started = time.monotonic()
        while time.monotonic() < deadline:
            if yield_to_writes and self._last_wake > started:
                break
            rows = await self.database.run(_unpacked)
            if not rows:
                break
            updates = []
            for rowid, payload in rows:
                packed = await loop.run_in_executor(self._executor, codec.pack, payload)
                kind = PLAIN_FINAL if packed is None else codec.BZ2
                updates.append((kind, payload if packed is None else packed, rowid, payload))
            await self.database.run(functools.partial(_store_packed, updates=updates))
            packed_any = True
        if packed_any:
            await self.database.run(_vacuum)

    async def aclose(self) -> None:
        """Pack what is left (bounded in time) and stop."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        try:
            await self.drain(PACK_DRAIN_SECONDS)
        except Exception as exc:
            log.warning("history packing failed at shutdown", error=str(exc))
        assert self._executor is not None
        self._executor.shutdown(wait=True)


def _unpacked(connection: sqlite3.Connection) -> list[tuple[int, bytes]]:
    rows: list[tuple[int, bytes]] = connection.execute(
        "SELECT rowid, payload FROM memory_messages WHERE codec = 0 LIMIT ?", (PACK_BATCH,)
    ).fetchall()
    return rows


def _store_packed(
    connection: sqlite3.Connection, updates: list[tuple[int, bytes, int, bytes]]
) -> None:
    with Transaction(connection):
        # Matching the original bytes makes a row deleted (or reused) meanwhile safe.
        connection.executemany(
            "UPDATE memory_messages SET codec = ?, payload = ? "
            "WHERE rowid = ? AND codec = 0 AND payload = ?",
            updates,
        )


def _vacuum(connection: sqlite3.Connection) -> None:
    # `execute` would run one step of this pragma (one page); a script runs it to the end.
    connection.executescript("PRAGMA incremental_vacuum;")


class SqliteHistory:
    """Histories in the harness's SQLite file (see the module docstring for how it stays fast)."""

    durable = True

    def __init__(self, database: SqliteDatabase, *, pack: bool = True) -> None:
        self.database = database
        database.add_schema(SCHEMA)
        self._cache = _TailCache()
        self._packer = _Packer(database) if pack else None

    async def append(self, key: ConversationKey, messages: Sequence[Message]) -> None:
        now = time.time()
        encoded = [codec.encode(message) for message in messages]

        def work(connection: sqlite3.Connection) -> tuple[int, int]:
            with Transaction(connection):
                row = connection.execute(
                    "INSERT INTO memory_conversations (endpoint, user_key, conversation_id, "
                    "updated_at) VALUES (?, ?, ?, ?) ON CONFLICT (endpoint, user_key, "
                    "conversation_id) DO UPDATE SET updated_at = excluded.updated_at, "
                    "closed_at = NULL RETURNING id, last_seq",
                    (*_key_args(key), now),
                ).fetchone()
                conversation, last = int(row[0]), int(row[1])
                connection.executemany(
                    "INSERT INTO memory_messages (conversation, seq, codec, payload) "
                    "VALUES (?, ?, ?, ?)",
                    [
                        (
                            conversation,
                            last + offset,
                            UNPACKED if len(payload) >= codec.PACK_FROM else PLAIN_FINAL,
                            payload,
                        )
                        for offset, payload in enumerate(encoded, start=1)
                    ],
                )
                connection.execute(
                    "UPDATE memory_conversations SET last_seq = ? WHERE id = ?",
                    (last + len(encoded), conversation),
                )
                return conversation, last

        if len(encoded) <= INLINE_MESSAGES and sum(map(len, encoded)) <= INLINE_BYTES:
            row, last = await self.database.run_small(work)
        else:
            row, last = await self.database.run(work)
        items = [
            (last + offset, message, len(payload))
            for offset, (message, payload) in enumerate(zip(messages, encoded, strict=True), 1)
        ]
        self._cache.put(key, row, items, last + len(items))
        if self._packer is not None and any(len(p) >= codec.PACK_FROM for p in encoded):
            self._packer.wake()

    async def _newest(
        self, key: ConversationKey, after_seq: int | None, limit: int
    ) -> tuple[Summary | None, list[tuple[int, Message]]]:
        """Up to `limit` newest messages after `after_seq` (`None`: after the summary)."""
        tail = self._cache.get(key)
        # A snapshot: the cache belongs to the event loop; the query may run on the database
        # thread (when it must read rows, or the connection is busy).
        cached = (tail.row, tail.last_seq, tail.first_seq) if tail is not None else None

        def work(
            connection: sqlite3.Connection,
        ) -> tuple[Summary | None, int, int, int, list[tuple[int, int, bytes]] | None] | None:
            row = connection.execute(
                "SELECT id, last_seq, summary, summary_covered, summary_seq "
                f"FROM memory_conversations WHERE {_KEY}",
                _key_args(key),
            ).fetchone()
            if row is None:
                return None
            conversation, last_seq = int(row[0]), int(row[1])
            summary = Summary(row[2], int(row[3])) if row[2] is not None else None
            after = int(row[4]) if after_seq is None else after_seq
            wanted_from = max(after + 1, last_seq - limit + 1, 1)
            if (
                cached is not None
                and cached[:2] == (conversation, last_seq)
                and cached[2] <= wanted_from
            ):
                return summary, conversation, last_seq, wanted_from, None
            if self.database.inline:
                raise Elsewhere  # the rows are as many as `limit`: read them on the thread
            rows = connection.execute(
                "SELECT seq, codec, payload FROM memory_messages WHERE conversation = ? "
                "AND seq >= ? ORDER BY seq",
                (conversation, wanted_from),
            ).fetchall()
            return summary, conversation, last_seq, wanted_from, rows

        if limit <= 0:
            return None, []
        found = await self.database.run_small(work)
        if found is None:
            self._cache.drop(key)
            return None, []
        summary, row, last_seq, wanted_from, rows = found
        if rows is None:
            current = self._cache.get(key)
            if current is not None and current.covers(row, last_seq, wanted_from):
                return summary, current.since(wanted_from)
            # The cached copy changed while the query ran: read again.
            return await self._newest(key, after_seq, limit)
        items = _decoded(rows)
        self._cache.put(key, row, items, last_seq)
        return summary, [(seq, message) for seq, message, _size in items]

    async def tail(self, key: ConversationKey, limit: int) -> list[Message]:
        _summary, items = await self._newest(key, 0, limit)
        return [message for _seq, message in items]

    async def since_summary(
        self, key: ConversationKey, limit: int
    ) -> tuple[Summary | None, list[tuple[int, Message]]]:
        return await self._newest(key, None, limit)

    async def save_summary(self, key: ConversationKey, summary: Summary, upto_seq: int) -> None:
        await self.database.run(
            lambda connection: connection.execute(
                "UPDATE memory_conversations SET summary = ?, summary_covered = ?, "
                f"summary_seq = ? WHERE {_KEY} AND summary_seq < ?",
                (summary.text, summary.covered, upto_seq, *_key_args(key), upto_seq),
            )
        )

    async def messages(self, key: ConversationKey) -> list[Message]:
        def work(connection: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
            return connection.execute(
                "SELECT m.seq, m.codec, m.payload FROM memory_messages AS m "
                "JOIN memory_conversations AS c ON c.id = m.conversation "
                "WHERE c.endpoint = ? AND c.user_key = ? AND c.conversation_id = ? "
                "ORDER BY m.seq",
                _key_args(key),
            ).fetchall()

        return [message for _seq, message, _size in _decoded(await self.database.run(work))]

    async def clear(self, key: ConversationKey) -> None:
        def work(connection: sqlite3.Connection) -> None:
            with Transaction(connection):
                row = connection.execute(
                    f"SELECT id FROM memory_conversations WHERE {_KEY}", _key_args(key)
                ).fetchone()
                if row is not None:
                    connection.execute("DELETE FROM memory_messages WHERE conversation = ?", row)
                    connection.execute("DELETE FROM memory_conversations WHERE id = ?", row)

        self._cache.drop(key)
        await self.database.run(work)
        self._cache.drop(key)

    async def close(self, key: ConversationKey) -> bool:
        now = time.time()

        def work(connection: sqlite3.Connection) -> bool:
            cursor = connection.execute(
                f"UPDATE memory_conversations SET closed_at = ? WHERE {_KEY}",
                (now, *_key_args(key)),
            )
            return cursor.rowcount > 0

        return await self.database.run(work)

    async def unextracted(self, key: ConversationKey, limit: int) -> tuple[list[Message], int]:
        def work(connection: sqlite3.Connection) -> tuple[list[tuple[int, int, bytes]], int]:
            row = connection.execute(
                f"SELECT id, extracted_seq, last_seq FROM memory_conversations WHERE {_KEY}",
                _key_args(key),
            ).fetchone()
            if row is None:
                return [], 0
            rows = connection.execute(
                "SELECT seq, codec, payload FROM memory_messages WHERE conversation = ? "
                "AND seq > ? ORDER BY seq DESC LIMIT ?",
                (row[0], row[1], limit),
            ).fetchall()
            rows.reverse()
            return rows, int(row[2])

        rows, last = await self.database.run(work)
        return [message for _seq, message, _size in _decoded(rows)], last

    async def mark_extracted(self, key: ConversationKey, upto_seq: int) -> None:
        await self.database.run(
            lambda connection: connection.execute(
                "UPDATE memory_conversations SET extracted_seq = max(extracted_seq, ?) "
                f"WHERE {_KEY}",
                (upto_seq, *_key_args(key)),
            )
        )

    async def idle(self, before: float, limit: int) -> list[ConversationKey]:
        rows = await self.database.run(
            lambda connection: connection.execute(
                "SELECT endpoint, user_key, conversation_id FROM memory_conversations "
                "WHERE closed_at IS NULL AND updated_at < ? ORDER BY updated_at LIMIT ?",
                (before, limit),
            ).fetchall()
        )
        return [ConversationKey(row[0], row[1] or None, row[2]) for row in rows]

    async def aclose(self) -> None:
        """Finish packing; the database itself belongs to whoever opened it."""
        if self._packer is not None:
            await self._packer.aclose()
