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
synchronously, as before.
"""

from __future__ import annotations

import time
from typing import Any

from ..._contracts import OwnedConversation
from .database import PostgresDatabase

CLAIM = """
WITH claimed AS (
    INSERT INTO atmosphere_conversation_owners
        (path, conversation_id, user_key, claimed_at, updated_at, title)
    VALUES ($1, $2, $3, $4, $4, $5)
    ON CONFLICT (path, conversation_id) DO UPDATE
        SET updated_at = EXCLUDED.updated_at
            + 0 * length(set_config('synchronous_commit', 'off', true))
        WHERE atmosphere_conversation_owners.user_key = EXCLUDED.user_key
    RETURNING user_key
)
SELECT user_key FROM claimed
UNION ALL
SELECT user_key FROM atmosphere_conversation_owners WHERE path = $1 AND conversation_id = $2
LIMIT 1
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


class PostgresConversationOwners:
    """`contracts.ConversationOwners` in PostgreSQL, shared by every replica."""

    def __init__(self, database: PostgresDatabase) -> None:
        self.database = database

    async def claim(self, path: str, conversation_id: str, user: str, title: str = "") -> str:
        async def work(connection: Any) -> str | None:
            owner: str | None = await connection.fetchval(
                CLAIM, path, conversation_id, user, time.time(), title
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

    async def forget(self, path: str, conversation_id: str) -> None:
        async def work(connection: Any) -> None:
            await connection.execute(
                "DELETE FROM atmosphere_conversation_owners "
                "WHERE path = $1 AND conversation_id = $2",
                path,
                conversation_id,
            )

        await self.database.run(work)
