"""`RedisPromptKeys`: each prompt's `Idempotency-Key` in Redis, seen by every replica.

A key is one string key (`<prefix>pk:<scope>`) holding the record of the run it started, with a
TTL: Redis forgets it by itself. `claim` is one script (`GET`, else `SET ... PX`), so two
requests with one key, on any replicas, store exactly one record. The conversation's keys are
also a set (`pk:conversation:{digest}`, living as long as its newest key) that `forget` reads to
delete them with their conversation.
"""

from __future__ import annotations

from .connection import RedisConnection, as_str, digest

_CLAIM = """
local found = redis.call('GET', KEYS[1])
if found then return found end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], KEYS[1])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
return false
"""
# KEYS: the key's record, the conversation's keys. ARGV: record, ttl (ms).

_FORGET = """
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do redis.call('DEL', key) end
redis.call('DEL', KEYS[1])
return 1
"""
# KEYS: the conversation's keys.


class RedisPromptKeys:
    """A `contracts.PromptKeys` in Redis (see the module docstring)."""

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self._claim = connection.script(_CLAIM)
        self._forget = connection.script(_FORGET)

    def _conversation(self, path: str, conversation_id: str) -> str:
        return self.connection.key("pk", "conversation", digest(path, conversation_id))

    async def claim(
        self, scope: str, record: str, ttl: float, *, path: str = "", conversation_id: str = ""
    ) -> str | None:
        with self.connection.unavailable("recording the prompt's Idempotency-Key"):
            found = await self._claim(
                keys=[self.connection.key("pk", scope), self._conversation(path, conversation_id)],
                args=[record, max(1, int(ttl * 1000))],
            )
        return as_str(found) if found else None

    async def forget(self, path: str, conversation_id: str) -> None:
        with self.connection.unavailable("deleting a conversation's Idempotency-Keys"):
            await self._forget(keys=[self._conversation(path, conversation_id)])
