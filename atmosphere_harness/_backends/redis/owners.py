"""`RedisConversationOwners`: who owns each conversation, one key per conversation.

The key `owner:{digest(path, conversation)}` holds the owner's user key, with no TTL (ownership
outlives every idle timeout; `forget` deletes it). A claim is one script: `SET ... NX GET`
sets the key only if it is absent and answers the value that was there, so two claims of one
id from two replicas settle on one owner in one round trip, and a claim retried after a lost
reply finds its own value. When the claimant is the owner, the same script moves the
conversation to the top of the owner's sorted set `owned:{digest(path, user)}` (score: the
claim's time) and, on the first claim, stores its title in the hash `titles:{digest(path,
user)}`: a user's list (`page`) reads the set newest first. Every conversation is also in the
sorted set `owners:idle` by its last prompt (member: `[path, conversationId]` as JSON), which
the retention sweep reads oldest first (`expired`), claiming each for its lease with a key
`owners:sweep:{member}` (`SET NX PX`), so two replicas never delete one conversation twice; a
conversation claimed before this set existed joins it at its next prompt. A derived
conversation (a fleet member's) is not in that set: its key `owner-parent:{digest}` names its
parent's member, and the parent's set `owner-children:{digest}` holds its member, which the
parent's deletion reads (`children`); forgetting it removes both.
"""

from __future__ import annotations

import json
import time

from ..._contracts import ExpiredConversation, LockedClaim, OwnedConversation
from .connection import RedisConnection, as_str, digest

_CLAIM = """
local before = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'GET')
local owner = before or ARGV[1]
if owner == ARGV[1] then
    redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
    if ARGV[6] ~= '' and redis.call('SET', KEYS[5], ARGV[6], 'NX') then
        redis.call('SADD', KEYS[6], ARGV[5])
    end
    if redis.call('EXISTS', KEYS[5]) == 1 then
        redis.call('ZREM', KEYS[4], ARGV[5])
    else
        redis.call('ZADD', KEYS[4], ARGV[2], ARGV[5])
    end
    if not before and ARGV[4] ~= '' then
        redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
    end
end
return before
"""
# KEYS: owner, the user's list, their titles, every conversation by last prompt, the
# conversation's parent, that parent's children (a key of no use when ARGV[6] is '').
# ARGV: user, now, conversation id, title, the conversation's member in KEYS[4], the parent's
# member ('' for none).

_FORGET = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[3] ~= '' then
    local updated = redis.call('ZSCORE', KEYS[2], ARGV[2])
    if updated and tonumber(updated) >= tonumber(ARGV[3]) then return 0 end
end
redis.call('DEL', KEYS[1], KEYS[5], KEYS[6], KEYS[7])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[4])
redis.call('SREM', KEYS[8], ARGV[4])
return 1
"""
# KEYS: owner, the owner's list, their titles, every conversation, the sweep claim, the
# conversation's parent, its own children, its parent's children (any key when it has none).
# ARGV: owner, conversation id, idle before ('' for none), the conversation's member.

_EXPIRED = """
local found = {}
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1],
        'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[3]) * 4)) do
    table.insert(found, member)
end
local claimed = {}
for i = 1, #found, 2 do
    if #claimed >= 2 * tonumber(ARGV[3]) then break end
    if redis.call('SET', ARGV[4] .. found[i], '1', 'NX', 'PX', ARGV[2]) then
        table.insert(claimed, found[i])
        table.insert(claimed, found[i + 1])
    end
end
return claimed
"""
# KEYS: every conversation by last prompt. ARGV: before, lease (ms), limit, claim key prefix.
# Returns member, score, member, score, ...

PAGE_BATCH = 64
"""Entries read per round trip while a page skips the ties of its cursor's time."""


class RedisConversationOwners:
    """`contracts.ConversationOwners` in Redis, shared by every replica."""

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self._claim = connection.script(_CLAIM)
        self._forget = connection.script(_FORGET)
        self._expired = connection.script(_EXPIRED)

    def _key(self, path: str, conversation_id: str) -> str:
        return self.connection.key("owner", digest(path, conversation_id))

    def _owned(self, path: str, user: str) -> str:
        return self.connection.key("owned", digest(path, user))

    def _titles(self, path: str, user: str) -> str:
        return self.connection.key("titles", digest(path, user))

    @property
    def _every(self) -> str:
        return self.connection.key("owners", "idle")

    @staticmethod
    def _member(path: str, conversation_id: str) -> str:
        return json.dumps([path, conversation_id])

    def _parent(self, path: str, conversation_id: str) -> str:
        """The member (`_member`) of the conversation this one is derived from, if any."""
        return self.connection.key("owner-parent", digest(path, conversation_id))

    def _children(self, path: str, conversation_id: str) -> str:
        """The members of the conversations derived from this one (a set)."""
        return self.connection.key("owner-children", digest(path, conversation_id))

    def _sweep(self, member: str) -> str:
        """A sweep's claim on the conversation `member` names (it expires with its lease)."""
        return self.connection.key("owners", "sweep", "") + member

    async def claim(
        self,
        path: str,
        conversation_id: str,
        user: str,
        title: str = "",
        parent: tuple[str, str] | None = None,
    ) -> str:
        parent_key = self._parent(path, conversation_id)
        keys = [
            self._key(path, conversation_id),
            self._owned(path, user),
            self._titles(path, user),
            self._every,
            parent_key,
            parent_key if parent is None else self._children(*parent),
        ]
        member = self._member(path, conversation_id)
        parent_member = "" if parent is None else self._member(*parent)
        with self.connection.unavailable("claiming a conversation"):
            before = await self._claim(
                keys=keys,
                args=[user, repr(time.time()), conversation_id, title, member, parent_member],
            )
        previous = as_str(before)
        return user if previous is None else previous

    def claim_keys_args(self, claim: LockedClaim) -> tuple[list[str], list[str]]:
        """`claim`'s keys and arguments as `_CLAIM` takes them, for the conversation lock's
        script that claims as it takes the lock (`history._CLAIM_LOCK_READ_RUN`)."""
        path, conversation_id, user = claim.path, claim.conversation_id, claim.user
        keys = [
            self._key(path, conversation_id),
            self._owned(path, user),
            self._titles(path, user),
            self._every,
            self._parent(path, conversation_id),
        ]
        member = self._member(path, conversation_id)
        return keys, [user, repr(time.time()), conversation_id, claim.title, member]

    async def owner(self, path: str, conversation_id: str) -> str | None:
        with self.connection.unavailable("reading a conversation's owner"):
            value = await self.connection.client.get(self._key(path, conversation_id))
        return as_str(value)

    async def children(self, path: str, conversation_id: str) -> list[tuple[str, str]]:
        with self.connection.unavailable("reading a conversation's derived conversations"):
            members = await self.connection.client.smembers(self._children(path, conversation_id))
        found = []
        for member in members:
            child_path, child_id = json.loads(as_str(member) or "")
            found.append((str(child_path), str(child_id)))
        return sorted(found)

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

    async def forget(
        self, path: str, conversation_id: str, *, idle_before: float | None = None
    ) -> bool:
        member = self._member(path, conversation_id)
        parent_key = self._parent(path, conversation_id)
        with self.connection.unavailable("forgetting a conversation's owner"):
            owner, parent = (
                as_str(value)
                for value in await self.connection.client.mget(
                    [self._key(path, conversation_id), parent_key]
                )
            )
            if owner is None:
                return False
            siblings = parent_key if parent is None else self._children(*json.loads(parent))
            dropped = await self._forget(
                keys=[
                    self._key(path, conversation_id),
                    self._owned(path, owner),
                    self._titles(path, owner),
                    self._every,
                    self._sweep(member),
                    parent_key,
                    self._children(path, conversation_id),
                    siblings,
                ],
                args=[
                    owner,
                    conversation_id,
                    "" if idle_before is None else repr(idle_before),
                    member,
                ],
            )
        return bool(int(dropped))

    async def release(self, path: str, conversation_id: str) -> None:
        with self.connection.unavailable("releasing an idle conversation"):
            await self.connection.client.delete(self._sweep(self._member(path, conversation_id)))

    async def expired(self, before: float, limit: int, lease: float) -> list[ExpiredConversation]:
        client = self.connection.client
        with self.connection.unavailable("finding idle conversations"):
            claimed = await self._expired(
                keys=[self._every],
                args=[
                    repr(before),
                    max(1, int(lease * 1000)),
                    limit,
                    self.connection.key("owners", "sweep", ""),
                ],
            )
            pairs = [
                (as_str(claimed[i]) or "", float(claimed[i + 1])) for i in range(0, len(claimed), 2)
            ]
            found = []
            for member, updated in pairs[:limit]:
                path, conversation_id = json.loads(member)
                owner = as_str(await client.get(self._key(path, conversation_id)))
                if owner is None:  # forgotten meanwhile: drop the stale entry
                    await client.zrem(self._every, member)
                    continue
                found.append(ExpiredConversation(path, conversation_id, owner, updated))
        return found
