"""`RedisUserTokens`: each user's tokens per UTC day, one counter each (`INCRBY`).

Before each model request the daily cap reserves tokens with one script that adds only while
the counter is under the limit (scripts run one at a time, so concurrent reservations see each
other), and settles the reservation with the call's real usage after it. Beside the counter, a
second key keeps the user's last call, the floor of the next reservation. Both live two days
(they are only read on their own day), so nothing needs sweeping.
"""

from __future__ import annotations

from .connection import RedisConnection

KEEP_SECONDS = 2 * 24 * 3600

_RESERVE = """
local spent = tonumber(redis.call('GET', KEYS[1]) or '0')
if spent >= tonumber(ARGV[2]) then return -1 end
local reserved = math.max(tonumber(ARGV[1]), tonumber(redis.call('GET', KEYS[2]) or '0'), 1)
redis.call('INCRBY', KEYS[1], reserved)
redis.call('EXPIRE', KEYS[1], ARGV[3])
return reserved
"""
_SETTLE = """
local spent = redis.call('INCRBY', KEYS[1], tonumber(ARGV[2]) - tonumber(ARGV[1]))
if spent < 0 then redis.call('SET', KEYS[1], 0) end
redis.call('EXPIRE', KEYS[1], ARGV[4])
if ARGV[3] == '1' and tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[4])
end
return 0
"""


class RedisUserTokens:
    """`contracts.UserTokens` on the shared Redis."""

    name = "redis"

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self._reserve = connection.script(_RESERVE)
        self._settle = connection.script(_SETTLE)

    def _key(self, user_id: str, day: str) -> str:
        return self.connection.key("tokens", day, user_id)

    def _last_key(self, user_id: str, day: str) -> str:
        return self.connection.key("tokens-last", day, user_id)

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

    async def reserve(self, user_id: str, day: str, estimate: int, limit: int) -> int | None:
        keys = [self._key(user_id, day), self._last_key(user_id, day)]
        with self.connection.unavailable("reserving daily tokens"):
            reserved = int(await self._reserve(keys=keys, args=[estimate, limit, KEEP_SECONDS]))
        return None if reserved < 0 else reserved

    async def settle(
        self, user_id: str, day: str, reserved: int, used: int, *, remember: bool
    ) -> None:
        keys = [self._key(user_id, day), self._last_key(user_id, day)]
        args = [reserved, used, "1" if remember else "0", KEEP_SECONDS]
        with self.connection.unavailable("settling daily tokens"):
            await self._settle(keys=keys, args=args)
