"""`PostgresConversationOwners`: who owns each conversation, one row per conversation.

A claim is one statement: `INSERT ... ON CONFLICT DO NOTHING RETURNING` gives the row when the
claim won, and the same statement reads the existing row when it lost (the primary key makes two
claims of one id from two replicas settle on one owner). In the rare case where a competing
claim commits after the statement's snapshot was taken, the statement sees neither its own row
nor the other one, and it is simply made again. The owner's later claims update the row's
`updated_at` in the same statement (`DO UPDATE ... WHERE` the owner is the claimant), which
orders the user's list (`page`, on an index of `(path, user_key, updated_at)`).

That update commits without waiting for its WAL flush (the `SET` expression turns
`synchronous_commit` off for its own transaction, and is only evaluated when the update is
made): a prompt does not pay a disk flush to move a list's order, and a crash can lose at most
the last fraction of a second of `updated_at` moves. A first claim (the insert) still commits
synchronously, as before. A derived conversation's claim (a fleet member's) also records its
parent (in `CLAIM`), which finds it when the parent is deleted (`children`).
"""

from __future__ import annotations

import time
from typing import Any

from ..._contracts import ExpiredConversation, OwnedConversation
from .database import PostgresDatabase

CLAIM = """
WITH claimed AS (
    INSERT INTO atmosphere_conversation_owners AS o
        (path, conversation_id, user_key, claimed_at, updated_at, title, parent_path, parent_id)
    VALUES ($1, $2, $3, $4, $4, $5, $6, $7)
    ON CONFLICT (path, conversation_id) DO UPDATE
        SET updated_at = EXCLUDED.updated_at
                + 0 * length(set_config('synchronous_commit', 'off', true)),
            parent_path = coalesce(o.parent_path, EXCLUDED.parent_path),
            parent_id = coalesce(o.parent_id, EXCLUDED.parent_id)
        WHERE o.user_key = EXCLUDED.user_key
    RETURNING user_key
)
SELECT user_key FROM claimed
UNION ALL
SELECT user_key FROM atmosphere_conversation_owners WHERE path = $1 AND conversation_id = $2
LIMIT 1
"""
"""A claim; a derived conversation's (a fleet member's) also records its parent (`$6`, `$7`;
null for any other, and a parent once recorded stays)."""

CHILDREN = """
SELECT path, conversation_id FROM atmosphere_conversation_owners
WHERE parent_path = $1 AND parent_id = $2 AND parent_id IS NOT NULL
ORDER BY path, conversation_id
"""

OWNER = (
    "SELECT user_key FROM atmosphere_conversation_owners WHERE path = $1 AND conversation_id = $2"
)

_PAGE = """
SELECT conversation_id, updated_at, title FROM atmosphere_conversation_owners
WHERE path = $1 AND user_key = $2{after}
ORDER BY updated_at DESC, conversation_id DESC
LIMIT $3
"""
FIRST_PAGE = _PAGE.format(after="")
NEXT_PAGE = _PAGE.format(after=" AND (updated_at, conversation_id) < ($4, $5)")

CLAIM_TRIES = 3

EXPIRED = """
UPDATE atmosphere_conversation_owners SET sweep_until = $2 + $3
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM atmosphere_conversation_owners
    WHERE updated_at < $1 AND (sweep_until IS NULL OR sweep_until < $2)
        AND parent_id IS NULL
    ORDER BY updated_at LIMIT $4 FOR UPDATE SKIP LOCKED
))
RETURNING path, conversation_id, user_key, updated_at
"""
"""Claim the oldest idle conversations for the retention sweep (a replica sweeping at the same
time skips the rows this one locked, and the lease keeps them this one's until it ran out). The
`= ANY(ARRAY(...))` form keeps the outer update on the rows found (a generic plan of `IN
(...)` scans the table)."""


class PostgresConversationOwners:
    """`contracts.ConversationOwners` in PostgreSQL, shared by every replica."""

    def __init__(self, database: PostgresDatabase) -> None:
        self.database = database

    async def claim(
        self,
        path: str,
        conversation_id: str,
        user: str,
        title: str = "",
        parent: tuple[str, str] | None = None,
    ) -> str:
        parent_path, parent_id = parent if parent is not None else (None, None)

        async def work(connection: Any) -> str | None:
            owner: str | None = await connection.fetchval(
                CLAIM, path, conversation_id, user, time.time(), title, parent_path, parent_id
            )
            return owner

        for _ in range(CLAIM_TRIES):
            owner = await self.database.run(work)
            if owner is not None:
                return owner
        raise RuntimeError(f"could not claim conversation {conversation_id!r} of {path}")

    async def owner(self, path: str, conversation_id: str) -> str | None:
        async def work(connection: Any) -> str | None:
            owner: str | None = await connection.fetchval(OWNER, path, conversation_id)
            return owner

        return await self.database.run(work)

    async def children(self, path: str, conversation_id: str) -> list[tuple[str, str]]:
        async def work(connection: Any) -> list[tuple[str, str]]:
            rows = await connection.fetch(CHILDREN, path, conversation_id)
            return [(row[0], row[1]) for row in rows]

        return await self.database.run(work)

    async def page(
        self, path: str, user: str, limit: int, after: tuple[float, str] | None = None
    ) -> list[OwnedConversation]:
        async def work(connection: Any) -> list[OwnedConversation]:
            if after is None:
                rows = await connection.fetch(FIRST_PAGE, path, user, limit)
            else:
                rows = await connection.fetch(NEXT_PAGE, path, user, limit, *after)
            return [OwnedConversation(row[0], float(row[1]), row[2]) for row in rows]

        return await self.database.run(work)

    async def forget(
        self, path: str, conversation_id: str, *, idle_before: float | None = None
    ) -> bool:
        async def work(connection: Any) -> bool:
            status = await connection.execute(
                "DELETE FROM atmosphere_conversation_owners "
                "WHERE path = $1 AND conversation_id = $2 "
                "AND ($3::float8 IS NULL OR updated_at < $3::float8)",
                path,
                conversation_id,
                idle_before,
            )
            return not str(status).endswith(" 0")

        return bool(await self.database.run(work))

    async def release(self, path: str, conversation_id: str) -> None:
        async def work(connection: Any) -> None:
            await connection.execute(
                "UPDATE atmosphere_conversation_owners SET sweep_until = NULL "
                "WHERE path = $1 AND conversation_id = $2",
                path,
                conversation_id,
            )

        await self.database.run(work)

    async def expired(self, before: float, limit: int, lease: float) -> list[ExpiredConversation]:
        async def work(connection: Any) -> list[Any]:
            rows: list[Any] = await connection.fetch(EXPIRED, before, time.time(), lease, limit)
            return rows

        rows = await self.database.run(work)
        return sorted(
            (ExpiredConversation(row[0], row[1], row[2], float(row[3])) for row in rows),
            key=lambda row: row.updated_at,
        )
