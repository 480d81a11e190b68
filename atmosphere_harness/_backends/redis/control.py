"""`RedisRunRegistry`: every run's status in Redis; a cancel request reaches the replica that
runs it by pub/sub.

Each run is a hash `rc:run:{runId}` (whose it is, its status, usage, error, its replica and
that replica's lease, and a cancel request), expiring `KEEP_SECONDS` after its last change; a
conversation's run ids are a set `rc:conversation:{digest}` (expiring with them), read for its
runs in flight (and pruned of those that ended), and a set `rc:every:{digest}` of all of them,
read when the conversation is deleted. `begin` and `cancel` are scripts, so `multitask: reject`
cannot let two prompts through at once, and a cancel request is recorded and `PUBLISH`ed
together. Every replica listens on one pub/sub connection (`rc:cancel`); pub/sub drops what is
sent while a listener reconnects, so each `heartbeat` (every third of a lease) also reads the
cancel requests of the replica's runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from typing import Any

from ..._contracts import ACTIVE_STATUSES, CancelListener, RunRecord
from ..._log import get_logger
from .connection import RedisConnection, as_str, digest, listening

log = get_logger(__name__)

KEEP_SECONDS = 24 * 3600
"""How long a run's record answers `GET P/runs/{runId}` after its last change."""
ACTIVE = " ".join(sorted(ACTIVE_STATUSES))

PUT_RECORD = """
local function put_record(run, conversation, every, fields, keep, run_id)
    redis.call('HSET', run, unpack(cjson.decode(fields)))
    redis.call('EXPIRE', run, keep)
    redis.call('SADD', conversation, run_id)
    redis.call('EXPIRE', conversation, keep)
    redis.call('SADD', every, run_id)
    redis.call('EXPIRE', every, keep)
end
"""
"""A Lua function the scripts that store a run's record include: its fields (a JSON list of
names and values) into the run's hash and the run into its conversation's two sets (runs in
flight, every run), all kept `keep` seconds."""

_BEGIN = (
    PUT_RECORD
    + """
if ARGV[1] == '1' then
    for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
        local fields = redis.call('HMGET', ARGV[5] .. id, 'status', 'lease')
        if fields[1] and string.find(ARGV[3], fields[1], 1, true)
            and tonumber(fields[2] or '0') >= tonumber(ARGV[4]) then
            return 0
        end
    end
end
put_record(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[6], ARGV[7])
return 1
"""
)
# KEYS: run hash, conversation set, conversation's every run. ARGV: exclusive, fields (JSON
# list), active statuses, now, run key prefix, keep seconds, run id.

_CANCEL = """
local fields = redis.call('HMGET', KEYS[1], 'status', 'cancel')
if not fields[1] or fields[2] or not string.find(ARGV[3], fields[1], 1, true) then
    return 0
end
redis.call('HSET', KEYS[1], 'cancel', ARGV[1])
redis.call('PUBLISH', KEYS[2], ARGV[2])
return 1
"""
# KEYS: run hash, channel. ARGV: mode, payload, active statuses.


STORE_STATUS = (
    PUT_RECORD
    + """
local function store_status(run, conversation, every, fields, keep, run_id, status)
    local now = redis.call('HGET', run, 'status')
    if now and now ~= 'queued' and now ~= 'running' then return end
    put_record(run, conversation, every, fields, keep, run_id)
    redis.call('HSET', run, 'status', status)
end
"""
)
"""A Lua function another script includes to store a run's record as `put` does, with
`status` (`queued` or `running`), unless the run's status is already another one (a run
cancelled meanwhile stays cancelled): the conversation lock's script stores the run's status
in the round trip that takes the lock (`contracts.LockedStatus`)."""


def status_keys_args(
    connection: RedisConnection, record: RunRecord
) -> tuple[list[str], list[str | int]]:
    """`STORE_STATUS`'s keys (the run's hash, its conversation's sets: runs in flight, every
    run) and arguments (the record's fields, how long they are kept, the run id) for
    `record`."""
    keys = [
        connection.key("rc", "run", record.run_id),
        connection.key("rc", "conversation", digest(record.path, record.conversation_id)),
        connection.key("rc", "every", digest(record.path, record.conversation_id)),
    ]
    return keys, [json.dumps(_fields(record)), KEEP_SECONDS, record.run_id]


def _fields(record: RunRecord) -> list[str]:
    values = {
        "path": record.path,
        "conversation": record.conversation_id,
        "user": record.user_id or "",
        "has_user": "1" if record.user_id is not None else "0",
        "status": record.status,
        "usage": json.dumps(dict(record.usage)) if record.usage is not None else "",
        "error": json.dumps(dict(record.error)) if record.error is not None else "",
        "owner": record.owner,
        "lease": repr(record.lease_until),
        "started": repr(record.started_at),
    }
    return [item for pair in values.items() for item in pair]


def _record(run_id: str, found: dict[str, Any]) -> RunRecord:
    usage = as_str(found.get("usage"))
    error = as_str(found.get("error"))
    return RunRecord(
        run_id=run_id,
        path=str(found.get("path", "")),
        conversation_id=str(found.get("conversation", "")),
        user_id=str(found.get("user", "")) if found.get("has_user") == "1" else None,
        status=str(found.get("status", "")),
        usage=json.loads(usage) if usage else None,
        error=json.loads(error) if error else None,
        owner=str(found.get("owner", "")),
        lease_until=float(found.get("lease") or 0),
        started_at=float(found.get("started") or 0),
    )


_FORGET = """
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    local fields = redis.call('HMGET', ARGV[1] .. id, 'status', 'lease')
    if not (fields[1] and string.find(ARGV[2], fields[1], 1, true)
            and tonumber(fields[2] or '0') >= tonumber(ARGV[3])) then
        redis.call('DEL', ARGV[1] .. id)
        redis.call('SREM', KEYS[1], id)
        redis.call('SREM', KEYS[2], id)
    end
end
return 1
"""
# KEYS: the conversation's every run, its runs in flight.
# ARGV: run key prefix, active statuses, now.


class RedisRunRegistry:
    """A `contracts.RunRegistry` on Redis (see the module docstring)."""

    name = "redis"

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self._listener: CancelListener | None = None
        self._task: asyncio.Task[None] | None = None
        self._begin = connection.script(_BEGIN)
        self._cancel = connection.script(_CANCEL)
        self._forget = connection.script(_FORGET)

    def _run_key(self, run_id: str) -> str:
        return self.connection.key("rc", "run", run_id)

    def _conversation_key(self, path: str, conversation_id: str) -> str:
        return self.connection.key("rc", "conversation", digest(path, conversation_id))

    def _every_key(self, path: str, conversation_id: str) -> str:
        """Every run of the conversation (the other set drops those that ended)."""
        return self.connection.key("rc", "every", digest(path, conversation_id))

    # (`status_keys_args` names the same three keys.)

    @property
    def _channel(self) -> str:
        return self.connection.key("rc", "cancel")

    async def open(self, on_cancel: CancelListener) -> None:
        self._listener = on_cancel
        self._task = await listening(
            self.connection,
            self._channel,
            self._deliver,
            lost="run cancel listener lost Redis; cancel requests are read on heartbeat",
            name="redis-run-cancel",
        )

    async def aclose(self) -> None:
        self._listener = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _deliver(self, data: str) -> None:
        with contextlib.suppress(ValueError, TypeError):
            run_id, mode = json.loads(data)
            if self._listener is not None:
                self._listener(str(run_id), str(mode))

    async def put(self, record: RunRecord) -> None:
        key = self._run_key(record.run_id)
        with self.connection.unavailable("storing a run's status"):
            async with self.connection.client.pipeline(transaction=True) as pipe:
                fields = _fields(record)
                pipe.hset(key, mapping=dict(zip(fields[::2], fields[1::2], strict=True)))
                pipe.expire(key, KEEP_SECONDS)
                pipe.sadd(
                    self._conversation_key(record.path, record.conversation_id), record.run_id
                )
                pipe.expire(
                    self._conversation_key(record.path, record.conversation_id), KEEP_SECONDS
                )
                every = self._every_key(record.path, record.conversation_id)
                pipe.sadd(every, record.run_id)
                pipe.expire(every, KEEP_SECONDS)
                await pipe.execute()

    async def begin(self, record: RunRecord, *, exclusive: bool) -> bool:
        with self.connection.unavailable("starting a run"):
            done = await self._begin(
                keys=[
                    self._run_key(record.run_id),
                    self._conversation_key(record.path, record.conversation_id),
                    self._every_key(record.path, record.conversation_id),
                ],
                args=[
                    "1" if exclusive else "0",
                    json.dumps(_fields(record)),
                    ACTIVE,
                    repr(time.time()),
                    self.connection.key("rc", "run", ""),
                    KEEP_SECONDS,
                    record.run_id,
                ],
            )
        return bool(int(done))

    async def forget(self, path: str, conversation_id: str) -> None:
        """Drop the records of the conversation's runs no longer in flight."""
        with self.connection.unavailable("deleting a conversation's runs"):
            await self._forget(
                keys=[
                    self._every_key(path, conversation_id),
                    self._conversation_key(path, conversation_id),
                ],
                args=[self.connection.key("rc", "run", ""), ACTIVE, repr(time.time())],
            )

    async def get(self, run_id: str) -> RunRecord | None:
        with self.connection.unavailable("reading a run's status"):
            found: Any = await self.connection.client.hgetall(self._run_key(run_id))
        return _record(run_id, found) if found else None

    async def active(self, path: str, conversation_id: str) -> list[RunRecord]:
        key = self._conversation_key(path, conversation_id)
        with self.connection.unavailable("reading a conversation's runs"):
            members: Any = await self.connection.client.smembers(key)
            records = []
            for run_id in sorted(members)[:256]:
                record = await self.get(str(run_id))
                if record is None or not record.active:
                    await self.connection.client.srem(key, run_id)
                    continue
                records.append(record)
        return sorted(records, key=lambda record: record.started_at)

    async def cancel(self, run_id: str, mode: str) -> None:
        with self.connection.unavailable("cancelling a run"):
            await self._cancel(
                keys=[self._run_key(run_id), self._channel],
                args=[mode, json.dumps([run_id, mode]), ACTIVE],
            )

    async def heartbeat(
        self, owner: str, run_ids: Sequence[str], lease_seconds: float
    ) -> dict[str, str]:
        asked: dict[str, str] = {}
        until = repr(time.time() + lease_seconds)
        with self.connection.unavailable("renewing runs"):
            for run_id in run_ids:
                key = self._run_key(run_id)
                owner_now, status, cancel = await self.connection.client.hmget(
                    key, ["owner", "status", "cancel"]
                )
                if owner_now != owner or status not in ACTIVE_STATUSES:
                    continue
                await self.connection.client.hset(key, "lease", until)
                if cancel:
                    asked[run_id] = str(cancel)
        return asked
