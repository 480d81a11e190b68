"""`PostgresRunRegistry`: every run's status in PostgreSQL; a cancel request reaches the
replica that runs it by `NOTIFY`.

One row per run (`atmosphere_run_control`): whose it is, its status, usage, error, the
replica that runs it and that replica's lease on it. `cancel` records the request in the row
and sends `NOTIFY atmosphere_run_cancel` in the same transaction; every replica `LISTEN`s, and
the one that runs the run cancels it (within a second: one notification). A notification lost
while a `LISTEN` connection reconnects is found by the next `heartbeat` (every third of a
lease), which also renews the leases of the replica's runs and drops records older than
`KEEP_SECONDS`.

`begin(..., exclusive=True)` (`multitask: reject`) takes a transaction-level advisory lock on
the conversation before it looks for a run in flight and inserts, so two replicas cannot both
find the conversation idle.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ..._contracts import ACTIVE_STATUSES, CancelListener, RunRecord
from ..._log import get_logger
from .database import PostgresDatabase

log = get_logger(__name__)

CHANNEL = "atmosphere_run_cancel"
KEEP_SECONDS = 24 * 3600.0
"""How long a run's record answers `GET P/runs/{runId}` after its last change."""
ACTIVE = tuple(sorted(ACTIVE_STATUSES))
COLUMNS = (
    "run_id, path, conversation_id, user_key, has_user, status, usage, error, owner, "
    "lease_until, started_at"
)


def _record(row: Any) -> RunRecord:
    return RunRecord(
        run_id=row["run_id"],
        path=row["path"],
        conversation_id=row["conversation_id"],
        user_id=row["user_key"] if row["has_user"] else None,
        status=row["status"],
        usage=json.loads(row["usage"]) if row["usage"] else None,
        error=json.loads(row["error"]) if row["error"] else None,
        owner=row["owner"],
        lease_until=float(row["lease_until"]),
        started_at=float(row["started_at"]),
    )


def _values(record: RunRecord) -> tuple[Any, ...]:
    return (
        record.run_id,
        record.path,
        record.conversation_id,
        record.user_id or "",
        record.user_id is not None,
        record.status,
        json.dumps(dict(record.usage)) if record.usage is not None else None,
        json.dumps(dict(record.error)) if record.error is not None else None,
        record.owner,
        record.lease_until,
        record.started_at,
        time.time(),
    )


def status_upsert(first: int, *, relaxed: bool = True) -> str:
    """`UPSERT` with its twelve parameters numbered from `$first`; without `relaxed`, it leaves
    the transaction's `synchronous_commit` alone (`locks.APPEND_END`: the turn stored with it
    waits for its WAL flush)."""
    p = [f"${first + n}" for n in range(12)]
    updated = f"{p[11]}::double precision"
    if relaxed:
        updated += " + 0 * length(set_config('synchronous_commit', 'off', true))"
    return (
        "INSERT INTO atmosphere_run_control (run_id, path, conversation_id, user_key, "
        "has_user, status, usage, error, owner, lease_until, started_at, updated_at) "
        f"VALUES ({', '.join(p[:11])}, {updated}) "
        "ON CONFLICT (run_id) DO UPDATE SET status = EXCLUDED.status, usage = EXCLUDED.usage, "
        "error = EXCLUDED.error, owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until, "
        "updated_at = EXCLUDED.updated_at"
    )


UPSERT = status_upsert(1)
"""A run's status, committed without waiting for its WAL flush (the `set_config` turns
`synchronous_commit` off for the statement's own transaction): a turn's end is not kept
waiting for a disk flush. A crash of the PostgreSQL server may lose the last fraction of a
second of status changes; a run whose row still says it is in flight then reads as
`interrupted` once its lease has run out, which is what became of it."""


def run_values(record: RunRecord) -> tuple[Any, ...]:
    """`UPSERT`'s arguments for `record` (`locks.APPEND_END` stores a run's end with them)."""
    return _values(record)


def lock_run_args(record: RunRecord, queue: bool) -> tuple[Any, ...]:
    """The run's part of `locks.LOCK_RUN`'s arguments (schema migration 11): its row's
    values, and whether a try that finds the lock taken stores it `queued`."""
    values = _values(record)
    return (*values[:5], values[8], values[9], values[10], values[11], queue)


class PostgresRunRegistry:
    """A `contracts.RunRegistry` on the shared PostgreSQL database (see the module docstring)."""

    name = "postgres"

    def __init__(self, database: PostgresDatabase) -> None:
        self.database = database
        self._listener: CancelListener | None = None
        database.listen(CHANNEL, self._notified)

    async def open(self, on_cancel: CancelListener) -> None:
        self._listener = on_cancel

    async def aclose(self) -> None:
        self._listener = None

    def _notified(self, payload: str) -> None:
        try:
            run_id, mode = json.loads(payload)
        except (ValueError, TypeError):
            return
        if self._listener is not None:
            self._listener(str(run_id), str(mode))

    async def put(self, record: RunRecord) -> None:
        async def work(connection: Any) -> None:
            await connection.execute(UPSERT, *_values(record))

        await self.database.run(work)

    async def begin(self, record: RunRecord, *, exclusive: bool) -> bool:
        now = time.time()

        async def work(connection: Any) -> bool:
            async with connection.transaction():
                if exclusive:
                    await connection.execute(
                        "SELECT pg_advisory_xact_lock(hashtextextended($1 || ' ' || $2, 7))",
                        record.path,
                        record.conversation_id,
                    )
                    busy = await connection.fetchval(
                        "SELECT count(*) FROM atmosphere_run_control WHERE path = $1 "
                        "AND conversation_id = $2 AND status = ANY($3::text[]) "
                        "AND lease_until >= $4",
                        record.path,
                        record.conversation_id,
                        list(ACTIVE),
                        now,
                    )
                    if busy:
                        return False
                await connection.execute(UPSERT, *_values(record))
                return True

        return await self.database.run(work)

    async def get(self, run_id: str) -> RunRecord | None:
        async def work(connection: Any) -> Any:
            return await connection.fetchrow(
                f"SELECT {COLUMNS} FROM atmosphere_run_control WHERE run_id = $1", run_id
            )

        row = await self.database.run(work)
        return _record(row) if row is not None else None

    async def active(self, path: str, conversation_id: str) -> list[RunRecord]:
        async def work(connection: Any) -> list[Any]:
            return list(
                await connection.fetch(
                    f"SELECT {COLUMNS} FROM atmosphere_run_control WHERE path = $1 "
                    "AND conversation_id = $2 AND status = ANY($3::text[]) "
                    "ORDER BY started_at LIMIT 64",
                    path,
                    conversation_id,
                    list(ACTIVE),
                )
            )

        return [_record(row) for row in await self.database.run(work)]

    async def forget(self, path: str, conversation_id: str) -> None:
        """Drop the records of the conversation's runs no longer in flight."""

        async def work(connection: Any) -> None:
            await connection.execute(
                "DELETE FROM atmosphere_run_control WHERE path = $1 AND conversation_id = $2 "
                "AND NOT (status = ANY($3::text[]) AND lease_until >= $4)",
                path,
                conversation_id,
                list(ACTIVE),
                time.time(),
            )

        await self.database.run(work)

    async def cancel(self, run_id: str, mode: str) -> None:
        async def work(connection: Any) -> None:
            async with connection.transaction():
                status = await connection.execute(
                    "UPDATE atmosphere_run_control SET cancel = $2 WHERE run_id = $1 "
                    "AND cancel IS NULL AND status = ANY($3::text[])",
                    run_id,
                    mode,
                    list(ACTIVE),
                )
                if str(status).endswith(" 1"):
                    await connection.execute(
                        "SELECT pg_notify($1, $2)", CHANNEL, json.dumps([run_id, mode])
                    )

        await self.database.run(work)

    async def heartbeat(
        self, owner: str, run_ids: Sequence[str], lease_seconds: float
    ) -> dict[str, str]:
        now = time.time()

        async def work(connection: Any) -> list[Any]:
            await connection.execute(
                "DELETE FROM atmosphere_run_control WHERE run_id = ANY(ARRAY(SELECT run_id "
                "FROM atmosphere_run_control WHERE updated_at < $1 ORDER BY updated_at "
                "LIMIT 1000))",
                now - KEEP_SECONDS,
            )
            if not run_ids:
                return []
            return list(
                await connection.fetch(
                    "UPDATE atmosphere_run_control SET lease_until = $3 WHERE run_id = ANY($1) "
                    "AND owner = $2 AND status = ANY($4::text[]) RETURNING run_id, cancel",
                    list(run_ids),
                    owner,
                    now + lease_seconds,
                    list(ACTIVE),
                )
            )

        rows = await self.database.run(work)
        return {row["run_id"]: row["cancel"] for row in rows if row["cancel"]}
