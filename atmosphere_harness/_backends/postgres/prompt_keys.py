"""`PostgresPromptKeys`: each prompt's `Idempotency-Key` in PostgreSQL, seen by every replica.

A key is one row, `scope` (a digest of endpoint, user, conversation and key) to the record of
the run it started, until `expires_at`. `claim` is one statement: the primary key makes two
requests with one key, on any replicas, store exactly one record; an expired row is replaced;
each claim also deletes a few expired rows of other keys, so the table stays as large as the
keys of the last `ttl` seconds.
"""

from __future__ import annotations

import time
from typing import Any

from .database import PostgresDatabase

PRUNE_BATCH = 16

CLAIM = """
WITH expired AS (
    DELETE FROM atmosphere_prompt_keys WHERE scope IN (
        SELECT scope FROM atmosphere_prompt_keys
        WHERE expires_at < $3 AND scope <> $1
        ORDER BY expires_at LIMIT $5 FOR UPDATE SKIP LOCKED
    )
)
INSERT INTO atmosphere_prompt_keys (scope, record, expires_at, path, conversation_id)
VALUES ($1, $2, $3 + $4, $6, $7)
ON CONFLICT (scope) DO UPDATE SET record = excluded.record, expires_at = excluded.expires_at,
    path = excluded.path, conversation_id = excluded.conversation_id
WHERE atmosphere_prompt_keys.expires_at < $3
RETURNING NULL::text AS found
"""
"""Store the record unless a live one is there (then no row comes back)."""


class PostgresPromptKeys:
    """A `contracts.PromptKeys` in the `atmosphere_prompt_keys` table (module docstring)."""

    def __init__(self, database: PostgresDatabase) -> None:
        self.database = database

    async def claim(
        self, scope: str, record: str, ttl: float, *, path: str = "", conversation_id: str = ""
    ) -> str | None:
        async def work(connection: Any) -> tuple[bool, str | None]:
            async with connection.transaction():
                stored = await connection.fetchrow(
                    CLAIM, scope, record, time.time(), ttl, PRUNE_BATCH, path, conversation_id
                )
                if stored is not None:
                    return True, None
                found: str | None = await connection.fetchval(
                    "SELECT record FROM atmosphere_prompt_keys WHERE scope = $1", scope
                )
                return False, found

        # A claim whose answer was lost is sent again and finds its own record: the caller
        # recognizes it (the record names the run this request is about to start).
        claimed, found = await self.database.run(work)
        return None if claimed else found

    async def forget(self, path: str, conversation_id: str) -> None:
        async def work(connection: Any) -> None:
            await connection.execute(
                "DELETE FROM atmosphere_prompt_keys WHERE path = $1 AND conversation_id = $2",
                path,
                conversation_id,
            )

        await self.database.run(work)
