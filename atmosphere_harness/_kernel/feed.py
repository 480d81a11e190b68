"""The frame feed: with durable runs off and a shared store that is a `contracts.RunFeed`
(PostgreSQL or Redis), a run's frames are shared there so that another replica can follow it
(`kernel.remote.RemoteRun`).

Frames go to the store grouped and in the background, but readers never wait for it, nothing
else is journalled (no checkpoints, no message), and the runs are owned as
`contracts.FEED_OWNER`..., so no replica ever claims or resumes them. A write that fails or lags
costs remote readers frames, never the run or its local readers. A replica that dies leaves its
runs unfinished: once their lease runs out, any replica's upkeep ends them with an `error` frame
(`RunFeed.abandon`), so their readers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

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
FEED_FIRST_SECONDS = 0.01
"""The frame feed's first write (the run's record) waits this long, or until the run's terminal
frame if that comes sooner: a run that ends within it (a scripted or cached answer, a refusal)
is shared in one write instead of two, and another replica finds a longer one 10 ms after it
started instead of about a round trip after (a re-attach there answers 404 meanwhile)."""
ABANDONED = "the server running this run stopped; the frames it had not shared are lost"
"""The frame feed's last word on a run whose replica died (`RunFeed.abandon`)."""
STOPPED = "the run was stopped before it finished"
"""The frame feed's last frame for a run that ended without one (its client left)."""


class FeedWriter(StoreWriter):
    """The frame feed's writer: a `StoreWriter` whose first write (the run's record, so that
    other replicas find the run) goes after `FEED_FIRST_SECONDS`, and whose later writes start
    at least `FEED_LINGER_SECONDS` apart (a frame that comes later than that after the last
    write goes at once); the terminal frame cuts either wait short. A run that ends within the
    first wait costs one write (with its terminal frame, which also finishes it: `RunStore`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ended = asyncio.Event()
        self._written_at = -FEED_LINGER_SECONDS
        """When the last write started (the loop's clock)."""

    def frame(self, frame: Frame) -> None:
        if frame.terminal:
            self._ended.set()
        super().frame(frame)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        if self._create is not None:
            wait = FEED_FIRST_SECONDS
        else:
            wait = self._written_at + FEED_LINGER_SECONDS - loop.time()
        if wait > 0 and not self._ended.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._ended.wait()
        self._written_at = loop.time()
        await super()._drain()


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
