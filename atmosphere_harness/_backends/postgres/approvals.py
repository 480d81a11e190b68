"""`PostgresApprovalStore`: pending approvals every replica can list and answer.

An approval is a row; the run that raised it waits on a local future. `POST P/approvals/{id}`
on any replica records the answer with one conditional `UPDATE` (so two answers cannot both
win) and sends `NOTIFY atmosphere_approvals, '<id>'` in the same transaction; the replica whose
run waits reads the answer and resolves its future. The waiting side also re-reads the row
every `POLL_SECONDS` and after the `LISTEN` connection is restored, so a notification lost in an
outage delays an answer, never drops it.

Answered and closed rows stay for `REMEMBER_SECONDS` past their expiry, so a second answer gets
"already answered" (409) rather than "unknown" (404); older rows are swept when approvals open.
`max_pending` bounds the approvals waiting at once over all replicas.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Mapping
from typing import Any

from ..._governance.approvals import MAX_PENDING, Answer, AnswerStatus, PendingApproval
from ..._log import fault, get_logger
from .database import PostgresDatabase

log = get_logger(__name__)

CHANNEL = "atmosphere_approvals"
POLL_SECONDS = 2.0
FORGET_BATCH = 1000
"""Approvals past `REMEMBER_SECONDS` deleted per `open` (each open deletes its share)."""
REMEMBER_SECONDS = 3600.0


def _answer_json(answer: Answer) -> str:
    arguments = dict(answer.arguments) if answer.arguments is not None else None
    return json.dumps({"approve": answer.approve, "arguments": arguments})


def _answer(text: str) -> Answer:
    data = json.loads(text)
    return Answer(bool(data["approve"]), data.get("arguments"))


class PostgresApprovalStore:
    """A `governance.approvals.ApprovalStore` shared by every replica."""

    def __init__(self, database: PostgresDatabase, *, max_pending: int = MAX_PENDING) -> None:
        self.database = database
        self.max_pending = max_pending
        self._waiting: dict[str, PendingApproval] = {}
        self._checks: set[asyncio.Task[None]] = set()
        database.listen(CHANNEL, self._notified)
        database.on_reconnect(self._recheck_all)

    def __len__(self) -> int:
        """The approvals this replica's runs wait on (tracing's `atmosphere.approvals.waiting`)."""
        return len(self._waiting)

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
        replica died (the run resumed here, possibly on another replica): its row is opened
        again, keeping an answer given meanwhile, which then resolves the wait at once."""
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
        if approval_id is not None:
            await self.database.run(functools.partial(self._reopen, pending))
            self._waiting[pending.id] = pending
            self._spawn_check(pending)
            return pending

        attempts = 0

        async def work(connection: Any) -> bool:
            nonlocal attempts
            attempts += 1
            async with connection.transaction():
                if attempts > 1 and await connection.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM atmosphere_approvals WHERE id = $1)", pending.id
                ):
                    return True  # the first attempt committed; its answer was lost
                # Oldest first, a bounded batch: the index on `expires_at` whatever the plan.
                await connection.execute(
                    "DELETE FROM atmosphere_approvals WHERE id = ANY(ARRAY(SELECT id FROM "
                    "atmosphere_approvals WHERE expires_at < $1 ORDER BY expires_at LIMIT $2))",
                    now - REMEMBER_SECONDS,
                    FORGET_BATCH,
                )
                # Serializes the count-then-insert of concurrent opens across replicas.
                await connection.execute(
                    "SELECT pg_advisory_xact_lock(hashtext('atmosphere_approvals'))"
                )
                waiting = int(
                    await connection.fetchval(
                        "SELECT count(*) FROM atmosphere_approvals WHERE NOT closed "
                        "AND answer IS NULL AND expires_at > $1",
                        now,
                    )
                )
                if waiting >= self.max_pending:
                    return False
                await connection.execute(
                    "INSERT INTO atmosphere_approvals (id, path, conversation_id, user_id, tool, "
                    "tool_call_id, arguments, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    pending.id,
                    path,
                    conversation_id,
                    user_id,
                    tool,
                    tool_call_id,
                    json.dumps(pending.arguments, default=str),
                    pending.expires_at,
                )
                return True

        if not await self.database.run(work):
            return None
        self._waiting[pending.id] = pending
        return pending

    async def _reopen(self, pending: PendingApproval, connection: Any) -> None:
        """The row of a resumed run's approval, open again (never counted against
        `max_pending` a second time: it was when it was raised)."""
        await connection.execute(
            "INSERT INTO atmosphere_approvals (id, path, conversation_id, user_id, tool, "
            "tool_call_id, arguments, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) "
            "ON CONFLICT (id) DO UPDATE SET closed = false",
            pending.id,
            pending.path,
            pending.conversation_id,
            pending.user_id,
            pending.tool,
            pending.tool_call_id,
            json.dumps(pending.arguments, default=str),
            pending.expires_at,
        )

    async def wait(self, pending: PendingApproval, timeout: float) -> Answer | None:
        """The answer, or `None` when `timeout` passed first; closed either way."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                try:
                    return await asyncio.wait_for(
                        asyncio.shield(pending.future), min(left, POLL_SECONDS)
                    )
                except TimeoutError:
                    pass
                try:
                    await self._check(pending)
                except Exception as exc:  # an outage: keep waiting, the answer is in the row
                    fault(log, "approval poll failed", exc, every=False)
        finally:
            await self._close(pending)

    async def discard(self, pending: PendingApproval) -> None:
        await self._close(pending)

    async def _close(self, pending: PendingApproval) -> None:
        self._waiting.pop(pending.id, None)
        if not pending.future.done():
            pending.future.cancel()

        async def work(connection: Any) -> None:
            await connection.execute(
                "UPDATE atmosphere_approvals SET closed = true WHERE id = $1", pending.id
            )

        try:
            await asyncio.shield(self.database.run(work))
        except Exception as exc:
            # The row expires on its own; an answer to it meanwhile finds no waiting run.
            fault(log, "approval could not be closed", exc, every=False)

    async def answer(
        self, path: str, approval_id: str, answer: Answer, *, user_id: str | None
    ) -> AnswerStatus:
        now = time.time()
        given = _answer_json(answer)
        attempts = 0

        async def work(connection: Any) -> AnswerStatus:
            nonlocal attempts
            attempts += 1
            async with connection.transaction():
                row = await connection.fetchrow(
                    "SELECT path, user_id, answer, closed, expires_at FROM atmosphere_approvals "
                    "WHERE id = $1 FOR UPDATE",
                    approval_id,
                )
                if row is None or row["path"] != path:
                    return AnswerStatus.UNKNOWN
                if row["user_id"] != user_id:
                    return AnswerStatus.FORBIDDEN
                if row["answer"] is not None:
                    # A retry whose first attempt committed finds its own answer there.
                    mine = attempts > 1 and row["answer"] == given
                    return AnswerStatus.ACCEPTED if mine else AnswerStatus.ALREADY_ANSWERED
                if row["closed"] or row["expires_at"] <= now:
                    return AnswerStatus.UNKNOWN
                await connection.execute(
                    "UPDATE atmosphere_approvals SET answer = $2 WHERE id = $1", approval_id, given
                )
                await connection.execute("SELECT pg_notify($1, $2)", CHANNEL, approval_id)
                return AnswerStatus.ACCEPTED

        return await self.database.run(work)

    async def pending(
        self, path: str, conversation_id: str, *, user_id: str | None
    ) -> list[PendingApproval]:
        now = time.time()

        async def work(connection: Any) -> list[Any]:
            rows: list[Any] = await connection.fetch(
                "SELECT id, user_id, tool, tool_call_id, arguments, expires_at "
                "FROM atmosphere_approvals WHERE path = $1 AND conversation_id = $2 "
                "AND NOT closed AND answer IS NULL AND expires_at > $3 "
                "AND user_id IS NOT DISTINCT FROM $4 ORDER BY expires_at",
                path,
                conversation_id,
                now,
                user_id,
            )
            return rows

        loop = asyncio.get_running_loop()
        return [
            PendingApproval(
                id=row["id"],
                path=path,
                conversation_id=conversation_id,
                user_id=row["user_id"],
                tool=row["tool"],
                tool_call_id=row["tool_call_id"],
                arguments=json.loads(row["arguments"]),
                expires_at=float(row["expires_at"]),
                future=loop.create_future(),
            )
            for row in await self.database.run(work)
        ]

    async def forget(self, path: str, conversation_id: str) -> None:
        async def work(connection: Any) -> None:
            await connection.execute(
                "DELETE FROM atmosphere_approvals WHERE path = $1 AND conversation_id = $2",
                path,
                conversation_id,
            )

        await self.database.run(work)

    # --- wake-ups -------------------------------------------------------------------------

    def _notified(self, approval_id: str) -> None:
        pending = self._waiting.get(approval_id)
        if pending is not None:
            self._spawn_check(pending)

    def _recheck_all(self) -> None:
        for pending in list(self._waiting.values()):
            self._spawn_check(pending)

    def _spawn_check(self, pending: PendingApproval) -> None:
        task = asyncio.get_running_loop().create_task(self._check_quietly(pending))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _check_quietly(self, pending: PendingApproval) -> None:
        try:
            await self._check(pending)
        except Exception as exc:
            fault(log, "approval answer could not be read", exc, every=False)

    async def _check(self, pending: PendingApproval) -> None:
        """Resolve `pending`'s future if its row holds an answer."""

        async def work(connection: Any) -> str | None:
            value: str | None = await connection.fetchval(
                "SELECT answer FROM atmosphere_approvals WHERE id = $1", pending.id
            )
            return value

        text = await self.database.run(work)
        if text is not None and not pending.future.done():
            pending.future.set_result(_answer(text))
