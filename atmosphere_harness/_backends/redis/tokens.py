"""`RedisUserTokens`: each user's tokens per UTC day, one counter each (`INCRBY`).

A counter lives two days (it is only read on its own day), so nothing needs sweeping.
"""

from __future__ import annotations

from .connection import RedisConnection

KEEP_SECONDS = 2 * 24 * 3600


class RedisUserTokens:
    """`contracts.UserTokens` on the shared Redis."""

    name = "redis"

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection

    def _key(self, user_id: str, day: str) -> str:
        return self.connection.key("tokens", day, user_id)

    async def spent(self, user_id: str, day: str) -> int:
        with self.connection.unavailable("reading a daily token count"):
            value = await self.connection.client.get(self._key(user_id, day))
        return int(value or 0)

    async def add(self, user_id: str, day: str, tokens: int) -> int:
        key = self._key(user_id, day)
        with self.connection.unavailable("adding to a daily token count"):
            async with self.connection.client.pipeline(transaction=True) as pipe:
                pipe.incrby(key, tokens)
                pipe.expire(key, KEEP_SECONDS)
                total, _ = await pipe.execute()
        return int(total)
