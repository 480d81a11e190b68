"""`PostgresHistory`: conversation histories in PostgreSQL, shared by every replica.

The layout is the SQLite history's (one row per conversation, one per message), so the same
guarantees hold across processes:

- an append is one statement (`APPEND`) that upserts the conversation row first; the row lock
  it takes serializes appends to one conversation, whichever replica makes them, so sequence
  numbers never collide or interleave, and a turn is stored whole or not at all;
- a load is one query (`NEWEST`): summary checkpoint and newest messages together; a run's
  first load is made in the statement that takes the conversation's lock (`LOCK_NEWEST`);
- payloads are the compact JSON of `memory.codec` (PostgreSQL's TOAST compresses large ones
  itself, so there is no packer here);
- nothing is cached in the process but decoded payloads, by their bytes
  (`codec.decode_plain`): every load reads the rows, so another replica's turn is visible to
  the next load;
- an append whose acknowledgement was lost (the connection died after the commit) and that
  `PostgresDatabase.run` therefore sends again is not stored twice (`APPEND`'s key).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..._memory import codec
from ..._memory.compaction import Summary
from ..._memory.history import WRITE_KEYS_CHARS, ConversationKey, HistoryRead
from ..._runtimes.base import Message
from .database import PostgresDatabase

_KEY = "endpoint = $1 AND user_key = $2 AND conversation_id = $3"

Turn = tuple[str, str, str, float, list[str], str]
"""`APPEND`'s arguments: the conversation's key, the time, the payloads and the write key."""

EXTRACTION_CLAIM = 300.0
"""Seconds one replica's claim to extract a conversation holds if it never finishes."""


_CONVERSATION = f"""
WITH conversation AS (
    INSERT INTO atmosphere_conversations
        (endpoint, user_key, conversation_id, updated_at, last_seq, last_write)
    VALUES ($1, $2, $3, $4, cardinality($5::text[]), $6)
    ON CONFLICT (endpoint, user_key, conversation_id) DO UPDATE SET
        updated_at = excluded.updated_at,
        closed_at = NULL,
        last_seq = atmosphere_conversations.last_seq + cardinality($5::text[]),
        last_write = left(
            excluded.last_write || coalesce(' ' || atmosphere_conversations.last_write, ''),
            {WRITE_KEYS_CHARS}
        )
    WHERE strpos(
        coalesce(atmosphere_conversations.last_write, ''), excluded.last_write
    ) = 0
    RETURNING id, last_seq - cardinality($5::text[]) AS base
)"""
_MESSAGES = """
INSERT INTO atmosphere_messages (conversation, seq, payload)
SELECT conversation.id, conversation.base + given.position, convert_to(given.payload, 'UTF8')
FROM conversation, unnest($5::text[]) WITH ORDINALITY AS given (payload, position)
"""
APPEND = _CONVERSATION + _MESSAGES
"""A turn in one statement (one round trip, atomic): the upsert reserves the sequence numbers
under the conversation row's lock, so concurrent appends from any replica never interleave.
The payloads (compact JSON) travel as `text[]`: asyncpg knows its codec, while a `bytea[]`
parameter costs each new pool connection three extra round trips (type introspection) on its
first append. They are ASCII (`codec.encode_ascii`), so `convert_to(..., 'UTF8')` stores the
same bytes whatever the database's encoding (a LATIN1 database could not hold an emoji as text).

`$6` is the append's key, made once before its first attempt: when the connection dies before
the answer comes back, `PostgresDatabase.run` sends the statement again, and the conversation
row then already holds that key if the first attempt committed (`last_write` keeps the keys of
the latest turns, `memory.history.RECENT_WRITES`, so it still does if other turns were stored
in between). The upsert's `WHERE` skips the row (it is still locked, so a
first attempt the server has not finished yet is waited for), no base is returned and no
message is inserted: the turn is stored once."""


def append_with(statement: str) -> str:
    """`APPEND` that also runs `statement` (a data-modifying `WITH` query, `name AS (...)`, its
    parameters numbered from `$7`) in the same statement, so in the same transaction and commit:
    `locks.APPEND_END` stores a run's end with its turn."""
    return f"{_CONVERSATION}, {statement}{_MESSAGES}"


NEWEST = """
SELECT c.summary, c.summary_covered, m.seq, m.payload
FROM atmosphere_conversations AS c
LEFT JOIN LATERAL (
    SELECT seq, payload FROM atmosphere_messages
    WHERE conversation = c.id AND seq > coalesce($4::integer, c.summary_seq)
    ORDER BY seq DESC LIMIT $5
) AS m ON true
WHERE c.endpoint = $1 AND c.user_key = $2 AND c.conversation_id = $3
ORDER BY m.seq DESC
"""
"""The summary checkpoint and the newest messages after a seq (`NULL`: after the summary), in
one query; a conversation without messages yields one row whose `seq` is `NULL`."""


LOCK_NEWEST = "SELECT * FROM atmosphere_lock_newest($1, $2, $3, $4, $5, $6)"
"""Take a conversation's advisory lock and, once it is taken, read as `NEWEST` does, in one
round trip (schema migration 5): `locks.PostgresConversationLocks` sends it on its lock
connection when the run's first history read is offered to it (`memory.history.HistoryRead`)."""


def _key_args(key: ConversationKey) -> tuple[str, str, str]:
    return key.endpoint, key.user_key, key.conversation_id


def _decode(payload: bytes) -> Message:
    return codec.decode_plain(bytes(payload))


def newest_rows(rows: Sequence[Any]) -> tuple[Summary | None, list[tuple[int, Message]]]:
    """The summary and `(seq, message)` oldest first, from the rows of `NEWEST` (or of
    `LOCK_NEWEST` when it took the lock)."""
    if not rows:
        return None, []
    head = rows[0]
    summary = (
        Summary(head["summary"], int(head["summary_covered"]))
        if head["summary"] is not None
        else None
    )
    return summary, [
        (int(row["seq"]), _decode(row["payload"]))
        for row in reversed(rows)
        if row["seq"] is not None
    ]


def lock_newest_args(lock: int, read: HistoryRead) -> tuple[Any, ...]:
    """`LOCK_NEWEST`'s arguments for advisory lock `lock` and the read `read`."""
    return (lock, *_key_args(read.key), read.after_seq, read.limit)


class PostgresHistory:
    """A `memory.history.HistoryBackend` on the shared PostgreSQL database."""

    durable = True
    locked_reads = True
    """A run's first read can ride on the lock's round trip (`LOCK_NEWEST`)."""

    def __init__(self, database: PostgresDatabase) -> None:
        self.database = database

    async def append(self, key: ConversationKey, messages: Sequence[Message]) -> None:
        await self.store_turn(self.turn(key, messages))

    def turn(self, key: ConversationKey, messages: Sequence[Message]) -> Turn:
        """`APPEND`'s arguments for `messages`, with the turn's write key: made once, so every
        statement that sends them (a retry, or the turn sent alone after `locks.APPEND_END`
        failed) stores the turn once."""
        encoded = [codec.encode_ascii(message) for message in messages]
        return (*_key_args(key), time.time(), encoded, uuid.uuid4().hex)

    async def store_turn(self, turn: Turn) -> None:
        """Store a turn made by `turn` (`APPEND`)."""

        async def work(connection: Any) -> None:
            await connection.execute(APPEND, *turn)

        await self.database.run(work)

    async def _after(
        self, key: ConversationKey, after_seq: int | None, limit: int
    ) -> tuple[Summary | None, list[tuple[int, Message]]]:
        """Up to `limit` newest messages after `after_seq` (`None`: after the summary)."""
        if limit <= 0:
            return None, []

        async def work(connection: Any) -> list[Any]:
            rows: list[Any] = await connection.fetch(NEWEST, *_key_args(key), after_seq, limit)
            return rows

        return newest_rows(await self.database.run(work))

    async def tail(self, key: ConversationKey, limit: int) -> list[Message]:
        _summary, items = await self._after(key, 0, limit)
        return [message for _seq, message in items]

    async def since_summary(
        self, key: ConversationKey, limit: int
    ) -> tuple[Summary | None, list[tuple[int, Message]]]:
        return await self._after(key, None, limit)

    async def save_summary(self, key: ConversationKey, summary: Summary, upto_seq: int) -> None:
        async def work(connection: Any) -> None:
            await connection.execute(
                "UPDATE atmosphere_conversations SET summary = $4, summary_covered = $5, "
                f"summary_seq = $6 WHERE {_KEY} AND summary_seq < $6",
                *_key_args(key),
                summary.text,
                summary.covered,
                upto_seq,
            )

        await self.database.run(work)

    async def messages(self, key: ConversationKey) -> list[Message]:
        async def work(connection: Any) -> list[Any]:
            rows: list[Any] = await connection.fetch(
                "SELECT m.payload FROM atmosphere_messages AS m "
                "JOIN atmosphere_conversations AS c ON c.id = m.conversation "
                "WHERE c.endpoint = $1 AND c.user_key = $2 AND c.conversation_id = $3 "
                "ORDER BY m.seq",
                *_key_args(key),
            )
            return rows

        return [_decode(row["payload"]) for row in await self.database.run(work)]

    async def clear(self, key: ConversationKey) -> None:
        async def work(connection: Any) -> None:
            await connection.execute(
                f"DELETE FROM atmosphere_conversations WHERE {_KEY}", *_key_args(key)
            )

        await self.database.run(work)

    async def close(self, key: ConversationKey) -> bool:
        """Mark the conversation closed; `False` when it is unknown.

        A conversation closed on two replicas at once is closed on both, but extracted by one:
        `unextracted` claims it (see there).
        """
        now = time.time()

        async def work(connection: Any) -> bool:
            row = await connection.fetchrow(
                "UPDATE atmosphere_conversations SET closed_at = coalesce(closed_at, $4) "
                f"WHERE {_KEY} RETURNING id",
                *_key_args(key),
                now,
            )
            return row is not None

        return await self.database.run(work)

    async def unextracted(self, key: ConversationKey, limit: int) -> tuple[list[Message], int]:
        """The messages extraction has not read yet, claimed for this caller.

        The claim (`extracting_until`, `EXTRACTION_CLAIM` seconds) is taken in the same
        statement that reads the bounds, so of two replicas closing one conversation at once
        only one gets messages and calls the model; `mark_extracted` ends the claim, and a
        replica that died mid-extraction leaves it to expire.
        """
        now = time.time()
        # The claim's deadline is also its token: a retry whose first attempt committed finds
        # its own deadline there and goes on, instead of taking it for another replica's claim.
        until = now + EXTRACTION_CLAIM

        async def work(connection: Any) -> tuple[list[Any], int]:
            async with connection.transaction(isolation="read_committed"):
                row = await connection.fetchrow(
                    "UPDATE atmosphere_conversations SET extracting_until = $5 "
                    f"WHERE {_KEY} AND (extracting_until IS NULL OR extracting_until < $4 "
                    "OR extracting_until = $5) RETURNING id, extracted_seq, last_seq",
                    *_key_args(key),
                    now,
                    until,
                )
                if row is None:
                    return [], 0  # unknown, or another replica is extracting it
                rows: list[Any] = await connection.fetch(
                    "SELECT payload FROM atmosphere_messages WHERE conversation = $1 "
                    "AND seq > $2 ORDER BY seq DESC LIMIT $3",
                    row["id"],
                    row["extracted_seq"],
                    limit,
                )
                if not rows:
                    await connection.execute(
                        "UPDATE atmosphere_conversations SET extracting_until = NULL WHERE id = $1",
                        row["id"],
                    )
                return rows, int(row["last_seq"])

        rows, last = await self.database.run(work)
        return [_decode(row["payload"]) for row in reversed(rows)], last

    async def mark_extracted(self, key: ConversationKey, upto_seq: int) -> None:
        async def work(connection: Any) -> None:
            await connection.execute(
                "UPDATE atmosphere_conversations SET extracted_seq = "
                f"greatest(extracted_seq, $4), extracting_until = NULL WHERE {_KEY}",
                *_key_args(key),
                upto_seq,
            )

        await self.database.run(work)

    async def idle(self, before: float, limit: int) -> list[ConversationKey]:
        async def work(connection: Any) -> list[Any]:
            rows: list[Any] = await connection.fetch(
                "SELECT endpoint, user_key, conversation_id FROM atmosphere_conversations "
                "WHERE closed_at IS NULL AND updated_at < $1 ORDER BY updated_at LIMIT $2",
                before,
                limit,
            )
            return rows

        return [
            ConversationKey(row["endpoint"], row["user_key"] or None, row["conversation_id"])
            for row in await self.database.run(work)
        ]

    async def aclose(self) -> None:
        """Nothing to finish: the pool belongs to the backend's `PostgresDatabase`."""
        return None
