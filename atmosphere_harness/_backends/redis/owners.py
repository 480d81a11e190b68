"""`RedisConversationOwners`: who owns each conversation, one key per conversation.

The key `owner:{digest(path, conversation)}` holds the owner's user key, with no TTL (ownership
outlives every idle timeout; `forget` deletes it). A claim is one script: `SET ... NX GET`
sets the key only if it is absent and answers the value that was there, so two claims of one
id from two replicas settle on one owner in one round trip, and a claim retried after a lost
reply finds its own value. When the claimant is the owner, the same script moves the
conversation to the top of the owner's sorted set `owned:{digest(path, user)}` (score: the
claim's time) and, on the first claim, stores its title in the hash `titles:{digest(path,
user)}`: a user's list (`page`) reads the set newest first.
"""

from __future__ import annotations

import time

from ..._contracts import OwnedConversation
from .connection import RedisConnection, as_str, digest

_CLAIM = """
local before = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'GET')
local owner = before or ARGV[1]
if owner == ARGV[1] then
    redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
    if not before and ARGV[4] ~= '' then
        redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
    end
end
return before
"""

PAGE_BATCH = 64
"""Entries read per round trip while a page skips the ties of its cursor's time."""


class RedisConversationOwners:
    """`contracts.ConversationOwners` in Redis, shared by every replica."""

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self._claim = connection.client.register_script(_CLAIM)

    def _key(self, path: str, conversation_id: str) -> str:
        return self.connection.key("owner", digest(path, conversation_id))

    def _owned(self, path: str, user: str) -> str:
        return self.connection.key("owned", digest(path, user))

    def _titles(self, path: str, user: str) -> str:
        return self.connection.key("titles", digest(path, user))

    async def claim(self, path: str, conversation_id: str, user: str, title: str = "") -> str:
        keys = [
            self._key(path, conversation_id),
            self._owned(path, user),
            self._titles(path, user),
        ]
        with self.connection.unavailable("claiming a conversation"):
            before = await self._claim(
                keys=keys, args=[user, repr(time.time()), conversation_id, title]
            )
        previous = as_str(before)
        return user if previous is None else previous

    async def owner(self, path: str, conversation_id: str) -> str | None:
        with self.connection.unavailable("reading a conversation's owner"):
            value = await self.connection.client.get(self._key(path, conversation_id))
        return as_str(value)

    async def page(
        self, path: str, user: str, limit: int, after: tuple[float, str] | None = None
    ) -> list[OwnedConversation]:
        client = self.connection.client
        top: float | str = "+inf" if after is None else after[0]
        found: list[tuple[str, float]] = []
        offset = 0
        with self.connection.unavailable("listing a user's conversations"):
            while len(found) < limit:
                batch = await client.zrevrangebyscore(
                    self._owned(path, user),
                    top,
                    "-inf",
                    start=offset,
                    num=max(limit, PAGE_BATCH),
                    withscores=True,
                )
                for entry in batch:
                    member, score = entry[0], entry[1]
                    conversation_id = str(member)
                    # Equal times order by id, descending (as the sorted set does).
                    if after is None or (float(score), conversation_id) < after:
                        found.append((conversation_id, float(score)))
                if len(batch) < max(limit, PAGE_BATCH):
                    break
                offset += len(batch)
            found = found[:limit]
            titles = (
                await client.hmget(self._titles(path, user), [cid for cid, _ in found])
                if found
                else []
            )
        return [
            OwnedConversation(conversation_id, updated, as_str(title) or "")
            for (conversation_id, updated), title in zip(found, titles, strict=True)
        ]

    async def forget(self, path: str, conversation_id: str) -> None:
        with self.connection.unavailable("forgetting a conversation's owner"):
            owner = as_str(await self.connection.client.get(self._key(path, conversation_id)))
            async with self.connection.client.pipeline(transaction=True) as pipe:
                pipe.delete(self._key(path, conversation_id))
                if owner is not None:
                    pipe.zrem(self._owned(path, owner), conversation_id)
                    pipe.hdel(self._titles(path, owner), conversation_id)
                await pipe.execute()
