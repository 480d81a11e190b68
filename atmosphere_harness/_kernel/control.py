"""Run control: every prompt run's status, and cancel requests that reach it on any replica.

Each run the host starts gets a `RunTicket`: its id, whose it is, its status as it moves
(`queued` while it waits for its conversation's lock, `running`, `waiting-approval` while a
person's answer holds it, then `completed`, `failed`, `cancelled` or `interrupted`), its usage
and its error. The ticket writes each change to the `contracts.RunRegistry` in the background,
newest state first (a burst of changes costs one write), so any replica answers
`GET P/runs/{runId}`.

A run's first states ride on its conversation lock's round trip where the lock's store also
holds the registry (`contracts.LockedStatus`, offered with the run's history read): `running`
once the lock is taken, `queued` only if the lock was taken by another run (the run really
waits). A streamed run announces itself (`announce`) instead of writing `queued` at once; if
nothing stored its record within `QUEUED_AFTER` (a lock that carries no status, or none
offered), the ticket writes it. The end is written before the last frame: by the lock's
release, in the same round trip as the unlock, where the lock stored the status
(`LockedStatus.end`), else by the ticket. Where the run's last history write rides on that
release too (`LockedStatus.hand`), the end waits for the write's outcome, as the run would
have waited for the write: a write that could not be stored ends the run `failed`, with the
write's error (`settle` returns it, for the run's `error` frame).

Cancelling goes through the run's own task, not a hook: `RunControl.cancel` asks the registry,
which wakes the replica that runs it (in this process: at once); that replica's ticket cancels
the task. The cancellation unwinds the loop the way a client that left does (the turn is
written without a half tool pair, `kernel.loop`), then `execute_prompt` ends the stream with an
`error` frame of type `RunCancelled` instead of propagating it. This stops a run wherever it
waits, including for its conversation's lock or an approval, which no model or tool hook
sees. A durable run journals that it ended before its task is cancelled, so it is never
resumed; `rollback` marks the run discarded first, so its turn is never written.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from .._cancel import reraise_cancellation
from .._contracts import (
    ACTIVE_STATUSES,
    CancelListener,
    LiveRunHandle,
    LockedRead,
    LockedStatus,
    Run,
    RunRecord,
    RunRegistry,
)
from .._log import fault, get_logger

log = get_logger(__name__)

Holder = Callable[[], contextlib.AbstractContextManager[None]]

KEEP_RECORDS = 4096
"""Run records the embedded registry keeps (the oldest finished ones go first)."""
LEASE_SECONDS = 15.0
QUEUED_AFTER = 0.1
"""How long an announced run may go without a stored record (`RunTicket.announce`): its lock
stores it in its first round trip, or the ticket writes it then."""
SETTLE_SECONDS = 2.0
"""How long a run's end waits for the registry to hold its final status before its last frame
(a slow store delays the frame this much at most; the status is written all the same)."""


def new_run_id() -> str:
    """128 random bits as hex: a run id is not guessable (its owner check comes on top)."""
    return uuid.uuid4().hex


class RunTicket:
    """One run on this replica as run control sees it (see the module docstring)."""

    def __init__(
        self,
        control: RunControl,
        *,
        run_id: str,
        path: str,
        conversation_id: str,
        user_id: str | None,
        status: str = "queued",
    ) -> None:
        self.control = control
        self.run_id = run_id
        self.path = path
        self.conversation_id = conversation_id
        self.user_id = user_id
        self.status = status
        self.error: dict[str, str] | None = None
        self.started_at = time.time()
        self.cancel_mode: str | None = None
        """Set by a cancel request: `cancel`, `interrupt` or `rollback`."""
        self.run: Run | None = None
        self._live: LiveRunHandle | None = None
        self._version = 0
        self._written = 0
        self._writer: asyncio.Task[None] | None = None
        self._pending: asyncio.TimerHandle | None = None
        """Set while an announced run's first record is not stored yet (`announce`)."""
        self._offered: LockedStatus | None = None
        self._carrier: LockedStatus | None = None
        """The status offered to the run's lock: its release may store the run's end."""
        self._handoff: LockedStatus | None = None
        """The same, kept after the end went: a write handed to the release is waited for."""

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def live(self) -> LiveRunHandle | None:
        """The run's journal, once it started."""
        return self._live

    @live.setter
    def live(self, live: LiveRunHandle | None) -> None:
        self._live = live
        if self._handoff is not None and live is not None and live.durable:
            self._handoff.keeps_writes = True  # (it journals each write once it is stored)

    def record(self) -> RunRecord:
        usage = self.run.usage.to_wire() if self.run is not None else None
        return RunRecord(
            run_id=self.run_id,
            path=self.path,
            conversation_id=self.conversation_id,
            user_id=self.user_id,
            status=self.status,
            usage=usage,
            error=self.error,
            owner=self.control.owner,
            lease_until=(time.time() + self.control.lease_seconds) if self.active else 0.0,
            started_at=self.started_at,
        )

    # --- what the kernel tells it -------------------------------------------------------------

    def attach(self, run: Run) -> None:
        """The run's context exists: a `rollback` asked before it did applies now."""
        self.run = run
        if self.cancel_mode == "rollback":
            run.discard()

    def announce(self) -> None:
        """The run starts: its first record is stored by its lock's round trip (`offer`), else
        by this ticket, at the latest `QUEUED_AFTER` from now."""
        self._pending = asyncio.get_running_loop().call_later(QUEUED_AFTER, self._store_pending)

    def offer(self, read: LockedRead | None) -> None:
        """The run is about to take its conversation's lock, offered `read`: the run's status
        rides with it (`contracts.LockedStatus`); without a read, an announced run's record is
        written now."""
        if read is None:
            self._store_pending()
            return
        if self.status == "queued":
            self._offered = read.status = LockedStatus(self.control.registry, self._as)
            self._carrier = self._handoff = self._offered
            self._offered.keeps_writes = self._live is not None and self._live.durable
        else:
            self._store_pending()

    def _as(self, status: str) -> RunRecord:
        return replace(self.record(), status=status)

    def _store_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        pending.cancel()
        if self._offered is None or self._offered.stored is None:
            # Written by this ticket from now on: its writes are ordered, the lock's are not
            # (`running` then writes again, after this one).
            self._offered = None
            self.changed()

    def running(self) -> None:
        """The run took its conversation's lock."""
        offered, self._offered = self._offered, None
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        idle = self._writer is None or self._writer.done()
        if offered is not None and offered.stored == "running" and idle:
            # The lock's round trip stored it: nothing to write.
            self.status = "running"
            self._version += 1
            self._written = self._version
            return
        self._set("running")

    def hold(self) -> contextlib.AbstractContextManager[None]:
        """Keep the run alive past its connection (its journal's `hold`) while the block runs,
        `waiting-approval` meanwhile (`waiting`): what holds a run started with a journal."""
        live = self.live
        if live is None:
            raise RuntimeError("a run without a journal has nothing to hold")
        return self.waiting(live.hold)

    @contextlib.contextmanager
    def waiting(
        self, hold: Callable[[], contextlib.AbstractContextManager[None]]
    ) -> Iterator[None]:
        """The run waits for a person (an approval): `waiting-approval` meanwhile."""
        with hold():
            before = self.status
            self._set("waiting-approval")
            try:
                yield
            finally:
                if self.status == "waiting-approval":
                    self._set(before)

    def finish(self, status: str, error: BaseException | None = None) -> None:
        if not self.active:
            return
        if self._pending is not None:
            self._pending.cancel()  # (the end is written instead)
            self._pending = None
        if error is not None:
            self.error = {"type": type(error).__name__, "message": str(error)}
        self._set(status)

    async def settle(self, status: str, error: BaseException | None = None) -> Exception | None:
        """`finish`, and wait (a little) until the registry holds it: called before the stream's
        last frame, so that a client that read it and sends its next prompt (`multitask:
        reject`) on any replica finds the run ended.

        Where the run's last history write rides on its lock's release (`LockedStatus.hand`),
        the write is waited for whatever it takes (as the run waited for it before); returned
        is why it could not be stored (the run then ends `failed`, with that error), else
        `None`."""
        self.finish(status, error)
        handoff = self._handoff
        failure = await handoff.written() if handoff is not None and handoff.handed else None
        writer = self._writer
        if writer is not None and not writer.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(writer), SETTLE_SECONDS)
        return failure

    def ended(self, task: asyncio.Task[object]) -> None:
        """The run's task is done: a run that did not say how it ended was stopped (by a
        shutdown: `interrupted`, unless it is durable and resumes; else its client left)."""
        if not self.active:
            return
        if self.live is not None and self.live.suspended:
            if self._carrier is not None:
                self._carrier.no_end()  # (its lock is freed without an end)
            self.control._forget(self)  # it resumes (here or elsewhere) under this id
            return
        self.finish("interrupted" if self.control.stopping else "cancelled")

    def _failed_write(self, failure: Exception) -> None:
        """The run's last history write, handed to its lock's release, could not be stored:
        the run failed with its error, whatever it ended with."""
        self.status = "failed"
        self.error = {"type": type(failure).__name__, "message": str(failure)}
        self._version += 1

    # --- cancelling ---------------------------------------------------------------------------

    def cancel(self, mode: str) -> None:
        """Stop the run (once): a rollback first marks it discarded (its turn is not written)."""
        if self.cancel_mode is not None or not self.active:
            return
        self.cancel_mode = mode
        if self.run is None:
            return  # not started yet: `execute_prompt` finds the request as it starts
        if mode == "rollback":
            self.run.discard()
        if self.live is not None:
            self.live.cancel()

    # --- writing ------------------------------------------------------------------------------

    def _set(self, status: str) -> None:
        self.status = status
        self.changed()

    def changed(self) -> None:
        self._version += 1
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(
                self._write(), name=f"run-status:{self.run_id}"
            )

    async def _write(self) -> None:
        while self._written < self._version:
            version = self._version
            record = self.record()
            carrier = self._carrier
            try:
                if not record.active and carrier is not None:
                    # The end rides on the lock's release where the lock stored the status
                    # (one round trip for both); else, or if that failed, it is put here.
                    self._carrier = None
                    stored = await carrier.end(record)
                    failure = await carrier.written()
                    if failure is not None:
                        self._failed_write(failure)
                        continue  # (the run failed: that end is put here)
                    if stored:
                        self._written = version
                        continue
                await self.control.registry.put(record)
            except Exception as exc:
                fault(log, "could not store a run's status", exc, every=False, run=self.run_id)
            self._written = version
        # Done: its task is let go (a finished task keeps its coroutine), the next change
        # starts another.
        self._writer = None
        if not self.active:
            self.control._forget(self)  # (the registry holds its end now)


class RunControl:
    """This process's tickets over the app's `RunRegistry` (see the module docstring)."""

    def __init__(
        self, registry: RunRegistry, *, owner: str, lease_seconds: float = LEASE_SECONDS
    ) -> None:
        self.registry = registry
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.stopping = False
        self._tickets: dict[str, RunTicket] = {}
        self._keeper: asyncio.Task[None] | None = None
        self._opened = False

    def ticket(
        self,
        *,
        path: str,
        conversation_id: str,
        user_id: str | None,
        run_id: str | None = None,
        status: str = "queued",
    ) -> RunTicket:
        """A new run's ticket (`track` it once its run is stored or started)."""
        return RunTicket(
            self,
            run_id=run_id or new_run_id(),
            path=path,
            conversation_id=conversation_id,
            user_id=user_id,
            status=status,
        )

    def track(self, ticket: RunTicket) -> None:
        """From now on a cancel request reaches `ticket` (its run is stored or started)."""
        self._tickets[ticket.run_id] = ticket

    def local(self, run_id: str) -> RunTicket | None:
        return self._tickets.get(run_id)

    def _forget(self, ticket: RunTicket) -> None:
        if self._tickets.get(ticket.run_id) is ticket:
            del self._tickets[ticket.run_id]

    async def begin(self, ticket: RunTicket, *, exclusive: bool) -> bool:
        """Store a new run before it starts; `exclusive`: only if none is in flight."""
        # Not tracked until it starts (`track`): a run whose stream never started must not be
        # renewed as in flight; its lease runs out and it reads as `interrupted`.
        return await self.registry.begin(ticket.record(), exclusive=exclusive)

    async def get(self, run_id: str) -> RunRecord | None:
        ticket = self._tickets.get(run_id)
        if ticket is not None:
            return ticket.record()  # this process runs it: its newest state, usage included
        record = await self.registry.get(run_id)
        return record.seen_at(time.time()) if record is not None else None

    async def active(self, path: str, conversation_id: str) -> list[RunRecord]:
        now = time.time()
        records = [r.seen_at(now) for r in await self.registry.active(path, conversation_id)]
        return [record for record in records if record.active]

    async def forget(self, path: str, conversation_id: str) -> None:
        """Drop the records of the conversation's runs no longer in flight (a deleted
        conversation)."""
        await self.registry.forget(path, conversation_id)

    async def cancel(self, run_id: str, mode: str) -> None:
        ticket = self._tickets.get(run_id)
        if ticket is not None:
            ticket.cancel(mode)
        await self.registry.cancel(run_id, mode)

    def _on_cancel(self, run_id: str, mode: str) -> None:
        ticket = self._tickets.get(run_id)
        if ticket is not None:
            ticket.cancel(mode)

    # --- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        if self._opened:
            return
        self._opened = True
        listener: CancelListener = self._on_cancel
        await self.registry.open(listener)
        self._keeper = asyncio.get_running_loop().create_task(self._keep(), name="run-control")

    async def _keep(self) -> None:
        """Every third of a lease: renew this process's runs, apply a lost cancel request."""
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            active = [run_id for run_id, ticket in self._tickets.items() if ticket.active]
            try:
                asked = await self.registry.heartbeat(self.owner, active, self.lease_seconds)
            except Exception as exc:
                fault(log, "run status upkeep failed; retrying", exc, every=False)
                asked = {}
            reraise_cancellation()
            for run_id, mode in asked.items():
                self._on_cancel(run_id, mode)

    async def aclose(self) -> None:
        """Shutdown (after the journal stopped every run): write their last states, stop."""
        self.stopping = True
        writers = [t._writer for t in self._tickets.values() if t._writer is not None]
        pending = [w for w in writers if not w.done()]
        if pending:
            await asyncio.wait(pending, timeout=5)
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        if self._opened:
            self._opened = False
            await self.registry.aclose()


class InProcessRunRegistry:
    """The embedded `contracts.RunRegistry`: records in this process, cancel requests direct."""

    name = "memory"

    def __init__(self, *, keep: int = KEEP_RECORDS) -> None:
        self.keep = keep
        self._records: OrderedDict[str, RunRecord] = OrderedDict()
        self._cancels: dict[str, str] = {}
        self._listener: CancelListener | None = None

    async def open(self, on_cancel: CancelListener) -> None:
        self._listener = on_cancel

    async def aclose(self) -> None:
        self._listener = None

    async def put(self, record: RunRecord) -> None:
        self._records[record.run_id] = record
        self._records.move_to_end(record.run_id)
        if not record.active:
            self._cancels.pop(record.run_id, None)
        while len(self._records) > self.keep:
            oldest, _ = self._records.popitem(last=False)
            self._cancels.pop(oldest, None)

    async def begin(self, record: RunRecord, *, exclusive: bool) -> bool:
        if exclusive and await self.active(record.path, record.conversation_id):
            return False
        await self.put(record)
        return True

    async def get(self, run_id: str) -> RunRecord | None:
        return self._records.get(run_id)

    async def active(self, path: str, conversation_id: str) -> list[RunRecord]:
        return [
            record
            for record in self._records.values()
            if record.active and record.path == path and record.conversation_id == conversation_id
        ]

    async def forget(self, path: str, conversation_id: str) -> None:
        now = time.time()
        for run_id, record in list(self._records.items()):
            if (
                record.path == path
                and record.conversation_id == conversation_id
                and not record.seen_at(now).active
            ):
                del self._records[run_id]
                self._cancels.pop(run_id, None)

    async def cancel(self, run_id: str, mode: str) -> None:
        record = self._records.get(run_id)
        if record is None or not record.active:
            return
        self._cancels[run_id] = mode
        if self._listener is not None:
            self._listener(run_id, mode)

    async def heartbeat(
        self, owner: str, run_ids: Sequence[str], lease_seconds: float
    ) -> dict[str, str]:
        until = time.time() + lease_seconds
        for run_id in run_ids:
            record = self._records.get(run_id)
            if record is not None and record.active:
                self._records[run_id] = replace(record, lease_until=until)
        return {run_id: self._cancels[run_id] for run_id in run_ids if run_id in self._cancels}
