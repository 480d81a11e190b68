"""Where conversation messages are stored: `InMemoryHistory` (tests) and `SqliteHistory`.

A conversation is keyed by endpoint path, user and conversation id: the same conversation id
used by another user is another conversation, so nobody continues (or reads) someone else's
history by guessing an id. The store keeps every message in full, plus the bookkeeping the
memory primitive needs: the running summary checkpoint, the last activity (the idle reaper) and
how far long-term-memory extraction has read.
"""

from __future__ import annotations

import sqlite3
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from ..runtimes.base import Message
from . import codec
from .compaction import Summary
from .sqlite import SqliteDatabase, Transaction


class ConversationKey(NamedTuple):
    endpoint: str
    user_id: str | None
    conversation_id: str

    @property
    def user_key(self) -> str:
        return self.user_id or ""


class HistoryBackend(Protocol):
    """Storage for `ConversationMemory`; every method is safe to call concurrently."""

    async def append(self, key: ConversationKey, messages: Sequence[Message]) -> None:
        """Store a finished turn (re-opens a closed conversation)."""
        ...

    async def tail(self, key: ConversationKey, limit: int) -> list[Message]:
        """The newest `limit` messages, oldest first."""
        ...

    async def since_summary(
        self, key: ConversationKey, limit: int
    ) -> tuple[Summary | None, list[tuple[int, Message]]]:
        """The summary checkpoint and up to `limit` newest `(seq, message)` after it."""
        ...

    async def save_summary(self, key: ConversationKey, summary: Summary, upto_seq: int) -> None:
        """Move the summary checkpoint forward (an older checkpoint never replaces a newer)."""
        ...

    async def messages(self, key: ConversationKey) -> list[Message]:
        """The whole stored history, oldest first."""
        ...

    async def clear(self, key: ConversationKey) -> None: ...

    async def close(self, key: ConversationKey) -> bool:
        """Mark the conversation closed; `False` when it is unknown."""
        ...

    async def unextracted(self, key: ConversationKey, limit: int) -> tuple[list[Message], int]:
        """Up to `limit` newest messages not yet read by extraction, and the last seq."""
        ...

    async def mark_extracted(self, key: ConversationKey, upto_seq: int) -> None: ...

    async def idle(self, before: float, limit: int) -> list[ConversationKey]:
        """Open conversations whose last activity is older than `before` (epoch seconds)."""
        ...


# --- in memory -----------------------------------------------------------------------------


@dataclass
class _Conversation:
    messages: list[tuple[int, Message]] = field(default_factory=list)
    last_seq: int = 0
    updated_at: float = 0.0
    closed: bool = False
    extracted_seq: int = 0
    summary: Summary | None = None
    summary_seq: int = 0


class InMemoryHistory:
    """Histories in a dict, for tests and throwaway apps; the least recently used are evicted."""

    def __init__(self, max_conversations: int = 10_000) -> None:
        if max_conversations <= 0:
            raise ValueError("max_conversations must be positive")
        self.max_conversations = max_conversations
        self._data: OrderedDict[ConversationKey, _Conversation] = OrderedDict()

    def _get(self, key: ConversationKey) -> _Conversation | None:
        return self._data.get(key)

    async def append(self, key: ConversationKey, messages: Sequence[Message]) -> None:
        conversation = self._data.pop(key, None) or _Conversation()
        self._data[key] = conversation
        for message in messages:
            conversation.last_seq += 1
            conversation.messages.append((conversation.last_seq, message))
        conversation.updated_at = time.time()
        conversation.closed = False
        while len(self._data) > self.max_conversations:
            self._data.popitem(last=False)

    async def tail(self, key: ConversationKey, limit: int) -> list[Message]:
        conversation = self._get(key)
        if conversation is None or limit <= 0:
            return []
        return [message for _seq, message in conversation.messages[-limit:]]

    async def since_summary(
        self, key: ConversationKey, limit: int
    ) -> tuple[Summary | None, list[tuple[int, Message]]]:
        conversation = self._get(key)
        if conversation is None:
            return None, []
        after = [item for item in conversation.messages if item[0] > conversation.summary_seq]
        return conversation.summary, after[-limit:]

    async def save_summary(self, key: ConversationKey, summary: Summary, upto_seq: int) -> None:
        conversation = self._get(key)
        if conversation is not None and upto_seq > conversation.summary_seq:
            conversation.summary = summary
            conversation.summary_seq = upto_seq

    async def messages(self, key: ConversationKey) -> list[Message]:
        conversation = self._get(key)
        return [message for _seq, message in conversation.messages] if conversation else []

    async def clear(self, key: ConversationKey) -> None:
        self._data.pop(key, None)

    async def close(self, key: ConversationKey) -> bool:
        conversation = self._get(key)
        if conversation is None:
            return False
        conversation.closed = True
        return True

    async def unextracted(self, key: ConversationKey, limit: int) -> tuple[list[Message], int]:
        conversation = self._get(key)
        if conversation is None:
            return [], 0
        fresh = [item for item in conversation.messages if item[0] > conversation.extracted_seq]
        return [message for _seq, message in fresh[-limit:]], conversation.last_seq

    async def mark_extracted(self, key: ConversationKey, upto_seq: int) -> None:
        conversation = self._get(key)
        if conversation is not None:
            conversation.extracted_seq = max(conversation.extracted_seq, upto_seq)

    async def idle(self, before: float, limit: int) -> list[ConversationKey]:
        found = [
            key
            for key, conversation in self._data.items()
            if not conversation.closed and conversation.updated_at < before
        ]
        return found[:limit]


# --- SQLite --------------------------------------------------------------------------------

SCHEMA = """
CREATE TABLE IF NOT EXISTS memory_conversations (
    id INTEGER PRIMARY KEY,
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
"""

_FIND = (
    "SELECT id FROM memory_conversations "
    "WHERE endpoint = ? AND user_key = ? AND conversation_id = ?"
)


def _find(connection: sqlite3.Connection, key: ConversationKey) -> int | None:
    row = connection.execute(_FIND, (key.endpoint, key.user_key, key.conversation_id)).fetchone()
    return None if row is None else int(row[0])


def _decoded(rows: list[tuple[int, int, bytes]]) -> list[tuple[int, Message]]:
    return [(seq, codec.decode(kind, payload)) for seq, kind, payload in rows]


class SqliteHistory:
    """Histories in the harness's SQLite file; payloads are stored in `codec` form."""

    def __init__(self, database: SqliteDatabase) -> None:
        self.database = database
        database.add_schema(SCHEMA)

    async def append(self, key: ConversationKey, messages: Sequence[Message]) -> None:
        encoded = [codec.encode(message) for message in messages]
        now = time.time()

        def work(connection: sqlite3.Connection) -> None:
            with Transaction(connection):
                row = connection.execute(
                    "INSERT INTO memory_conversations (endpoint, user_key, conversation_id, "
                    "updated_at) VALUES (?, ?, ?, ?) ON CONFLICT (endpoint, user_key, "
                    "conversation_id) DO UPDATE SET updated_at = excluded.updated_at, "
                    "closed_at = NULL RETURNING id, last_seq",
                    (key.endpoint, key.user_key, key.conversation_id, now),
                ).fetchone()
                conversation, last = int(row[0]), int(row[1])
                connection.executemany(
                    "INSERT INTO memory_messages (conversation, seq, codec, payload) "
                    "VALUES (?, ?, ?, ?)",
                    [
                        (conversation, last + offset, kind, payload)
                        for offset, (kind, payload) in enumerate(encoded, start=1)
                    ],
                )
                connection.execute(
                    "UPDATE memory_conversations SET last_seq = ? WHERE id = ?",
                    (last + len(encoded), conversation),
                )

        await self.database.run(work)

    async def tail(self, key: ConversationKey, limit: int) -> list[Message]:
        def work(connection: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
            conversation = _find(connection, key)
            if conversation is None or limit <= 0:
                return []
            rows = connection.execute(
                "SELECT seq, codec, payload FROM memory_messages WHERE conversation = ? "
                "ORDER BY seq DESC LIMIT ?",
                (conversation, limit),
            ).fetchall()
            rows.reverse()
            return rows

        return [message for _seq, message in _decoded(await self.database.run(work))]

    async def since_summary(
        self, key: ConversationKey, limit: int
    ) -> tuple[Summary | None, list[tuple[int, Message]]]:
        def work(
            connection: sqlite3.Connection,
        ) -> tuple[Summary | None, list[tuple[int, int, bytes]]]:
            row = connection.execute(
                "SELECT id, summary, summary_covered, summary_seq FROM memory_conversations "
                "WHERE endpoint = ? AND user_key = ? AND conversation_id = ?",
                (key.endpoint, key.user_key, key.conversation_id),
            ).fetchone()
            if row is None:
                return None, []
            summary = Summary(row[1], int(row[2])) if row[1] is not None else None
            rows = connection.execute(
                "SELECT seq, codec, payload FROM memory_messages WHERE conversation = ? "
                "AND seq > ? ORDER BY seq DESC LIMIT ?",
                (row[0], row[3], limit),
            ).fetchall()
            rows.reverse()
            return summary, rows

        summary, rows = await self.database.run(work)
        return summary, _decoded(rows)

    async def save_summary(self, key: ConversationKey, summary: Summary, upto_seq: int) -> None:
        await self.database.run(
            lambda connection: connection.execute(
                "UPDATE memory_conversations SET summary = ?, summary_covered = ?, "
                "summary_seq = ? WHERE endpoint = ? AND user_key = ? AND conversation_id = ? "
                "AND summary_seq < ?",
                (
                    summary.text,
                    summary.covered,
                    upto_seq,
                    key.endpoint,
                    key.user_key,
                    key.conversation_id,
                    upto_seq,
                ),
            )
        )

    async def messages(self, key: ConversationKey) -> list[Message]:
        def work(connection: sqlite3.Connection) -> list[tuple[int, int, bytes]]:
            conversation = _find(connection, key)
            if conversation is None:
                return []
            return connection.execute(
                "SELECT seq, codec, payload FROM memory_messages WHERE conversation = ? "
                "ORDER BY seq",
                (conversation,),
            ).fetchall()

        return [message for _seq, message in _decoded(await self.database.run(work))]

    async def clear(self, key: ConversationKey) -> None:
        def work(connection: sqlite3.Connection) -> None:
            with Transaction(connection):
                conversation = _find(connection, key)
                if conversation is not None:
                    connection.execute(
                        "DELETE FROM memory_messages WHERE conversation = ?", (conversation,)
                    )
                    connection.execute(
                        "DELETE FROM memory_conversations WHERE id = ?", (conversation,)
                    )

        await self.database.run(work)

    async def close(self, key: ConversationKey) -> bool:
        now = time.time()

        def work(connection: sqlite3.Connection) -> bool:
            cursor = connection.execute(
                "UPDATE memory_conversations SET closed_at = ? WHERE endpoint = ? AND "
                "user_key = ? AND conversation_id = ?",
                (now, key.endpoint, key.user_key, key.conversation_id),
            )
            return cursor.rowcount > 0

        return await self.database.run(work)

    async def unextracted(self, key: ConversationKey, limit: int) -> tuple[list[Message], int]:
        def work(connection: sqlite3.Connection) -> tuple[list[tuple[int, int, bytes]], int]:
            row = connection.execute(
                "SELECT id, extracted_seq, last_seq FROM memory_conversations "
                "WHERE endpoint = ? AND user_key = ? AND conversation_id = ?",
                (key.endpoint, key.user_key, key.conversation_id),
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
        return [message for _seq, message in _decoded(rows)], last

    async def mark_extracted(self, key: ConversationKey, upto_seq: int) -> None:
        await self.database.run(
            lambda connection: connection.execute(
                "UPDATE memory_conversations SET extracted_seq = max(extracted_seq, ?) "
                "WHERE endpoint = ? AND user_key = ? AND conversation_id = ?",
                (upto_seq, key.endpoint, key.user_key, key.conversation_id),
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
