"""`RedisApprovalStore`: approvals any replica can list and answer; the waiting run wakes.

Each pending approval is a hash `approval:{id}` (endpoint path, conversation, user, tool, call,
arguments, expiry, and the *replica* whose run waits), with a TTL a little past its expiry, so a
replica that dies leaves nothing behind for long. A conversation's pending ids are a set (for
`GET P/approvals`), and every pending id of the app sits in one sorted set by expiry, which
bounds how many wait at once (`max_pending`, app-wide, as in one process).

`answer` is one script: it checks the path, the user and the state, marks the approval answered
(a second answer gets 409 from any replica), remembers the id for a while, and `PUBLISH`es the
answer on the waiting replica's channel. That replica's listener (one pub/sub connection per
process) resolves the run's future. Pub/sub drops what is sent while a listener reconnects, so
the listener re-reads the state of every local approval after each (re)subscribe, and `wait`
looks at the hash once more before it reports a timeout: an answer accepted by Redis is never
lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Mapping
from typing import Any

from redis.exceptions import RedisError

from ..._cancel import reraise_cancellation
from ..._governance.approvals import MAX_PENDING, Answer, AnswerStatus, PendingApproval
from ..._log import get_logger
from .connection import RedisConnection, as_str, digest, listen

log = get_logger(__name__)

REMEMBER_ANSWERED = 3600
"""Seconds an answered id still answers 409 (not 404) to a second answer."""
GRACE = 60
"""Seconds an approval's keys outlive its expiry (clock skew between replicas)."""
RECHECK = 5.0
"""A waiting run also reads its approval's state this often (a missed wake-up costs this)."""

_OPEN = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[2], 'path', ARGV[5], 'conversation', ARGV[6], 'user', ARGV[7],
    'has_user', ARGV[8], 'tool', ARGV[9], 'call', ARGV[10], 'arguments', ARGV[11],
    'expires', ARGV[3], 'replica', ARGV[12], 'state', 'pending')
redis.call('EXPIREAT', KEYS[2], math.floor(tonumber(ARGV[3])) + tonumber(ARGV[13]))
redis.call('SADD', KEYS[3], ARGV[4])
local ttl = math.floor(tonumber(ARGV[3]) - tonumber(ARGV[1])) + tonumber(ARGV[13])
if redis.call('TTL', KEYS[3]) < ttl then redis.call('EXPIRE', KEYS[3], ttl) end
return 1
"""
# KEYS: pending zset, approval hash, conversation set.
# ARGV: now, max pending, expires, id, path, conversation, user, has_user, tool, call,
#       arguments, replica, grace.

_REOPEN = """
if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('HSET', KEYS[2], 'replica', ARGV[12])
else
    redis.call('HSET', KEYS[2], 'path', ARGV[5], 'conversation', ARGV[6], 'user', ARGV[7],
        'has_user', ARGV[8], 'tool', ARGV[9], 'call', ARGV[10], 'arguments', ARGV[11],
        'expires', ARGV[3], 'replica', ARGV[12], 'state', 'pending')
    redis.call('EXPIREAT', KEYS[2], math.floor(tonumber(ARGV[3])) + tonumber(ARGV[13]))
end
if redis.call('HGET', KEYS[2], 'state') == 'pending' then
    redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
    redis.call('SADD', KEYS[3], ARGV[4])
    local ttl = math.floor(tonumber(ARGV[3]) - tonumber(ARGV[1])) + tonumber(ARGV[13])
    if ttl > 0 and redis.call('TTL', KEYS[3]) < ttl then redis.call('EXPIRE', KEYS[3], ttl) end
end
return redis.call('HGET', KEYS[2], 'answer')
"""
# The approval a resumed durable run raised before its replica died, open again on this
# replica (its answers now wake us; never counted against max pending a second time: it was
# when it was raised). Returns an answer given meanwhile. KEYS and ARGV as `_OPEN`'s.

_ANSWER = """
local state = redis.call('HMGET', KEYS[1], 'path', 'user', 'has_user', 'state', 'replica',
    'expires')
if not state[1] then
    if redis.call('GET', KEYS[2]) == ARGV[1] then return 'already-answered' end
    return 'unknown'
end
if state[1] ~= ARGV[1] then return 'unknown' end
if tonumber(state[6]) < tonumber(ARGV[5]) then return 'unknown' end
local owner = ''
if state[3] == '1' then owner = state[2] end
if owner ~= ARGV[2] then return 'forbidden' end
if state[4] ~= 'pending' then return 'already-answered' end
redis.call('HSET', KEYS[1], 'state', 'answered', 'answer', ARGV[3])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[4])
redis.call('PUBLISH', ARGV[6] .. state[5], ARGV[7] .. ' ' .. ARGV[3])
return 'accepted'
"""
# KEYS: approval hash, answered marker. ARGV: path, user, answer, remember, now, channel
# prefix, id.

_CLOSE = """
local answer = redis.call('HGET', KEYS[2], 'answer')
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], ARGV[1])
return answer
"""
# Returns the answer given before the close, if any: an answer Redis accepted (the person saw
# "approved") is never turned into a timeout.

_FORGET = """
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    redis.call('ZREM', KEYS[1], id)
    redis.call('DEL', ARGV[1] .. id, ARGV[1] .. id .. ':answered')
end
redis.call('DEL', KEYS[2])
return 1
"""
# KEYS: pending zset, conversation set. ARGV: approval key prefix.


def _answer_json(answer: Answer) -> str:
    return json.dumps(
        {"approve": answer.approve, "arguments": dict(answer.arguments or {}) or None}
    )


def _answer_from(text: str) -> Answer:
    data = json.loads(text)
    arguments = data.get("arguments")
    return Answer(bool(data.get("approve")), arguments if isinstance(arguments, dict) else None)


class RedisApprovalStore:
    """A `governance.approvals.ApprovalStore` shared by every replica (module docstring)."""

    def __init__(self, connection: RedisConnection, *, max_pending: int = MAX_PENDING) -> None:
        if max_pending <= 0:
            raise ValueError("max_pending must be positive")
        self.connection = connection
        self.max_pending = max_pending
        self.replica = secrets.token_hex(8)
        self._local: dict[str, PendingApproval] = {}
        self._listener: asyncio.Task[None] | None = None
        self._open_script = connection.script(_OPEN)
        self._reopen_script = connection.script(_REOPEN)
        self._answer_script = connection.script(_ANSWER)
        self._close_script = connection.script(_CLOSE)
        self._forget_script = connection.script(_FORGET)
        connection.on_close(self.aclose)

    def __repr__(self) -> str:
        return f"RedisApprovalStore({self.connection!r})"

    # --- keys ---------------------------------------------------------------------------------

    def _pending_key(self) -> str:
        return self.connection.key("approvals", "pending")

    def _approval_key(self, approval_id: str) -> str:
        return self.connection.key("approval", approval_id)

    def _answered_key(self, approval_id: str) -> str:
        return self.connection.key("approval", approval_id, "answered")

    def _conversation_key(self, path: str, conversation_id: str) -> str:
        return self.connection.key("approvals", digest(path, conversation_id))

    def _channel_prefix(self) -> str:
        return self.connection.key("approvals", "wake", "")

    # --- the protocol -------------------------------------------------------------------------

    def __len__(self) -> int:
        """The approvals this replica's runs wait on (tracing's `atmosphere.approvals.waiting`)."""
        return len(self._local)

    async def open(
        self,
        *,
        path: str,
        conversation_id: str,
        user_id: str | None,
        tool: str,
        tool_call_id: str,
        arguments: Mapping[str, Any],
        timeout: float,
        approval_id: str | None = None,
        expires_at: float | None = None,
    ) -> PendingApproval | None:
        """Register a call that waits for an answer; `None` when too many already wait.

        `approval_id` and `expires_at` re-open the approval a durable run raised before its
        replica died (the run resumed here, possibly on another replica): its hash is taken
        over by this replica, keeping an answer given meanwhile, which resolves the wait."""
        self._ensure_listener()
        now = time.time()
        pending = PendingApproval.create(
            path=path,
            conversation_id=conversation_id,
            user_id=user_id,
            tool=tool,
            tool_call_id=tool_call_id,
            arguments=arguments,
            timeout=timeout,
            approval_id=approval_id,
            expires_at=expires_at,
            now=now,
        )
        script = self._open_script if approval_id is None else self._reopen_script
        with self.connection.unavailable("registering an approval"):
            added = await script(
                keys=[
                    self._pending_key(),
                    self._approval_key(pending.id),
                    self._conversation_key(path, conversation_id),
                ],
                args=[
                    repr(now),
                    self.max_pending,
                    repr(pending.expires_at),
                    pending.id,
                    path,
                    conversation_id,
                    user_id or "",
                    "1" if user_id is not None else "0",
                    tool,
                    tool_call_id,
                    json.dumps(pending.arguments, default=str),
                    self.replica,
                    GRACE,
                ],
            )
        if approval_id is not None:
            self._local[pending.id] = pending
            text = as_str(added)
            if text:
                pending.future.set_result(_answer_from(text))
            return pending
        if not added:
            return None
        self._local[pending.id] = pending
        return pending

    async def wait(self, pending: PendingApproval, timeout: float) -> Answer | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        closed = False
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    closed = True
                    return await self._close(pending)
                try:
                    return await asyncio.wait_for(
                        asyncio.shield(pending.future), min(left, RECHECK)
                    )
                except TimeoutError:
                    found = await self._stored_answer(pending)
                    reraise_cancellation()
                    if found is not None:
                        return found
        finally:
            if not closed:
                await self._close(pending)

    async def discard(self, pending: PendingApproval) -> None:
        await self._close(pending)  # an answer that raced the discard is dropped, as in memory

    async def answer(
        self, path: str, approval_id: str, answer: Answer, *, user_id: str | None
    ) -> AnswerStatus:
        if not approval_id or len(approval_id) > 64:
            return AnswerStatus.UNKNOWN
        with self.connection.unavailable("answering an approval"):
            status = await self._answer_script(
                keys=[self._approval_key(approval_id), self._answered_key(approval_id)],
                args=[
                    path,
                    user_id or "",
                    _answer_json(answer),
                    REMEMBER_ANSWERED,
                    repr(time.time()),
                    self._channel_prefix(),
                    approval_id,
                ],
            )
        result = AnswerStatus(as_str(status))
        if result is AnswerStatus.ACCEPTED:
            # Answered here: wake the local run now (the published copy finds it done).
            self._resolve(approval_id, answer)
        return result

    async def pending(
        self, path: str, conversation_id: str, *, user_id: str | None
    ) -> list[PendingApproval]:
        client = self.connection.client
        with self.connection.unavailable("listing approvals"):
            ids: list[str] = sorted(
                str(item)
                for item in await client.smembers(self._conversation_key(path, conversation_id))
            )
            async with client.pipeline(transaction=False) as pipe:
                for approval_id in ids:
                    pipe.hgetall(self._approval_key(approval_id))
                rows: list[dict[str, str]] = await pipe.execute()
        now = time.time()
        found: list[PendingApproval] = []
        loop = asyncio.get_running_loop()
        for approval_id, row in zip(ids, rows, strict=True):
            if not row or row.get("state") != "pending" or row.get("path") != path:
                continue
            expires = float(row.get("expires", 0))
            owner = row.get("user") if row.get("has_user") == "1" else None
            if expires < now or owner != user_id:
                continue
            local = self._local.get(approval_id)
            found.append(
                local
                if local is not None
                else PendingApproval(
                    id=approval_id,
                    path=path,
                    conversation_id=conversation_id,
                    user_id=owner,
                    tool=row.get("tool", ""),
                    tool_call_id=row.get("call", ""),
                    arguments=json.loads(row.get("arguments") or "{}"),
                    expires_at=expires,
                    future=loop.create_future(),
                )
            )
        found.sort(key=lambda entry: entry.expires_at)
        return found

    # --- this replica's waiting runs ----------------------------------------------------------

    def _resolve(self, approval_id: str, answer: Answer) -> None:
        pending = self._local.get(approval_id)
        if pending is not None and not pending.future.done():
            pending.future.set_result(answer)

    async def _stored_answer(self, pending: PendingApproval) -> Answer | None:
        """The answer Redis holds for `pending` (a wake-up that never arrived), if any."""
        if pending.future.done() and not pending.future.cancelled():
            return pending.future.result()
        try:
            stored = await self.connection.client.hget(self._approval_key(pending.id), "answer")
        except (RedisError, OSError):
            return None
        text = as_str(stored)
        return _answer_from(text) if text else None

    async def forget(self, path: str, conversation_id: str) -> None:
        with self.connection.unavailable("deleting a conversation's approvals"):
            await self._forget_script(
                keys=[self._pending_key(), self._conversation_key(path, conversation_id)],
                args=[self.connection.key("approval", "")],
            )

    async def _close(self, pending: PendingApproval) -> Answer | None:
        """Forget the approval everywhere; returns an answer that arrived before the close."""
        self._local.pop(pending.id, None)
        if not pending.future.done():
            pending.future.cancel()
        try:
            stored = await self._close_script(
                keys=[
                    self._pending_key(),
                    self._approval_key(pending.id),
                    self._conversation_key(pending.path, pending.conversation_id),
                ],
                args=[pending.id],
            )
        except (RedisError, OSError) as exc:
            # The keys expire by themselves shortly after the approval would have.
            log.warning(
                "could not remove a closed approval from Redis; it expires by itself",
                error=self.connection.scrub(exc),
            )
            return None
        text = as_str(stored)
        return _answer_from(text) if text else None

    def _ensure_listener(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(), name="redis-approval-listener"
            )

    async def _listen(self) -> None:
        async def subscribed(reconnected: bool) -> None:
            if reconnected:
                log.info("approval listener reconnected to Redis")
            await self._recheck_local()

        await listen(
            self.connection,
            self._channel_prefix() + self.replica,
            self._deliver,
            lost="approval listener lost Redis; waiting runs re-read their approvals",
            subscribed=subscribed,
            wait=RECHECK,
        )

    def _deliver(self, data: str) -> None:
        approval_id, _, text = data.partition(" ")
        with contextlib.suppress(ValueError):
            self._resolve(approval_id, _answer_from(text))

    async def _recheck_local(self) -> None:
        for pending in list(self._local.values()):
            if pending.future.done():
                continue
            found = await self._stored_answer(pending)
            if found is not None:
                self._resolve(pending.id, found)

    async def aclose(self) -> None:
        """Stop the listener (the host closes the pool after)."""
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
