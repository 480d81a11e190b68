"""`RedisConversationOwners`: who owns each conversation, one key per conversation.

The key `owner:{digest(path, conversation)}` holds the owner's user key, with no TTL (ownership
outlives every idle timeout; `forget` deletes it). A claim is one `SET ... NX GET` (Redis 7):
it sets the key only if it is absent and answers the value that was there, so two claims of one
id from two replicas settle on one owner in one round trip, and a claim retried after a lost
reply finds its own value.
"""

from __future__ import annotations

from .connection import RedisConnection, as_str, digest


class RedisConversationOwners:
    """`contracts.ConversationOwners` in Redis, shared by every replica."""

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection

    def _key(self, path: str, conversation_id: str) -> str:
        return self.connection.key("owner", digest(path, conversation_id))

    async def claim(self, path: str, conversation_id: str, user: str) -> str:
        with self.connection.unavailable("claiming a conversation"):
            before = await self.connection.client.set(
                self._key(path, conversation_id), user, nx=True, get=True
            )
        previous = as_str(before)
        return user if previous is None else previous

    async def owner(self, path: str, conversation_id: str) -> str | None:
        with self.connection.unavailable("reading a conversation's owner"):
            value = await self.connection.client.get(self._key(path, conversation_id))
        return as_str(value)

    async def forget(self, path: str, conversation_id: str) -> None:
        with self.connection.unavailable("forgetting a conversation's owner"):
            await self.connection.client.delete(self._key(path, conversation_id))
