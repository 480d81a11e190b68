"""`RedisPromptKeys`: each prompt's `Idempotency-Key` in Redis, seen by every replica.

A key is one string key (`<prefix>pk:<scope>`) holding the record of the run it started, with a
TTL: Redis forgets it by itself. `claim` is one script (`GET`, else `SET ... PX`), so two
requests with one key, on any replicas, store exactly one record.
"""

from __future__ import annotations

from .connection import RedisConnection, as_str

_CLAIM = """
local found = redis.call('GET', KEYS[1])
if found then return found end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""
# KEYS: the key's record. ARGV: record, ttl (ms).


class RedisPromptKeys:
    """A `contracts.PromptKeys` in Redis (see the module docstring)."""

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self._claim = connection.client.register_script(_CLAIM)

    async def claim(self, scope: str, record: str, ttl: float) -> str | None:
        with self.connection.unavailable("recording the prompt's Idempotency-Key"):
            found = await self._claim(
                keys=[self.connection.key("pk", scope)], args=[record, max(1, int(ttl * 1000))]
            )
        return as_str(found) if found else None
