"""Durable runs: the run journal that outlives the process (`DurableRuns`).

It is the embedded journal (`kernel.live.LiveRuns`) with a `contracts.RunStore` behind it:
every frame and checkpoint is written to the store (`durable.writer.DurableWriter`) before any
reader sees it: frames are appended to the in-memory journal at once, but a reader only gets
those the store holds. `open` claims the runs a dead process left unfinished and starts them
again (`resume`), keeps this process's leases alive and expires finished records; `aclose`
(shutdown) ends every reader with an `error` frame and leaves the runs unfinished in the
store, released for the next start. What a resumed run replays is `durable.replay`'s.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from typing import Any

from .._cancel import reraise_cancellation
from .._contracts import FrameSink, LiveRunHandle, Run, RunStore, StoredRun
from .._events import Frame
from .._kernel.feed import CLAIM_BATCH, abandon
from .._kernel.live import JOURNAL_FRAMES, KEEP_FINISHED_SECONDS, LEASE_SECONDS, LiveRun, LiveRuns
from .._kernel.remote import resolved
from .._kernel.writer import encode
from .._log import fault, get_logger
from .replay import ENDED, DurableReplay
from .writer import DurableWriter

log = get_logger(__name__)

Resume = Callable[[LiveRunHandle, StoredRun], Coroutine[Any, Any, Any]]


class DurableRun(LiveRun):
    """A live run whose journal is also written to a `RunStore` (readers wait for it)."""

    def __init__(
        self,
        path: str,
        conversation_id: str,
        user_id: str | None,
        *,
        session_id: str | None,
        writer: DurableWriter,
        replay: DurableReplay,
        checkpoints: Mapping[str, Any] | None = None,
        frames: list[Frame] | None = None,
    ) -> None:
        super().__init__(
            path, conversation_id, user_id, session_id=session_id, writer=writer, frames=frames
        )
        self.writer = writer
        self.note: Callable[[str, Any], None] = writer.checkpoint
        """`checkpoint` without waiting, as a plain call: the writer's own (a model turn makes
        three, and a call less each)."""
        self.checkpoints: Mapping[str, Any] = checkpoints or {}
        """What a resumed run's first life journalled (model turns, tool results), by key."""
        self._replay = replay

    def bind(self, run: Run) -> FrameSink:
        """Put the run's replay state in `run.state`; its frames go through it."""
        return self._replay.bind(run, self)

    async def checkpoint(self, key: str, value: Any, *, wait: bool = False) -> None:
        """Journal `value` under `key` in order with the frames; `wait` until it is stored."""
        self.writer.checkpoint(key, value)
        if wait:
            await self.writer.flushed()

    def stopped_by_client(self) -> None:
        # Journalled before the cancellation writes anything: a run its client (or a cancel
        # request) stopped is over, and a restart that finds it unfinished must not run it
        # again.
        self.writer.checkpoint(ENDED, "client-left")


class DurableRuns(LiveRuns):
    """The durable `contracts.RunJournal`: `LiveRuns` journalled in `store`."""

    store: RunStore

    def __init__(
        self,
        store: RunStore,
        *,
        lease_seconds: float = LEASE_SECONDS,
        keep_seconds: float = KEEP_FINISHED_SECONDS,
    ) -> None:
        super().__init__(lease_seconds=lease_seconds, keep_seconds=keep_seconds)
        self.store = store
        self.replay = DurableReplay()
        """The hooks that replay a resumed run (`hooks`)."""
        self._resume: Resume | None = None

    @property
    def durable(self) -> bool:
        return True

    @property
    def store_name(self) -> str | None:
        return self.store.name

    @property
    def hooks(self) -> DurableReplay:
        return self.replay

    @property
    def shared(self) -> RunStore:
        return self.store

    def _new_run(
        self,
        path: str,
        conversation_id: str,
        user_id: str | None,
        session_id: str | None,
        message: str,
        run_id: str,
    ) -> LiveRun:
        session_id = session_id or uuid.uuid4().hex
        # Stored as JSON text (ASCII): any prompt the run accepts is one every store keeps (a
        # NUL, which PostgreSQL's text refuses raw, or a lone surrogate).
        record = self._record(path, conversation_id, user_id, session_id, encode(message), run_id)
        writer = self._writer(record.run_id, record)
        return DurableRun(
            path,
            conversation_id,
            user_id,
            session_id=session_id,
            writer=writer,
            replay=self.replay,
        )

    def _writer(self, run_id: str, create: StoredRun | None) -> DurableWriter:
        """The writer of run `run_id` (`create`: its record, for a new run's first write)."""
        return DurableWriter(
            self.store, run_id, owner=self.owner, lease_seconds=self.lease_seconds, create=create
        )

    async def open(self, resume: Resume) -> None:
        """Open the store, resume the unfinished runs it holds, and keep leases alive."""
        if self._opened:
            return
        self._opened = True
        await self.store.open()
        self._resume = resume
        await self._claim()
        self._keeper = asyncio.get_running_loop().create_task(self._keep(), name="run-journal")

    async def _claim(self) -> None:
        for stored in await self.store.claim(self.owner, self.lease_seconds, CLAIM_BATCH):
            try:
                await self._resume_one(stored)
            except Exception:
                # One unreadable run must not keep the others (or the server) from starting.
                log.error("could not resume a durable run", run=stored.run_id, exc_info=True)

    async def _resume_one(self, stored: StoredRun) -> None:
        assert self._resume is not None
        resume = self._resume
        checkpoints, frames = await self.store.load(stored.run_id, JOURNAL_FRAMES)
        if ENDED in checkpoints or (frames and frames[-1].terminal):
            # It ended (its turn is in the history: that is journalled before the last frame)
            # or its client stopped it, but it died before it was marked finished: nothing to
            # run again. Said at INFO: a claimed run that is not resumed is otherwise silent.
            log.info(
                "a claimed durable run had ended; marked finished, not resumed",
                endpoint=stored.path,
                conversation=stored.conversation_id,
                run=stored.run_id,
                ended=checkpoints.get(ENDED, "terminal frame"),
            )
            await self.store.finish(stored.run_id)
            return
        writer = self._writer(stored.run_id, None)
        live = DurableRun(
            stored.path,
            stored.conversation_id,
            stored.user_id,
            session_id=stored.session_id,
            writer=writer,
            checkpoints=checkpoints,
            frames=resolved(frames, checkpoints),
            replay=self.replay,
        )
        live.detached = True
        log.info(
            "resuming a durable run",
            endpoint=stored.path,
            conversation=stored.conversation_id,
            run=stored.run_id,
            checkpoints=len(checkpoints),
            last_seq=live.start_seq,
        )

        asked = replace(stored, message=_message(stored.message))

        def work(handle: LiveRunHandle) -> Coroutine[Any, Any, Any]:
            return resume(handle, asked)

        self._launch(live, work)

    async def _keep(self) -> None:
        """Every third of a lease: extend ours, take over expired ones, expire finished ones."""
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.store.heartbeat(self.owner, self.lease_seconds)
                await self._claim()
                await self.store.expire(time.time() - self.keep_seconds)
                await abandon(self.store)
            except Exception as exc:
                fault(log, "run journal upkeep failed; retrying", exc, every=False)
            reraise_cancellation()  # (one the store's driver swallowed: `_cancel`)

    def _finish(self, live: LiveRun) -> None:
        self._close_later(self._finish_durable(live))

    async def _finish_durable(self, live: LiveRun) -> None:
        """Store the run's last frames before readers see its end, then compact it (unless a
        shutdown suspended it: it stays unfinished, to resume)."""
        writer = live._writer
        assert writer is not None
        try:
            await writer.flushed()
        finally:
            self._finished_now(live)
        if live.suspended:
            return
        try:
            await self.store.finish(writer.run_id)
        except Exception as exc:
            fault(
                log,
                "could not mark a durable run finished",
                exc,
                level="error",
                every=False,
                run=writer.run_id,
            )


def _message(stored: str) -> str:
    """The prompt of a stored run (`encode`d; one journalled before it was kept as it is)."""
    try:
        message = json.loads(stored)
    except ValueError:
        return stored
    return message if isinstance(message, str) else stored
