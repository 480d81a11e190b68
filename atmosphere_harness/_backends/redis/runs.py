"""`RedisRunStore`: durable runs journalled in Redis, so any replica can resume them.

Keys (under the app's prefix):

- `run:{id}` a hash: the run's record (path, conversation, user, session, message, start),
  its `owner`, and `finished` (epoch seconds) once it ended;
- `run:{id}:frames` a sorted set scored by seq (member `seq US event US data`, US = `\\x1f`,
  which JSON text never holds raw), and `run:{id}:checkpoints` a hash key -> value;
- `runs:leases` a sorted set of every unfinished run by lease deadline, `runs:owner:{owner}`
  the runs an owner holds (for `heartbeat` / `release`), `runs:conversation:{digest}` a
  conversation's runs by start (for `latest`), `runs:compact` / `runs:finished` finished runs
  by finish time (frames to drop after the grace period; records to drop in `expire`).

What makes it a multi-replica store, as `PostgresRunStore`:

- Every lease is measured with the Redis server's clock (`TIME` inside the scripts), never a
  replica's, so two hosts whose clocks disagree still agree on when a lease ran out.
- `claim` is one script over `runs:leases`: Redis runs scripts one at a time, so two replicas
  claiming at once never get one run.
- `append` is one script: with an `owner`, it checks the run's owner and writes the frames and
  checkpoints only while that owner still holds the run, else raises `LeaseLost`.
- Only the lease decides a dead owner (replicas may be containers sharing a pid), so a replica
  restarted in place resumes its runs once their lease ran out; a graceful stop `release`s.
- It is a `contracts.RunFeed`; `finish` marks the run finished at once and `expire` drops its
  frames and checkpoints `FOLLOW_GRACE_SECONDS` later, so readers elsewhere see the last frames.
- It is also the frame feed (durable runs off): runs owned as `FEED_OWNER`... are never
  claimed, their appends are refused once the run is finished, an append whose last frame is
  terminal is pipelined with `finish` (one round trip for both), and `abandon` ends those whose
  replica died (lease run out) with a terminal `error` frame. Between a feed run's first write
  and its end, its frames go in `append_feeds` (every run of a replica in one script), which
  costs each run one `HMGET`, one `ZADD` of all its frames and one `PUBLISH`.
- Each append of frames also `PUBLISH`es `'{seq} {run_id}'` on the run's own channel,
  `runs:frames:{run_id}`, from its script (no round trip of its own; the frames are written
  when it is sent). A replica with readers following runs from here (`watch`) subscribes to
  those runs' channels, while it has readers of them, on one pub/sub connection and wakes them
  at once instead of at their next poll; a replica without readers receives nothing.
- Every key also has a TTL (`SAFETY_TTL`, refreshed by heartbeats and by `append`, not by the
  frame feed's batches; shorter once a run finished), so nothing outlives a Redis whose
  replicas all went away.

Needs a standalone Redis 7 or later (scripts touch keys they compute, as the other parts do).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..._contracts import FEED_OWNER, AskListener, StoredRun
from ..._errors import LeaseLost
from ..._events import TERMINAL, Frame
from ..._kernel.remote import RunWatchers, ask_payload, deliver_ask
from ..._log import get_logger
from .connection import RedisConnection, as_str, digest, listen, listening

log = get_logger(__name__)

FOLLOW_GRACE_SECONDS = 30.0
"""How long a finished run's frames stay for readers on other replicas to catch up."""
SAFETY_TTL = 7 * 24 * 3600
"""Seconds a run's keys outlive its last write or heartbeat (nothing is left forever)."""
FINISHED_TTL = 24 * 3600
"""Seconds a finished run's record outlives its finish even if `expire` never ran."""
CLAIM_SCAN = 200
"""Expired leases looked at per claim beyond `limit` (the caller's own are skipped)."""
EXPIRE_BATCH = 1000
"""Finished runs compacted or dropped per `expire` call (the journal calls it often)."""
LATEST_SCAN = 200
"""A conversation's newest runs `latest` looks at."""
SEP = "\x1f"

_LIB = (
    """
local function now()
    local t = redis.call('TIME')
    return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function runkey(prefix, id) return prefix .. 'run:' .. id end
"""
    # A frame-feed run's owner (never claimed; its appends end with the run).
    + f"local function feed(owner) return string.sub(owner, 1, {len(FEED_OWNER)}) == "
    + f"'{FEED_OWNER}' end\n"
)

_APPEND = (
    _LIB
    + """
local prefix, id, creating, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lease, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local nframes, nchecks = tonumber(ARGV[7]), tonumber(ARGV[8])
local i = 9
if creating == '1' then
    if redis.call('EXISTS', KEYS[1]) == 0 then
        redis.call('HSET', KEYS[1], 'run_id', id, 'path', ARGV[i], 'conversation', ARGV[i + 1],
            'user', ARGV[i + 2], 'session', ARGV[i + 3], 'message', ARGV[i + 4],
            'started', ARGV[i + 5], 'conversation_key', KEYS[4], 'owner', owner)
        redis.call('ZADD', KEYS[3], now() + lease, id)
        if owner ~= '' then
            local held = prefix .. 'runs:owner:' .. owner
            redis.call('SADD', held, id)
            redis.call('EXPIRE', held, ttl)
        end
        redis.call('ZADD', KEYS[4], tonumber(ARGV[i + 5]), id)
        redis.call('EXPIRE', KEYS[4], ttl)
        if nframes == 0 and feed(owner) then redis.call('HSET', KEYS[1], 'bare', '1') end
    end
    i = i + 6
else
    local current = redis.call('HGET', KEYS[1], 'owner')
    if not current then return {'missing'} end
    if owner ~= '' and current ~= owner then return {'lost', current} end
    if feed(owner) and redis.call('HEXISTS', KEYS[1], 'finished') == 1 then
        return {'ended'}
    end
end
local last
for n = 1, nframes do
    local seq = ARGV[i]
    redis.call('ZREMRANGEBYSCORE', KEYS[2], seq, seq)
    redis.call('ZADD', KEYS[2], seq, ARGV[i + 1])
    last = seq
    i = i + 2
end
if nframes > 0 then
    redis.call('EXPIRE', KEYS[2], ttl)
    redis.call('PUBLISH', prefix .. 'runs:frames:' .. id, last .. ' ' .. id)
end
for n = 1, nchecks do
    redis.call('HSET', KEYS[5], ARGV[i], ARGV[i + 1])
    i = i + 2
end
if nchecks > 0 then redis.call('EXPIRE', KEYS[5], ttl) end
redis.call('EXPIRE', KEYS[1], ttl)
return {'ok'}
"""
)
# KEYS: run hash, frames, leases, conversation zset, checkpoints.
# ARGV: prefix, id, creating, owner, lease, ttl, #frames, #checkpoints, [record: path,
#       conversation, user, session, message, started], frames (seq, member)..., checkpoints.

_APPEND_FEEDS = (
    _LIB
    + """
local prefix, owner, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local i = 5
local refused = {}
for r = 1, tonumber(ARGV[4]) do
    local id, nframes = ARGV[i], tonumber(ARGV[i + 1])
    i = i + 2
    local stop = i + 2 * nframes - 1
    local key = runkey(prefix, id)
    local run = redis.call('HMGET', key, 'owner', 'finished', 'bare')
    local why = false
    if not run[1] then
        why = 'missing'
    elseif run[1] ~= owner or run[2] then
        why = 'ended'
    end
    if why then
        refused[#refused + 1] = id
        refused[#refused + 1] = why
    else
        local frames = key .. ':frames'
        for first = i, stop, 1000 do
            redis.call('ZADD', frames, unpack(ARGV, first, math.min(first + 999, stop)))
        end
        if run[3] then
            redis.call('EXPIRE', frames, ttl)
            redis.call('HDEL', key, 'bare')
        end
        redis.call('PUBLISH', prefix .. 'runs:frames:' .. id, ARGV[stop - 1] .. ' ' .. id)
    end
    i = stop + 1
end
return refused
"""
)
# No KEYS (each run's keys follow from its id). ARGV: prefix, owner, ttl, #runs, then per run:
#   id, #frames (at least one), frames (seq, member)... Returns the refused runs: id, why
#   (`ended`, `missing`). A frame-feed run's seqs are each written once (its writer never sends
#   one again), so a plain `ZADD` of all of them stands for `append`'s replace-then-add, and its
#   keys keep the TTL its first write gave them (moved by `heartbeat`): only a run first written
#   without frames (`bare`: its frames key did not exist yet) has its frames' TTL set here.
#   `ZADD` takes the frames 500 at a time (`unpack` of a whole burst could overflow Lua's stack).

_CLAIM = (
    _LIB
    + """
local prefix, owner, lease, limit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local t = now()
local candidates = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. t, 'LIMIT', 0,
    limit + tonumber(ARGV[6]))
local taken = {}
local held = prefix .. 'runs:owner:' .. owner
for _, id in ipairs(candidates) do
    if #taken >= limit then break end
    local key = runkey(prefix, id)
    local run = redis.call('HMGET', key, 'owner', 'finished')
    if not run[1] or run[2] then
        redis.call('ZREM', KEYS[1], id)  -- gone or finished: no lease to give
    elseif run[1] ~= owner and not feed(run[1]) then
        if run[1] ~= '' then redis.call('SREM', prefix .. 'runs:owner:' .. run[1], id) end
        redis.call('HSET', key, 'owner', owner)
        redis.call('EXPIRE', key, ttl)
        redis.call('ZADD', KEYS[1], t + lease, id)
        redis.call('SADD', held, id)
        taken[#taken + 1] = redis.call('HMGET', key, 'run_id', 'path', 'conversation', 'user',
            'session', 'message', 'started')
    end
end
if #taken > 0 then redis.call('EXPIRE', held, ttl) end
return taken
"""
)
# KEYS: leases. ARGV: prefix, owner, lease, limit, ttl, extra scan.

_HEARTBEAT = (
    _LIB
    + """
local prefix, owner, lease, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local t = now()
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    local key = runkey(prefix, id)
    local run = redis.call('HMGET', key, 'owner', 'finished')
    if run[1] == owner and not run[2] then
        redis.call('ZADD', KEYS[2], 'XX', t + lease, id)
        redis.call('EXPIRE', key, ttl)
        redis.call('EXPIRE', key .. ':frames', ttl)
        redis.call('EXPIRE', key .. ':checkpoints', ttl)
    else
        redis.call('SREM', KEYS[1], id)
    end
end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('EXPIRE', KEYS[1], ttl) end
return 0
"""
)
# KEYS: owner set, leases. ARGV: prefix, owner, lease, ttl.

_RELEASE = (
    _LIB
    + """
local prefix, owner = ARGV[1], ARGV[2]
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    if redis.call('HGET', runkey(prefix, id), 'owner') == owner then
        redis.call('ZADD', KEYS[2], 'XX', 0, id)
    end
end
return 0
"""
)
# KEYS: owner set, leases. ARGV: prefix, owner.

_FINISH = (
    _LIB
    + """
local prefix, id, at = ARGV[1], ARGV[2], tonumber(ARGV[3])
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then return 0 end
redis.call('HSET', KEYS[1], 'finished', ARGV[3], 'message', '')
redis.call('ZREM', KEYS[2], id)
if owner ~= '' then redis.call('SREM', prefix .. 'runs:owner:' .. owner, id) end
redis.call('ZADD', KEYS[3], at, id)
redis.call('ZADD', KEYS[4], at, id)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
redis.call('EXPIRE', KEYS[1] .. ':frames', tonumber(ARGV[5]))
redis.call('EXPIRE', KEYS[1] .. ':checkpoints', tonumber(ARGV[5]))
return 1
"""
)
# KEYS: run hash, leases, compact zset, finished zset.
# ARGV: prefix, id, finished at, record ttl, frames ttl.

_EXPIRE = (
    _LIB
    + """
local prefix, batch = ARGV[1], tonumber(ARGV[4])
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2],
        'LIMIT', 0, batch)) do
    local key = runkey(prefix, id)
    redis.call('DEL', key .. ':frames', key .. ':checkpoints')
    redis.call('ZREM', KEYS[1], id)
end
local dropped = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[3],
        'LIMIT', 0, batch)) do
    local key = runkey(prefix, id)
    local conversation = redis.call('HGET', key, 'conversation_key')
    if conversation then
        redis.call('ZREM', conversation, id)
        dropped = dropped + 1
    end
    redis.call('DEL', key, key .. ':frames', key .. ':checkpoints')
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
end
return dropped
"""
)
# KEYS: compact zset, finished zset. ARGV: prefix, compact before, drop before, batch.

_FORGET = (
    _LIB
    + """
local prefix = ARGV[1]
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    local key = runkey(prefix, id)
    local finished = redis.call('HGET', key, 'finished')
    if finished or redis.call('EXISTS', key) == 0 then
        redis.call('DEL', key, key .. ':frames', key .. ':checkpoints')
        redis.call('ZREM', KEYS[1], id)
        redis.call('ZREM', KEYS[2], id)
        redis.call('ZREM', KEYS[3], id)
    end
end
return 1
"""
)
# KEYS: the conversation's runs, compact zset, finished zset. ARGV: prefix.

_ABANDON = (
    _LIB
    + """
local prefix, message, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local at, ttl, frames_ttl = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local t = now()
local ended = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. t, 'LIMIT', 0,
        limit + tonumber(ARGV[7]))) do
    if ended >= limit then break end
    local key = runkey(prefix, id)
    local run = redis.call('HMGET', key, 'owner', 'finished')
    if not run[1] or run[2] then
        redis.call('ZREM', KEYS[1], id)
    elseif feed(run[1]) then
        local last = redis.call('ZRANGE', key .. ':frames', -1, -1, 'WITHSCORES')
        local seq = 1
        if #last > 0 then seq = tonumber(last[2]) + 1 end
        redis.call('ZADD', key .. ':frames', seq, seq .. '\\31error\\31' .. message)
        redis.call('HSET', key, 'finished', at, 'message', '')
        redis.call('ZREM', KEYS[1], id)
        redis.call('SREM', prefix .. 'runs:owner:' .. run[1], id)
        redis.call('ZADD', KEYS[2], tonumber(at), id)
        redis.call('ZADD', KEYS[3], tonumber(at), id)
        redis.call('EXPIRE', key, ttl)
        redis.call('EXPIRE', key .. ':frames', frames_ttl)
        ended = ended + 1
    end
end
return ended
"""
)
# KEYS: leases, compact zset, finished zset.
# ARGV: prefix, error data (JSON), limit, finished at, record ttl, frames ttl, extra scan.

_RECORD = ("run_id", "path", "conversation", "user", "session", "message", "started")


def _stored(fields: Sequence[Any]) -> StoredRun:
    run_id, path, conversation, user, session, message, started = (
        as_str(value) or "" for value in fields
    )
    return StoredRun(
        run_id=run_id,
        path=path,
        conversation_id=conversation,
        user_id=user or None,
        session_id=session,
        message=message,
        started_at=float(started or 0.0),
    )


def _frame(member: str, session_id: str, conversation_id: str) -> Frame:
    seq, event, data = member.split(SEP, 2)
    return Frame(event, json.loads(data), session_id, conversation_id, int(seq))


class RedisRunStore:
    """A `contracts.RunStore` and `contracts.RunFeed` on the shared Redis (module docstring).

    The connection is the backend's resource (opened by the host before the journal), so
    `open` and `aclose` have nothing of their own to do.
    """

    name = "redis"

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self._append = connection.script(_APPEND)
        self._append_feeds = connection.script(_APPEND_FEEDS)
        self._claim = connection.script(_CLAIM)
        self._heartbeat = connection.script(_HEARTBEAT)
        self._release = connection.script(_RELEASE)
        self._finish = connection.script(_FINISH)
        self._expire = connection.script(_EXPIRE)
        self._abandon = connection.script(_ABANDON)
        self._forget = connection.script(_FORGET)
        self._watchers = RunWatchers(self._subscribe, self._unsubscribe)
        self._listener: asyncio.Task[None] | None = None
        self._pubsub: Any = None
        """The listening connection's pub/sub while it is up (`_listen`)."""
        self._asks: asyncio.Task[None] | None = None
        """The listener of other replicas' asks (`hear_asks`)."""
        connection.on_close(self._stop_listening)

    def __repr__(self) -> str:
        return f"RedisRunStore({self.connection!r})"

    async def open(self) -> None:
        """Nothing to open: the shared `RedisConnection` is."""

    async def aclose(self) -> None:
        """Nothing to close: the shared `RedisConnection` closes with the other resources."""

    # --- keys -----------------------------------------------------------------------------

    def _run(self, run_id: str) -> str:
        return self.connection.key("run", run_id)

    def _leases(self) -> str:
        return self.connection.key("runs", "leases")

    def _owner(self, owner: str) -> str:
        return self.connection.key("runs", "owner", owner)

    def _conversation(self, path: str, conversation_id: str) -> str:
        return self.connection.key("runs", "conversation", digest(path, conversation_id))

    # --- contracts.RunStore ---------------------------------------------------------------

    async def append(
        self,
        run_id: str,
        frames: Sequence[tuple[int, str, str]],
        checkpoints: Sequence[tuple[str, str]],
        *,
        create: StoredRun | None = None,
        owner: str | None = None,
        lease_seconds: float = 0.0,
    ) -> None:
        run = self._run(run_id)
        conversation = (
            self._conversation(create.path, create.conversation_id) if create is not None else ""
        )
        args: list[Any] = [
            self.connection.prefix,
            run_id,
            "1" if create is not None else "0",
            owner or "",
            repr(float(lease_seconds)),
            SAFETY_TTL,
            len(frames),
            len(checkpoints),
        ]
        if create is not None:
            args += [
                create.path,
                create.conversation_id,
                create.user_id or "",
                create.session_id,
                create.message,
                repr(float(create.started_at)),
            ]
        for seq, event, data in frames:
            args += [seq, f"{seq}{SEP}{event}{SEP}{data}"]
        for key, value in checkpoints:
            args += [key, value]
        keys = [run, run + ":frames", self._leases(), conversation, run + ":checkpoints"]
        if owner and owner.startswith(FEED_OWNER) and frames and frames[-1][1] in TERMINAL:
            # The frame feed's end: the run finishes with its terminal frame, one round trip.
            with self.connection.unavailable("sharing a run's frames"):
                reply = await self._append_and_finish(run_id, keys, args)
        else:
            with self.connection.unavailable("journalling a durable run"):
                reply = await self._append(keys=keys, args=args)
        status = as_str(reply[0])
        if status == "missing":
            raise LookupError(f"durable run {run_id} is not in the store")
        if status == "ended":
            raise LeaseLost(f"shared run {run_id} was ended: {owner} went silent")
        if status == "lost":
            raise LeaseLost(
                f"durable run {run_id} was taken over by {as_str(reply[1])}: "
                f"{owner} no longer writes its journal"
            )

    async def append_feeds(
        self, owner: str, runs: Sequence[tuple[str, Sequence[tuple[int, str, str]]]]
    ) -> dict[str, str]:
        """`kernel.feed.FeedBatches`: frames of several frame-feed runs in one script, each
        run's written as its `append` would (refused once it is finished or not `owner`'s)."""
        args: list[Any] = [self.connection.prefix, owner, SAFETY_TTL, 0]
        count = 0
        for run_id, frames in runs:
            if not frames:
                continue
            count += 1
            args += [run_id, len(frames)]
            for seq, event, data in frames:
                args += [seq, f"{seq}{SEP}{event}{SEP}{data}"]
        if not count:
            return {}
        args[3] = count
        with self.connection.unavailable("sharing runs' frames"):
            reply = await self._append_feeds(keys=[], args=args)
        items = [as_str(item) or "" for item in reply]
        return dict(zip(items[::2], items[1::2], strict=True))

    async def _append_and_finish(self, run_id: str, keys: list[str], args: list[Any]) -> Any:
        """`_APPEND` then `_FINISH` in one round trip (`RedisConnection.scripts`)."""
        finish_keys = self._finish_keys(run_id)
        reply, finished = await self.connection.scripts(
            (self._append, keys, args), (self._finish, finish_keys, self._finish_args(run_id))
        )
        for answer in (reply, finished):
            if isinstance(answer, Exception):
                raise answer
        return reply

    async def load(self, run_id: str, limit: int) -> tuple[dict[str, Any], list[Frame]]:
        run = self._run(run_id)
        with self.connection.unavailable("loading a durable run"):
            async with self.connection.client.pipeline(transaction=True) as pipe:
                pipe.hmget(run, "session", "conversation")
                pipe.hgetall(run + ":checkpoints")
                # ZREVRANGE 1 0 is empty (0 -1 would be every frame).
                pipe.zrevrange(run + ":frames", 0 if limit > 0 else 1, limit - 1)
                record, checkpoints, members = await pipe.execute()
        session, conversation = (as_str(value) for value in record)
        if session is None:
            return {}, []
        frames = [_frame(member, session, conversation or "") for member in reversed(members)]
        return {key: json.loads(value) for key, value in checkpoints.items()}, frames

    async def claim(self, owner: str, lease_seconds: float, limit: int) -> list[StoredRun]:
        if limit <= 0:
            return []
        with self.connection.unavailable("claiming durable runs"):
            rows = await self._claim(
                keys=[self._leases()],
                args=[
                    self.connection.prefix,
                    owner,
                    repr(float(lease_seconds)),
                    limit,
                    SAFETY_TTL,
                    CLAIM_SCAN,
                ],
            )
        return sorted((_stored(row) for row in rows), key=lambda run: run.started_at)

    async def heartbeat(self, owner: str, lease_seconds: float) -> None:
        with self.connection.unavailable("extending durable run leases"):
            await self._heartbeat(
                keys=[self._owner(owner), self._leases()],
                args=[self.connection.prefix, owner, repr(float(lease_seconds)), SAFETY_TTL],
            )

    async def release(self, owner: str) -> None:
        with self.connection.unavailable("releasing durable runs"):
            await self._release(
                keys=[self._owner(owner), self._leases()],
                args=[self.connection.prefix, owner],
            )

    async def finish(self, run_id: str) -> None:
        """Mark the run finished; its frames and checkpoints go in `expire`, once
        `FOLLOW_GRACE_SECONDS` have passed (readers on other replicas catch up meanwhile)."""
        with self.connection.unavailable("finishing a durable run"):
            await self._finish(keys=self._finish_keys(run_id), args=self._finish_args(run_id))

    def _finish_keys(self, run_id: str) -> list[str]:
        return [
            self._run(run_id),
            self._leases(),
            self.connection.key("runs", "compact"),
            self.connection.key("runs", "finished"),
        ]

    def _finish_args(self, run_id: str) -> list[Any]:
        return [
            self.connection.prefix,
            run_id,
            repr(time.time()),
            FINISHED_TTL,
            int(FOLLOW_GRACE_SECONDS * 4),
        ]

    async def forget(self, path: str, conversation_id: str) -> None:
        """Drop the conversation's finished runs: records, frames and checkpoints."""
        with self.connection.unavailable("deleting a conversation's runs"):
            await self._forget(
                keys=[
                    self._conversation(path, conversation_id),
                    self.connection.key("runs", "compact"),
                    self.connection.key("runs", "finished"),
                ],
                args=[self.connection.prefix],
            )

    async def expire(self, before: float) -> int:
        with self.connection.unavailable("expiring durable runs"):
            dropped = await self._expire(
                keys=[
                    self.connection.key("runs", "compact"),
                    self.connection.key("runs", "finished"),
                ],
                args=[
                    self.connection.prefix,
                    repr(time.time() - FOLLOW_GRACE_SECONDS),
                    repr(float(before)),
                    EXPIRE_BATCH,
                ],
            )
        return int(dropped)

    # --- contracts.RunFeed: following a run another replica executes ----------------------

    async def latest(
        self, path: str, conversation_id: str, *, session_id: str | None = None
    ) -> tuple[StoredRun, bool] | None:
        client = self.connection.client
        with self.connection.unavailable("finding a durable run"):
            ids = await client.zrevrange(
                self._conversation(path, conversation_id), 0, LATEST_SCAN - 1
            )
            async with client.pipeline(transaction=False) as pipe:
                for run_id in ids:
                    pipe.hmget(self._run(as_str(run_id) or ""), *_RECORD, "finished")
                rows = await pipe.execute() if ids else []
        runs = [(_stored(row[:-1]), row[-1] is not None) for row in rows if row[0] is not None]
        if session_id is not None:
            for run, finished in runs:
                if run.session_id == session_id:
                    return run, finished
        unfinished = [entry for entry in runs if not entry[1]]
        if unfinished:
            return min(unfinished, key=lambda entry: entry[0].started_at)
        if runs:
            return max(runs, key=lambda entry: entry[0].started_at)
        return None

    def watch(self, run_id: str, wake: Callable[[int], None]) -> Callable[[], None]:
        """Wake a reader of `run_id` when any replica stored new frames of it (pub/sub on the
        run's channel, which this replica subscribes to while it has a reader of the run; the
        listening connection opens with the first reader)."""
        unwatch = self._watchers.watch(run_id, wake)
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(), name="redis-run-frames"
            )
        return unwatch

    def _channel(self, run_id: str) -> str:
        return self.connection.key("runs", "frames", run_id)

    async def _listen(self) -> None:
        """Hand the frame notices of the runs read here to their readers. Each subscription,
        once Redis confirms it, wakes that run's readers (what was published before was not
        heard: they read it); a new connection subscribes again to every run read here."""
        channels = self.connection.key("runs", "frames", "")

        async def subscribed(_reconnected: bool) -> None:
            self._watchers.lost()
            self._watchers.sync()

        def confirmed(channel: str) -> None:
            if channel.startswith(channels):
                self._watchers.subscribed_to(channel[len(channels) :])

        await listen(
            self.connection,
            None,
            self._watchers.notified,
            lost="run frame listener lost Redis; remote readers poll meanwhile",
            subscribed=subscribed,
            on_pubsub=self._on_pubsub,
            confirmed=confirmed,
        )

    def _on_pubsub(self, pubsub: Any) -> None:
        self._pubsub = pubsub

    async def _subscribe(self, runs: list[str]) -> None:
        pubsub = self._pubsub
        if pubsub is not None:  # else its connection subscribes them all once it is up
            await pubsub.subscribe(*(self._channel(run_id) for run_id in runs))

    async def _unsubscribe(self, runs: list[str]) -> None:
        pubsub = self._pubsub
        if pubsub is not None:
            await pubsub.unsubscribe(*(self._channel(run_id) for run_id in runs))

    async def _stop_listening(self) -> None:
        await self._watchers.aclose()
        for listener in (self._listener, self._asks):
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener
        self._listener = self._asks = None

    async def frames_after(self, run_id: str, after: int, limit: int) -> tuple[list[Frame], bool]:
        run = self._run(run_id)
        with self.connection.unavailable("reading a durable run"):
            async with self.connection.client.pipeline(transaction=True) as pipe:
                pipe.hmget(run, "session", "conversation", "finished")
                pipe.zrangebyscore(run + ":frames", f"({after}", "+inf", start=0, num=limit)
                record, members = await pipe.execute()
        session, conversation, finished = (as_str(value) for value in record)
        if session is None:
            return [], True  # expired: nothing more will come
        return (
            [_frame(member, session, conversation or "") for member in members],
            finished is not None,
        )

    async def ask(self, path: str, conversation_id: str, session_id: str | None) -> None:
        with self.connection.unavailable("asking for a run"):
            await self.connection.client.publish(
                self._asks_channel, ask_payload(path, conversation_id, session_id)
            )

    @property
    def _asks_channel(self) -> str:
        return self.connection.key("runs", "asks")

    async def hear_asks(self, on_ask: AskListener) -> None:
        """Listen (one pub/sub connection of its own) until the connection closes; returns
        once Redis confirmed the subscription, or after 5 s (it goes on trying)."""
        if self._asks is not None:
            return
        self._asks = await listening(
            self.connection,
            self._asks_channel,
            lambda payload: deliver_ask(payload, on_ask),
            lost="run ask listener lost Redis; other replicas cannot follow runs here",
            name="redis-run-asks",
        )

    async def abandon(self, message: str, limit: int) -> int:
        """End the frame-feed runs whose replica died: a terminal `error` frame after the last
        stored one, and finished (their frames go after the grace period, as any run's)."""
        data = json.dumps({"message": message, "type": "ServerLost"}, separators=(",", ":"))
        with self.connection.unavailable("ending shared runs whose replica stopped"):
            ended = await self._abandon(
                keys=[
                    self._leases(),
                    self.connection.key("runs", "compact"),
                    self.connection.key("runs", "finished"),
                ],
                args=[
                    self.connection.prefix,
                    data,
                    limit,
                    repr(time.time()),
                    FINISHED_TTL,
                    int(FOLLOW_GRACE_SECONDS * 4),
                    CLAIM_SCAN,
                ],
            )
        return int(ended)
