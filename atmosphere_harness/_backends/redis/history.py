"""`RedisHistory`: conversation histories in Redis, shared by every replica.

A conversation (endpoint, user, conversation id) is two keys: a list of its messages (the
stored JSON of `memory.codec`, oldest first) and a hash of its bookkeeping (the seq of the first
kept message and of the last, the summary checkpoint, how far extraction read, the last
activity, whether it is closed). Every write is one Lua script, so a turn lands whole and two
replicas appending to one conversation get consecutive seqs in the order Redis ran them.

Bounds:

- a conversation keeps its newest `max_messages` (the list is trimmed from the front and its
  first seq moves on; loads read far fewer than that);
- the app keeps at most `max_conversations`: past the cap the least recently active are
  deleted, except any a run holds the lock of on **any** replica (the hash records the lock's
  key, `RedisConversationLocks`) or that was active in the last `min_idle` seconds; so a cap
  never takes a conversation from under another replica's run.

`unextracted` claims the conversation for extraction (a key with a TTL) so that one close of a
conversation on two replicas extracts its facts once; the claim is dropped by `mark_extracted`,
or lapses if the extracting replica dies, so a later close retries.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..._log import get_logger
from ..._memory import codec
from ..._memory.compaction import Summary
from ..._memory.history import WRITE_KEYS_CHARS, ConversationKey, HistoryRead
from ..._runtimes.base import Message
from .connection import RedisConnection, as_str, digest, lock_key
from .control import STORE_STATUS, status_keys_args

log = get_logger(__name__)

MAX_MESSAGES = 10_000
MAX_CONVERSATIONS = 100_000
MIN_IDLE = 300.0
"""Seconds of inactivity before the cap may delete a conversation."""
EVICT_BATCH = 64
EXTRACTION_CLAIM = 300
"""Seconds one replica's claim to extract a conversation holds if it never finishes."""

APPEND_FUNCTION = (
    f"local WRITE_KEYS_CHARS = {WRITE_KEYS_CHARS}\n"
    + """
local function append_turn(meta, messages, open, all, at)
    local write = ARGV[at + 8]
    local writes = redis.call('HGET', meta, 'write') or ''
    if string.find(' ' .. writes .. ' ', ' ' .. write .. ' ', 1, true) then
        return {tonumber(redis.call('HGET', meta, 'last')), redis.call('ZCARD', all)}
    end
    if writes ~= '' then writes = string.sub(write .. ' ' .. writes, 1, WRITE_KEYS_CHARS)
    else writes = write end
    local now, name = ARGV[at + 1], ARGV[at + 6]
    local first = redis.call('HGET', meta, 'first')
    if not first then
        redis.call('HSET', meta, 'first', 1, 'last', 0, 'extracted', 0, 'summary_seq', 0)
    end
    local last = tonumber(redis.call('HGET', meta, 'last'))
    local count = #ARGV - at - 8
    for i = at + 9, #ARGV, 500 do
        redis.call('RPUSH', messages, unpack(ARGV, i, math.min(i + 499, #ARGV)))
    end
    redis.call('HSET', meta, 'last', last + count, 'updated', now, 'closed', 0,
        'endpoint', ARGV[at + 2], 'user', ARGV[at + 3], 'conversation', ARGV[at + 4],
        'lock', ARGV[at + 5], 'write', writes)
    redis.call('ZADD', open, now, name)
    redis.call('ZADD', all, now, name)
    local size = redis.call('LLEN', messages)
    local keep = tonumber(ARGV[at + 7])
    if size > keep then
        redis.call('LTRIM', messages, size - keep, -1)
        redis.call('HINCRBY', meta, 'first', size - keep)
    end
    return {last, redis.call('ZCARD', all)}
end
"""
)
"""A Lua function the scripts that store a turn include (`_APPEND`, and the lock's release
that carries the turn, `locks._APPEND_RELEASE_RUN`): the turn's messages after the last, the
bookkeeping, both activity sets, the trim to `max_messages`; `{last seq before, conversations}`.
Its first command reads the write keys of the conversation's latest turns (the `write` field,
`memory.history.RECENT_WRITES`): a turn whose key is among them (its script
ran, and its reply was lost) is stored once, and nothing is written, even when other turns were
stored between the first attempt and the one sent again (a lost reply to the lock's release
frees the conversation before the turn is sent again)."""
# KEYS (passed): meta, messages, open zset, all zset. ARGV after `at`: now, endpoint, user,
# conversation, lock key, digest, max messages, write key, message...

_APPEND = APPEND_FUNCTION + "return append_turn(KEYS[1], KEYS[2], KEYS[3], KEYS[4], 0)\n"
# The write key is made once per turn: the same script sent again (its reply was lost and
# something re-sent it) finds it in the hash and stores nothing.

_READ_FUNCTION = """
local function read(meta, messages, after_arg, limit_arg)
    local m = redis.call('HMGET', meta, 'first', 'last', 'summary', 'covered', 'summary_seq',
        'extracted')
    if not m[2] then return false end
    local first, last = tonumber(m[1]), tonumber(m[2])
    local after
    if after_arg == 'summary' then after = tonumber(m[5] or '0')
    elseif after_arg == 'extracted' then after = tonumber(m[6] or '0')
    else after = tonumber(after_arg) end
    local limit = tonumber(limit_arg)
    local from = math.max(after + 1, last - limit + 1, first)
    local items = {}
    if from <= last and limit > 0 then
        items = redis.call('LRANGE', messages, from - first, -1)
    end
    return {m[3] or false, m[4] or '0', from, last, items}
end
"""

_READ = _READ_FUNCTION + "return read(KEYS[1], KEYS[2], ARGV[1], ARGV[2])\n"
# KEYS: meta, messages. ARGV: after ('summary', 'extracted' or a seq), limit.

_LOCK_READ = (
    _READ_FUNCTION
    + """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
return {read(KEYS[2], KEYS[3], ARGV[3], ARGV[4])}
"""
)
"""Take a conversation's lock (`SET NX PX`, as redis-py's `Lock` does) and, if it was taken,
read its history as `_READ` does, in one script: one round trip, the read made under the lock
(a script runs alone). `false`: not taken; else a one-item array holding `_READ`'s reply."""
# KEYS: lock, meta, messages. ARGV: token, ttl (ms), after, limit.

_LOCK_READ_RUN = (
    _READ_FUNCTION
    + STORE_STATUS
    + """
local got = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if got then
    store_status(KEYS[4], KEYS[5], KEYS[6], ARGV[5], ARGV[6], ARGV[7], 'running')
elseif ARGV[8] == '1' then
    store_status(KEYS[4], KEYS[5], KEYS[6], ARGV[5], ARGV[6], ARGV[7], 'queued')
end
if not got then return false end
return {read(KEYS[2], KEYS[3], ARGV[3], ARGV[4])}
"""
)
"""`_LOCK_READ` that also stores the run's status record (`contracts.LockedStatus`, with
`control.STORE_STATUS`): `running` once the lock is taken, `queued` (when `ARGV[8]` is `1`)
when it is another run's."""
# KEYS: lock, meta, messages, run hash, conversation's runs in flight, its every run.
# ARGV: token, ttl (ms), after, limit, the run's fields (JSON), keep seconds, run id, queue.

_CLAIM_LOCK_READ_RUN = (
    _READ_FUNCTION
    + STORE_STATUS
    + """
local before = redis.call('SET', KEYS[7], ARGV[9], 'NX', 'GET')
if before and before ~= ARGV[9] then return {0, before} end
redis.call('ZADD', KEYS[8], ARGV[10], ARGV[11])
if redis.call('EXISTS', KEYS[11]) == 0 then
    redis.call('ZADD', KEYS[10], ARGV[10], ARGV[13])
end
if not before and ARGV[12] ~= '' then
    redis.call('HSET', KEYS[9], ARGV[11], ARGV[12])
end
local got = false
if ARGV[14] == '1' then
    got = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
end
if ARGV[5] ~= '' then
    if got then
        store_status(KEYS[4], KEYS[5], KEYS[6], ARGV[5], ARGV[6], ARGV[7], 'running')
    elseif ARGV[8] == '1' then
        store_status(KEYS[4], KEYS[5], KEYS[6], ARGV[5], ARGV[6], ARGV[7], 'queued')
    end
end
if not got then return {0, ARGV[9]} end
return {1, ARGV[9], read(KEYS[2], KEYS[3], ARGV[3], ARGV[4])}
"""
)
"""`_LOCK_READ_RUN` that first claims the conversation for the prompt's user as the owners'
`_CLAIM` does (`contracts.LockedClaim`): `{0, owner}` for a conversation another user owns
(nothing else happens); else `{locked, owner[, read]}`. The run's status is stored only when
its fields are given (`ARGV[5]`), the lock tried only when `ARGV[14]` is `1`."""
# KEYS: lock, meta, messages, run hash, conversation's runs in flight, its every run (the lock
# key three times when no status rides), owner, the user's list, their titles, every
# conversation by last prompt (a derived conversation, which has a parent key, stays out of it:
# retention deletes it with its parent), the conversation's parent.
# ARGV: token, ttl (ms), after, limit, the run's fields (JSON, '' for none), keep seconds, run
# id, queue, user, now, conversation id, title, the conversation's member, try the lock.

_SAVE_SUMMARY = """
if not redis.call('HGET', KEYS[1], 'last') then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'summary_seq') or '0') >= tonumber(ARGV[3]) then
    return 0
end
redis.call('HSET', KEYS[1], 'summary', ARGV[1], 'covered', ARGV[2], 'summary_seq', ARGV[3])
return 1
"""

_CLOSE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'closed', 1)
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""
# KEYS: meta, open zset. ARGV: digest.

_MARK = """
if not redis.call('HGET', KEYS[1], 'last') then return 0 end
local done = tonumber(redis.call('HGET', KEYS[1], 'extracted') or '0')
if tonumber(ARGV[1]) > done then redis.call('HSET', KEYS[1], 'extracted', ARGV[1]) end
redis.call('DEL', KEYS[2])
return 1
"""

_EVICT = """
local cap, now, min_idle, batch = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]),
    tonumber(ARGV[5])
local count = redis.call('ZCARD', KEYS[1])
local target = cap - math.floor(cap / 8)
local removed, offset = 0, 0
while count > target do
    local rows = redis.call('ZRANGE', KEYS[1], offset, offset + batch - 1, 'WITHSCORES')
    if #rows == 0 then break end
    for i = 1, #rows, 2 do
        if count <= target then break end
        local name = rows[i]
        if tonumber(rows[i + 1]) > now - min_idle then return removed end
        local base = ARGV[1] .. name
        local lock = redis.call('HGET', base, 'lock')
        if lock and redis.call('EXISTS', lock) == 1 then
            offset = offset + 1
        else
            redis.call('DEL', base, base .. ':m', base .. ':x')
            redis.call('ZREM', KEYS[1], name)
            redis.call('ZREM', KEYS[2], name)
            count = count - 1
            removed = removed + 1
        end
    end
end
return removed
"""
# KEYS: all zset, open zset. ARGV: key base prefix, cap, now, min idle, batch.


class Turn(NamedTuple):
    """One turn to store: `APPEND_FUNCTION`'s keys and arguments (its write key included, so
    the same turn sent twice is stored once), and when it was made."""

    keys: list[str]
    args: list[Any]
    now: float


class RedisHistory:
    """A `memory.history.HistoryBackend` in Redis (see the module docstring)."""

    durable = True
    locked_reads = True
    """A run's first read can ride on the lock's round trip (`lock_and_read`)."""

    def __init__(
        self,
        connection: RedisConnection,
        *,
        max_messages: int = MAX_MESSAGES,
        max_conversations: int = MAX_CONVERSATIONS,
        min_idle: float = MIN_IDLE,
    ) -> None:
        if min(max_messages, max_conversations) <= 0 or min_idle < 0:
            raise ValueError("history bounds must be positive")
        self.connection = connection
        self.max_messages = max_messages
        self.max_conversations = max_conversations
        self.min_idle = min_idle
        self._append = connection.script(_APPEND)
        self._read = connection.script(_READ)
        self._lock_read = connection.script(_LOCK_READ)
        self._lock_read_run = connection.script(_LOCK_READ_RUN)
        self._claim_lock_read_run = connection.script(_CLAIM_LOCK_READ_RUN)
        self._save_summary = connection.script(_SAVE_SUMMARY)
        self._close = connection.script(_CLOSE)
        self._mark = connection.script(_MARK)
        self._evict = connection.script(_EVICT)

    def __repr__(self) -> str:
        return f"RedisHistory({self.connection!r})"

    # --- keys ---------------------------------------------------------------------------------

    @staticmethod
    def _name(key: ConversationKey) -> str:
        return digest(key.endpoint, key.user_key, key.conversation_id)

    def _meta(self, key: ConversationKey) -> str:
        return self.connection.key("h", self._name(key))

    def _messages(self, key: ConversationKey) -> str:
        return self._meta(key) + ":m"

    def _claim(self, key: ConversationKey) -> str:
        return self._meta(key) + ":x"

    @property
    def _open(self) -> str:
        return self.connection.key("history", "open")

    @property
    def _all(self) -> str:
        return self.connection.key("history", "all")

    # --- the protocol -------------------------------------------------------------------------

    async def append(self, key: ConversationKey, messages: Sequence[Message]) -> None:
        if not messages:
            return
        await self.store_turn(self.turn(key, messages))

    def turn(self, key: ConversationKey, messages: Sequence[Message]) -> Turn:
        """`messages` as `APPEND_FUNCTION` takes them, with the turn's own write key."""
        now = time.time()
        return Turn(
            [self._meta(key), self._messages(key), self._open, self._all],
            [
                repr(now),
                key.endpoint,
                key.user_key,
                key.conversation_id,
                lock_key(self.connection, key.endpoint, key.conversation_id),
                self._name(key),
                self.max_messages,
                uuid.uuid4().hex,
                *[codec.encode_text(message) for message in messages],
            ],
            now,
        )

    async def store_turn(self, turn: Turn) -> None:
        """Store `turn` (`_APPEND`; a turn the conversation already holds is stored once), and
        make room past the conversation cap."""
        with self.connection.unavailable("storing the conversation's turn"):
            _last, count = await self._append(keys=turn.keys, args=turn.args)
            await self.stored(turn, int(count))

    async def stored(self, turn: Turn, conversations: int) -> None:
        """A turn was stored and the app now keeps `conversations`: past the cap, the least
        recently active ones nobody uses are deleted (`_EVICT`)."""
        if conversations > self.max_conversations:
            await self._make_room(turn.now)

    async def _make_room(self, now: float) -> None:
        removed = await self._evict(
            keys=[self._all, self._open],
            args=[
                self.connection.key("h", ""),
                self.max_conversations,
                repr(now),
                self.min_idle,
                EVICT_BATCH,
            ],
        )
        if int(removed):
            log.warning(
                "conversation cap reached; deleted the least recently active conversations "
                "no replica is using",
                evicted=int(removed),
                cap=self.max_conversations,
            )

    async def _range(
        self, key: ConversationKey, after: str, limit: int
    ) -> tuple[Summary | None, list[tuple[int, Message]], int]:
        if limit <= 0:
            return None, [], 0
        with self.connection.unavailable("reading the conversation's history"):
            found: Any = await self._read(
                keys=[self._meta(key), self._messages(key)], args=[after, limit]
            )
        return self._decode_range(found)

    @staticmethod
    def _decode_range(found: Any) -> tuple[Summary | None, list[tuple[int, Message]], int]:
        """`_READ`'s reply as (summary, [(seq, message), ...] oldest first, last seq)."""
        if not found:
            return None, [], 0
        summary_text, covered, first, last, items = found
        summary = (
            Summary(str(as_str(summary_text)), int(covered)) if summary_text is not None else None
        )
        decoded = [
            (int(first) + offset, codec.decode_plain(str(item).encode()))
            for offset, item in enumerate(items)
        ]
        return summary, decoded, int(last)

    async def lock_and_read(
        self, lock: str, token: bytes, ttl_ms: int, read: HistoryRead, status: bool = False
    ) -> bool:
        """Take lock key `lock` with `token` for `ttl_ms` if it is free and, if so, make `read`
        (`HistoryRead.deliver`) in the same script; whether the lock was taken. With `status`,
        the same script stores the run's status offered with the read (`read.status`, a
        `contracts.LockedStatus` of this Redis's `RedisRunRegistry`) and notes it stored.

        `RedisConversationLocks` calls it for each try of a lock whose run offered its first
        read; connection failures are the caller's to report."""
        key = read.key
        after = "summary" if read.after_seq is None else str(read.after_seq)
        keys: list[Any] = [lock, self._meta(key), self._messages(key)]
        args: list[Any] = [token, ttl_ms, after, read.limit]
        offered = read.status if status else None
        if offered is None:
            found: Any = await self._lock_read(keys=keys, args=args)
        else:
            queue = offered.stored is None
            more_keys, more_args = status_keys_args(self.connection, offered.record("running"))
            found = await self._lock_read_run(
                keys=keys + more_keys, args=[*args, *more_args, "1" if queue else "0"]
            )
            if found or queue:
                offered.stored = "running" if found else "queued"
        if not found:
            return False
        try:
            summary, items, _last = self._decode_range(found[0])
        except Exception as exc:
            # The lock is taken: raising would keep it from being released. The reader's own
            # read meets the same data under the lock, and its error ends the run properly.
            log.debug("history read with the lock not delivered", error=str(exc))
        else:
            read.deliver((summary, items))
        return True

    async def claim_lock_and_read(
        self,
        lock: str,
        token: bytes,
        ttl_ms: int,
        read: HistoryRead,
        claim: tuple[list[str], list[str]],
        *,
        status: bool = False,
        try_lock: bool = True,
    ) -> tuple[bool, str]:
        """`lock_and_read` that first claims the conversation (`claim`: the owners' keys and
        arguments, `RedisConversationOwners.claim_keys_args`) in the same script; (whether the
        lock was taken, the owner found). A conversation another user owns is not locked and
        nothing is stored; without `try_lock` the script claims (and stores `queued`) only."""
        key = read.key
        after = "summary" if read.after_seq is None else str(read.after_seq)
        keys: list[Any] = [lock, self._meta(key), self._messages(key)]
        args: list[Any] = [token, ttl_ms, after, read.limit]
        offered = read.status if status else None
        queue = offered is not None and offered.stored is None
        if offered is None:
            keys += [lock, lock, lock]
            args += ["", 0, "", "0"]
        else:
            more_keys, more_args = status_keys_args(self.connection, offered.record("running"))
            keys += more_keys
            args += [*more_args, "1" if queue else "0"]
        claim_keys, claim_args = claim
        found: Any = await self._claim_lock_read_run(
            keys=keys + claim_keys, args=[*args, *claim_args, "1" if try_lock else "0"]
        )
        got, owner = bool(int(found[0])), str(as_str(found[1]))
        if offered is not None and owner == claim_args[0] and (got or queue):
            offered.stored = "running" if got else "queued"
        if got:
            try:
                summary, items, _last = self._decode_range(found[2] if len(found) > 2 else None)
            except Exception as exc:
                # The lock is taken: raising would keep it from being released (as above).
                log.debug("history read with the lock not delivered", error=str(exc))
            else:
                read.deliver((summary, items))
        return got, owner

    async def tail(self, key: ConversationKey, limit: int) -> list[Message]:
        _summary, items, _last = await self._range(key, "0", limit)
        return [message for _seq, message in items]

    async def since_summary(
        self, key: ConversationKey, limit: int
    ) -> tuple[Summary | None, list[tuple[int, Message]]]:
        summary, items, _last = await self._range(key, "summary", limit)
        return summary, items

    async def save_summary(self, key: ConversationKey, summary: Summary, upto_seq: int) -> None:
        with self.connection.unavailable("saving the conversation's summary"):
            await self._save_summary(
                keys=[self._meta(key)], args=[summary.text, summary.covered, upto_seq]
            )

    async def messages(self, key: ConversationKey) -> list[Message]:
        _summary, items, _last = await self._range(key, "0", self.max_messages)
        return [message for _seq, message in items]

    async def clear(self, key: ConversationKey) -> None:
        client = self.connection.client
        name = self._name(key)
        with self.connection.unavailable("clearing the conversation"):
            async with client.pipeline(transaction=True) as pipe:
                pipe.delete(self._meta(key), self._messages(key), self._claim(key))
                pipe.zrem(self._open, name)
                pipe.zrem(self._all, name)
                await pipe.execute()

    async def close(self, key: ConversationKey) -> bool:
        with self.connection.unavailable("closing the conversation"):
            closed = await self._close(keys=[self._meta(key), self._open], args=[self._name(key)])
        return bool(int(closed))

    async def unextracted(self, key: ConversationKey, limit: int) -> tuple[list[Message], int]:
        client = self.connection.client
        with self.connection.unavailable("reading the conversation for extraction"):
            claimed = await client.set(self._claim(key), "1", nx=True, ex=EXTRACTION_CLAIM)
        _summary, items, last = await self._range(key, "extracted", limit)
        if not claimed:
            # Another replica (or an earlier close here) is extracting these messages now.
            return [], last
        if not items:
            with self.connection.unavailable("reading the conversation for extraction"):
                await client.delete(self._claim(key))
        return [message for _seq, message in items], last

    async def mark_extracted(self, key: ConversationKey, upto_seq: int) -> None:
        with self.connection.unavailable("recording the conversation's extraction"):
            await self._mark(keys=[self._meta(key), self._claim(key)], args=[upto_seq])

    async def idle(self, before: float, limit: int) -> list[ConversationKey]:
        if limit <= 0:
            return []
        client = self.connection.client
        with self.connection.unavailable("listing idle conversations"):
            names: list[str] = await client.zrangebyscore(  # type: ignore[assignment]
                self._open, "-inf", f"({before!r}", start=0, num=limit
            )
            async with client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hmget(self.connection.key("h", name), "endpoint", "user", "conversation")
                rows: list[list[str | None]] = await pipe.execute()
        found: list[ConversationKey] = []
        stale: list[str] = []
        for name, (endpoint, user, conversation) in zip(names, rows, strict=True):
            if endpoint is None or conversation is None:
                stale.append(name)  # deleted meanwhile; forget it
                continue
            found.append(ConversationKey(endpoint, user or None, conversation))
        if stale:
            with self.connection.unavailable("listing idle conversations"):
                await client.zrem(self._open, *stale)
        return found

    async def aclose(self) -> None:
        return None
