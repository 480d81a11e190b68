"""`StoreWriter`: one run's frames (and checkpoints) written to a `RunStore`, grouped.

While one write is in flight, what the run publishes meanwhile waits and goes in the next one,
so a streamed answer of many small frames costs a few writes, not one each. Payloads are
encoded when they are published: what is written is what was sent, whatever changes later.
The frame feed (`kernel.feed`) and the durable journal (`durable.writer`) build on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .._contracts import RunStore, StoredRun
from .._errors import LeaseLost
from .._events import Frame
from .._jsontext import compact_json
from .._log import fault, get_logger

log = get_logger(__name__)


def encode(value: Any) -> str:
    """JSON as a `RunStore` takes it: compact, ASCII (a lone surrogate a model sent survives as
    an escape, and so does a NUL, which PostgreSQL's text refuses as a raw character)."""
    return _ENCODE(value)


_ENCODE = compact_json(default=str)


class StoreWriter:
    """One run's writes to its store, grouped: what comes while a write is in flight goes in
    the next one. Readers are told each stored seq (`on_stored`)."""

    def __init__(
        self,
        store: RunStore,
        run_id: str,
        *,
        owner: str,
        lease_seconds: float,
        create: StoredRun | None,
        on_stored: Callable[[int], None] | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.on_stored = on_stored
        self.on_lost: Callable[[], None] | None = None
        """Called once if the store says another owner took the run over (`LeaseLost`)."""
        self.lost = False
        self._create = create
        self._frames: list[tuple[int, str, str]] = []
        self._checkpoints: list[tuple[str, str]] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> bool:
        """Something given is not written yet."""
        return bool(self._frames or self._checkpoints or self._create is not None)

    def frame(self, frame: Frame) -> None:
        self._frames.append((frame.seq, frame.event, self.frame_payload(frame)))
        self._kick(now=frame.terminal)

    def frame_payload(self, frame: Frame) -> str:
        """A frame's data as the store keeps it."""
        return encode(frame.data)

    def checkpoint(self, key: str, value: Any) -> None:
        self._checkpoints.append((key, encode(value)))
        self._kick(now=True)

    def _kick(self, *, hold: bool = False, now: bool = False) -> None:
        """Start writing what is pending, unless a write is in flight (it takes it next)."""
        if self.lost:
            self._frames.clear()
            self._checkpoints.clear()
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._drain(), name=f"journal:{self.run_id}"
            )

    def _write_now(self) -> bool:
        """Write what is pending synchronously, if this writer can (`False`: it did not)."""
        return False

    async def _drain(self) -> None:
        while self.pending:
            if self._write_now():
                continue
            frames, self._frames = self._frames, []
            checkpoints, self._checkpoints = self._checkpoints, []
            create, self._create = self._create, None
            try:
                await self.store.append(
                    self.run_id,
                    frames,
                    checkpoints,
                    create=create,
                    owner=self.owner,
                    lease_seconds=self.lease_seconds,
                )
            except LeaseLost:
                self.lose(exc_info=True)
                return
            except Exception as exc:
                # The run goes on (its client still gets its frames); only a restart would
                # lose what this write held. Said loudly: durability is degraded.
                fault(
                    log,
                    "durable run journal write failed; frames sent unjournalled",
                    exc,
                    level="error",
                    every=False,
                    run=self.run_id,
                )
            self.stored(frames)

    def lose(self, *, exc_info: bool = False) -> None:
        """The store refused a write (`LeaseLost`): another process owns the run now, or ended
        it. Nothing more is written; `on_lost` is told."""
        log.warning(
            "another process took this durable run over; stopping it here",
            run=self.run_id,
            exc_info=exc_info,
        )
        self.lost = True
        self._frames.clear()
        self._checkpoints.clear()
        if self.on_lost is not None:
            self.on_lost()

    def stored(self, frames: list[tuple[int, str, str]]) -> None:
        if frames and self.on_stored is not None:
            self.on_stored(frames[-1][0])

    async def flushed(self) -> None:
        """Return once everything given so far is stored (or its write failed)."""
        if self.pending:
            self._kick(now=True)
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
