"""`PostgresUserTokens`: each user's tokens per UTC day, one row each, added to atomically.

Every replica's add is one upsert (`tokens = tokens + n`), so concurrent runs of one user never
lose a count. Before each model request the daily cap reserves tokens in one upsert that adds
only while the row is under the limit (the row's lock orders concurrent reservations), and
settles the reservation with the call's real usage after it. Rows of past days are
dropped by the first add of a new day on any replica (a few per user, never on the hot path
of a run that is still inside its day).
"""

from __future__ import annotations

from typing import Any

from .database import PostgresDatabase

_ADD = """
INSERT INTO atmosphere_user_tokens (user_id, day, tokens) VALUES ($1, $2, $3)
ON CONFLICT (user_id, day) DO UPDATE SET tokens = atmosphere_user_tokens.tokens + EXCLUDED.tokens
RETURNING tokens
"""
_RESERVE = """
INSERT INTO atmosphere_user_tokens AS t (user_id, day, tokens) VALUES ($1, $2, GREATEST($3, 1))
ON CONFLICT (user_id, day) DO UPDATE SET tokens = t.tokens + GREATEST($3, t.last_call, 1)
WHERE t.tokens < $4
RETURNING GREATEST($3, t.last_call, 1)
"""
_SETTLE = """
UPDATE atmosphere_user_tokens SET tokens = GREATEST(tokens + $4 - $3, 0),
    last_call = CASE WHEN $5 AND $4 > 0 THEN $4 ELSE last_call END
WHERE user_id = $1 AND day = $2
"""
_SPENT = "SELECT tokens FROM atmosphere_user_tokens WHERE user_id = $1 AND day = $2"
_EXPIRE = "DELETE FROM atmosphere_user_tokens WHERE day < $1"


class PostgresUserTokens:
    """`contracts.UserTokens` on the shared database."""

    name = "postgres"

    def __init__(self, database: PostgresDatabase) -> None:
        self.database = database
        self._expired_before = ""

    async def spent(self, user_id: str, day: str) -> int:
        async def read(connection: Any) -> int:
            return int(await connection.fetchval(_SPENT, user_id, day) or 0)

        return await self.database.run(read)

    async def add(self, user_id: str, day: str, tokens: int) -> int:
        async def write(connection: Any) -> int:
            if self._expired_before != day:
                await connection.execute(_EXPIRE, day)
                self._expired_before = day
            return int(await connection.fetchval(_ADD, user_id, day, tokens))

        return await self.database.run(write)

    async def reserve(self, user_id: str, day: str, estimate: int, limit: int) -> int | None:
        async def write(connection: Any) -> int | None:
            value = await connection.fetchval(_RESERVE, user_id, day, estimate, limit)
            return None if value is None else int(value)

        return await self.database.run(write)

    async def settle(
        self, user_id: str, day: str, reserved: int, used: int, *, remember: bool
    ) -> None:
        async def write(connection: Any) -> None:
            await connection.execute(_SETTLE, user_id, day, reserved, used, remember)

        await self.database.run(write)
