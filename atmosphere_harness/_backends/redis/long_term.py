"""`RedisLongTermMemory`: a user's facts in Redis, with a small per-user keyword index.

Per user (keys named by a digest of the user id):

- `text`: hash `normalized_fact -> the first text saved`; `HSETNX` is what makes a fact stored
  once, whichever replica saves it and however saves race (two replicas closing one conversation
  extract the same facts: the second save finds every field set and adds nothing);
- `order`: sorted set of the normalized facts by a per-user counter (learning order);
- `words`: hash `normalized_fact -> its index words`, and one set per word (`w:{word}`) of the
  facts holding it, plus `vocab`, the words in use (so `clear` finds every set).

A save is one Lua script: it adds the new facts, then evicts the oldest past the user's cap
(default 100) and takes them out of the word sets. `search` reads the sets of the query's words
and ranks by how many words a fact shares with the query, then newest first: the same ranking as
the base class, computed from the index instead of every fact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._memory.long_term import (
    DEFAULT_MAX_FACTS,
    LongTermMemory,
    check_user,
    clean_fact,
    normalized_fact,
    query_terms,
    unique_facts,
)
from .connection import RedisConnection, as_str, digest

_SAVE = """
local base = ARGV[1]
local text, order, words, vocab, seq = base .. 'text', base .. 'order', base .. 'words',
    base .. 'vocab', base .. 'seq'
local cap = tonumber(ARGV[2])
if ARGV[3] == '1' then
    local used = redis.call('SMEMBERS', vocab)
    for _, word in ipairs(used) do redis.call('DEL', base .. 'w:' .. word) end
    redis.call('DEL', text, order, words, vocab)
end
local added = 0
for i = 4, #ARGV, 3 do
    local norm, fact, terms = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    if redis.call('HSETNX', text, norm, fact) == 1 then
        redis.call('ZADD', order, redis.call('INCR', seq), norm)
        redis.call('HSET', words, norm, terms)
        for word in string.gmatch(terms, '%S+') do
            redis.call('SADD', base .. 'w:' .. word, norm)
            redis.call('SADD', vocab, word)
        end
        added = added + 1
    end
end
local excess = redis.call('ZCARD', order) - cap
if excess > 0 then
    local old = redis.call('ZPOPMIN', order, excess)
    for i = 1, #old, 2 do
        local norm = old[i]
        local terms = redis.call('HGET', words, norm) or ''
        for word in string.gmatch(terms, '%S+') do
            local key = base .. 'w:' .. word
            redis.call('SREM', key, norm)
            if redis.call('SCARD', key) == 0 then redis.call('SREM', vocab, word) end
        end
        redis.call('HDEL', text, norm)
        redis.call('HDEL', words, norm)
    end
end
if redis.call('ZCARD', order) == 0 then redis.call('DEL', seq) end
return added
"""
# ARGV: key base, cap, replace ('1' or '0'), then (normalized, fact, words) per fact.
# Words are our `query_terms` joined by spaces: letters and digits only, so `%S+` splits them.

_NEWEST = """
local base = ARGV[1]
local norms = redis.call('ZRANGE', base .. 'order', -tonumber(ARGV[2]), -1)
if #norms == 0 then return {} end
return redis.call('HMGET', base .. 'text', unpack(norms))
"""
# One round trip for the newest facts (every prompt of a user with memory reads them).

_CLEAR = """
local base = ARGV[1]
local used = redis.call('SMEMBERS', base .. 'vocab')
for _, word in ipairs(used) do redis.call('DEL', base .. 'w:' .. word) end
redis.call('DEL', base .. 'text', base .. 'order', base .. 'words', base .. 'vocab',
    base .. 'seq')
return 1
"""


class RedisLongTermMemory(LongTermMemory):
    """Long-term memory shared by every replica (see the module docstring)."""

    def __init__(
        self, connection: RedisConnection, *, max_facts_per_user: int = DEFAULT_MAX_FACTS
    ) -> None:
        if max_facts_per_user <= 0:
            raise ValueError("max_facts_per_user must be positive")
        self.connection = connection
        self.max_facts_per_user = max_facts_per_user
        self._save = connection.script(_SAVE)
        self._clear = connection.script(_CLEAR)
        self._newest = connection.script(_NEWEST)

    def __repr__(self) -> str:
        return f"RedisLongTermMemory({self.connection!r})"

    def _base(self, user_id: str) -> str:
        return self.connection.key("ltm", digest(user_id), "")

    async def _store(self, user_id: str, facts: Sequence[str], *, replace: bool) -> None:
        args: list[str | int] = [self._base(user_id), self.max_facts_per_user, int(replace)]
        for fact in facts:
            args.extend((normalized_fact(fact), fact, " ".join(query_terms(fact))))
        with self.connection.unavailable("saving long-term memory"):
            await self._save(keys=[], args=args)

    async def save_fact(self, user_id: str, fact: str) -> None:
        await self.save_facts(user_id, [fact])

    async def save_facts(self, user_id: str, facts: Sequence[str]) -> None:
        check_user(user_id)
        cleaned = [clean_fact(fact) for fact in facts]
        if cleaned:
            await self._store(user_id, cleaned, replace=False)

    async def replace_facts(self, user_id: str, facts: Sequence[str]) -> None:
        check_user(user_id)
        cleaned = unique_facts(clean_fact(fact) for fact in facts)[-self.max_facts_per_user :]
        await self._store(user_id, cleaned, replace=True)

    async def get_facts(self, user_id: str, limit: int = 20) -> list[str]:
        if limit <= 0 or not user_id:
            return []
        with self.connection.unavailable("reading long-term memory"):
            texts: Any = await self._newest(keys=[], args=[self._base(user_id), limit])
        return [str(as_str(text)) for text in texts if text is not None]

    async def search(self, user_id: str, query: str, limit: int = 5) -> list[str]:
        terms = query_terms(query)
        if not terms or limit <= 0 or not user_id:
            return []
        base = self._base(user_id)
        client = self.connection.client
        with self.connection.unavailable("searching long-term memory"):
            async with client.pipeline(transaction=False) as pipe:
                for term in terms:
                    pipe.smembers(base + "w:" + term)
                matches: list[set[str]] = await pipe.execute()
            scores: dict[str, int] = {}
            for found in matches:
                for norm in found:
                    scores[norm] = scores.get(norm, 0) + 1
            if not scores:
                return []
            norms = list(scores)
            async with client.pipeline(transaction=False) as pipe:
                pipe.zmscore(base + "order", norms)
                pipe.hmget(base + "text", norms)
                positions, texts = await pipe.execute()
        ranked = sorted(
            (
                (-scores[norm], -(position or 0.0), str(text))
                for norm, position, text in zip(norms, positions, texts, strict=True)
                if position is not None and text is not None
            ),
        )
        return [text for _score, _position, text in ranked[:limit]]

    async def clear(self, user_id: str) -> None:
        with self.connection.unavailable("clearing long-term memory"):
            await self._clear(keys=[], args=[self._base(user_id)])

    async def fact_count(self, user_id: str) -> int:
        with self.connection.unavailable("reading long-term memory"):
            return int(await self.connection.client.zcard(self._base(user_id) + "order"))
