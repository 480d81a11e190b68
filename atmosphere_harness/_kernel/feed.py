"""The frame feed: with durable runs off and a shared store that is a `contracts.RunFeed`
(PostgreSQL, Redis), a run's frames are shared there once another replica asks for them
(`RunFeed.ask`: a client re-attached there), so that that replica can follow it
(`kernel.remote.RemoteRun`). A run nobody follows from elsewhere writes nothing.

Once asked, a run writes the frames its journal keeps, then each new one, grouped and in the
background: readers never wait for it, nothing else is journalled (no checkpoints, no
message), and the runs are owned as `contracts.FEED_OWNER`..., so no replica ever claims or
resumes them. A store that can write several runs' frames at once (`FeedBatches`: PostgreSQL,
Redis) gets the frames between a run's first write and its end from every shared run of the
process together (`FeedBatch`): one write for all the runs that streamed a token meanwhile,
instead of one per token per run. A write that fails or lags costs remote readers frames, never
the run or its local readers. A replica that dies leaves its shared runs unfinished: once their
lease runs out, any replica's upkeep ends them with an `error` frame (`RunFeed.abandon`), so
their readers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from .._contracts import RunFeed, RunStore, StoredRun
from .._errors import LeaseLost
from .._events import Frame
from .._log import fault, get_logger
from .writer import StoreWriter

log = get_logger(__name__)

CLAIM_BATCH = 64
"""Runs one upkeep scan ends (or claims) at most (the next scan takes more)."""
FEED_LINGER_SECONDS = 0.01
"""The frame feed starts a run's writes at least this far apart: a frame after a quiet spell
(a model's streamed token, at tens a second) is written at once, a burst is gathered into one
write. So a run costs about 100 writes a second at most, and a remote reader (woken by each write's
notice, `RunFeed.watch`) gets a frame at most this much later than it would unbatched."""
ABANDONED = "the server running this run stopped; the frames it had not shared are lost"
"""The frame feed's last word on a run whose replica died (`RunFeed.abandon`)."""
STOPPED = "the run was stopped before it finished"
"""The frame feed's last frame for a run that ended without one (its client left)."""


class FeedWriter(StoreWriter):
    """The frame feed's writer: a `StoreWriter` that writes nothing until `share` (another
    replica asked for the run). Then its first write (the run's record with the frames it was
    given) goes at once, and its later writes start at least `FEED_LINGER_SECONDS` apart (a
    frame that comes later than that after the last write goes at once); the terminal frame
    cuts the wait short. A run shared after its end costs one write (with its terminal frame,
    which also finishes it: `RunStore`).

    With a `batch`, the frames between the first write and the terminal frame go in the
    process's `FeedBatch` instead (no linger: the batch's next write takes them), and the
    run's own writes (the first, the end) wait for the batch write holding its earlier frames.
    """

    def __init__(self, *args: Any, batch: FeedBatch | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sharing = False
        """Asked for: frames are written (before, `frame` drops them: the journal has them)."""
        self._ended = asyncio.Event()
        self._written_at = -FEED_LINGER_SECONDS
        """When the last write started (the loop's clock)."""
        self._batch = batch
        self._in_batch: asyncio.Future[None] | None = None
        """The batch write holding some of this run's frames, while it is in flight."""

    @property
    def feed_store(self) -> FeedStore | None:
        store = self.store
        return store if isinstance(store, FeedStore) else None

    @property
    def pending(self) -> bool:
        return self.sharing and super().pending

    def frame(self, frame: Frame) -> None:
        if not self.sharing:
            return
        if frame.terminal:
            self._ended.set()
        super().frame(frame)

    def share(self, frames: Sequence[Frame]) -> None:
        """Start sharing: write `frames` (what the run's journal keeps), then each new one."""
        if self.sharing or self.lost:
            return
        self.sharing = True
        for frame in frames:
            self.frame(frame)
        if not self._writing():
            StoreWriter._kick(self, now=True)  # (the record, even without a frame yet)

    def _kick(self, *, hold: bool = False, now: bool = False) -> None:
        batch = self._batch
        if (
            batch is not None
            and not self.lost
            and self._create is None
            and not self._ended.is_set()
            and not self._writing()
        ):
            batch.add(self)
            return
        super()._kick(hold=hold, now=now)

    def _writing(self) -> bool:
        """This run's own write (its first, or its end) is under way."""
        return self._task is not None and not self._task.done()

    async def _after_batch(self) -> None:
        while self._in_batch is not None:
            await asyncio.shield(self._in_batch)

    async def _drain(self) -> None:
        await self._after_batch()  # (its earlier frames first)
        loop = asyncio.get_running_loop()
        wait = 0.0
        if self._create is None:
            wait = self._written_at + FEED_LINGER_SECONDS - loop.time()
        if wait > 0 and not self._ended.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._ended.wait()
        self._written_at = loop.time()
        await super()._drain()

    async def flushed(self) -> None:
        while True:
            await self._after_batch()
            if self.pending and not self._writing():
                StoreWriter._kick(self, now=True)
            if not self._writing():
                return
            assert self._task is not None
            await asyncio.shield(self._task)


@runtime_checkable
class FeedBatches(Protocol):
    """A `RunStore` that writes frames of several frame-feed runs in one round trip."""

    async def append_feeds(
        self, owner: str, runs: Sequence[tuple[str, Sequence[tuple[int, str, str]]]]
    ) -> dict[str, str]:
        """Write each run's frames (`(run_id, [(seq, event, data), ...])`, none terminal, every
        run already created by `owner`'s first `append`), as that run's `append` would, and
        tell its readers (`RunFeed.watch`). Returns the runs it did not write, each with why:
        `ended` (finished, or no longer `owner`'s: `LeaseLost`) or `missing` (no such run)."""
        ...


class FeedBatch:
    """The frame feed's writes for every run of one process, grouped (`FeedBatches`).

    A run's writer hands its frames here (`add`) between its first write and its end. A write
    starts at once when none is in flight, with the frames of every run waiting then; what
    comes while it is in flight goes in the next one, started as soon as it returns. No timer:
    a lone token is written at once, and a replica streaming thousands of runs makes one write
    per round trip instead of one per token per run.
    """

    def __init__(self, store: FeedBatches, owner: str) -> None:
        self.store = store
        self.owner = owner
        self._ready: dict[FeedWriter, None] = {}
        """The writers with frames to write (in the order they came: a set that keeps it)."""
        self._task: asyncio.Task[None] | None = None

    def add(self, writer: FeedWriter) -> None:
        self._ready[writer] = None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="run-feed")

    async def flushed(self) -> None:
        """Return once the writes under way are done."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        try:
            while self._ready:
                ready, self._ready = self._ready, {}
                await self._write(ready)
        finally:
            self._task = None

    async def _write(self, ready: dict[FeedWriter, None]) -> None:
        taken: list[tuple[FeedWriter, list[tuple[int, str, str]]]] = []
        for writer in ready:
            # A run whose own write is under way (its end) writes its frames itself.
            if writer.lost or writer._writing() or not writer._frames:
                continue
            frames, writer._frames = writer._frames, []
            taken.append((writer, frames))
        if not taken:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for writer, _ in taken:
            writer._in_batch = done
        refused: dict[str, str] = {}
        try:
            refused = await self.store.append_feeds(
                self.owner, [(writer.run_id, frames) for writer, frames in taken]
            )
        except Exception as exc:
            self._failed([writer for writer, _ in taken])
            fault(
                log,
                "could not share runs' frames with other replicas",
                exc,
                every=False,
                runs=len(taken),
            )
        finally:
            done.set_result(None)
            for writer, _ in taken:
                if writer._in_batch is done:
                    writer._in_batch = None
        for writer, _ in taken:
            why = refused.get(writer.run_id)
            if why == "ended":
                writer.lose()
            elif why is not None:
                self._failed([writer])
                log.warning(
                    "could not share a run's frames: it is not in the store", run=writer.run_id
                )

    @staticmethod
    def _failed(writers: list[FeedWriter]) -> None:
        for writer in writers:
            store = writer.feed_store
            if store is not None:
                store.failed = True


class FeedStore:
    """The frame feed's store as its `StoreWriter` sees it: a failed write is a warning
    (remote readers miss those frames; the run and its local readers do not notice), not the
    loss of durability a durable journal's failed write is."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.name = store.name
        self.failed = False
        """A write failed: the run's end may not be in the store (`_finish_feed` finishes it)."""

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
        try:
            await self.store.append(
                run_id, frames, checkpoints, create=create, owner=owner, lease_seconds=lease_seconds
            )
        except LeaseLost:
            raise  # ended as abandoned (this replica stalled past its lease): stop sharing
        except Exception as exc:
            self.failed = True
            fault(
                log,
                "could not share a run's frames with other replicas",
                exc,
                every=False,
                run=run_id,
            )

    # The rest of `RunStore` is never called on a writer's store.

    async def open(self) -> None:
        await self.store.open()

    async def aclose(self) -> None:
        await self.store.aclose()

    async def load(self, run_id: str, limit: int) -> tuple[dict[str, Any], list[Frame]]:
        return await self.store.load(run_id, limit)

    async def claim(self, owner: str, lease_seconds: float, limit: int) -> list[StoredRun]:
        return []

    async def heartbeat(self, owner: str, lease_seconds: float) -> None:
        await self.store.heartbeat(owner, lease_seconds)

    async def release(self, owner: str) -> None:
        await self.store.release(owner)

    async def finish(self, run_id: str) -> None:
        await self.store.finish(run_id)

    async def expire(self, before: float) -> int:
        return await self.store.expire(before)


async def abandon(store: RunStore) -> None:
    """End the frame-feed runs of replicas that died (their lease ran out), if `store` can."""
    feed: object = store
    if isinstance(feed, RunFeed):
        await feed.abandon(ABANDONED, CLAIM_BATCH)
