"""`RemoteRun`: a run another replica executes, followed from the shared `RunStore`.

With a shared store that is a `contracts.RunFeed` (PostgreSQL, Redis), as the durable journal
or as the frame feed (durable runs off, `kernel.feed`), a client that
re-attaches with `GET P/conversations/{id}/events` on a replica that does not run the
conversation's run gets a `RemoteRun` from `LiveRuns.find`: it replays the stored frames after
the client's `Last-Event-ID` and then reads again each time the store says the run has new
frames (`RunFeed.watch`: a notice the writing replica sends once they are committed, `NOTIFY`
on PostgreSQL, pub/sub on Redis), so a remote reader lags the replica that runs the run by one
write, one notice and one read: a few milliseconds. A notice lost (while the listening
connection reconnects) costs at most `POLL_SECONDS`, the slow poll kept as a safety net. A
durable run taken over by a third replica (its owner died) goes on in the same rows, so the
reader never notices the move. A frame-feed run whose replica died is never taken over: once
its lease ran out, a replica's upkeep ends it with a terminal `error` frame
(`RunFeed.abandon`), which ends the reader.

A `RemoteRun` only reads: it cannot publish, hold or cancel the run (a reader leaving never
stops a run on another replica, unlike a local reader of an unheld run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from typing import Any

from .. import _events as events
from .._contracts import AskListener, FrameSink, Run, RunFeed, RunStore, StoredRun
from .._events import Frame
from .._log import fault, get_logger

log = get_logger(__name__)

REFERENCE = "$model"
"""A stored `tool-start` frame's `arguments` as `{"$model": "<checkpoint key>"}`: the very
arguments of that call in that model turn's checkpoint (a durable journal stores a large
argument once, `durable.writer`)."""
POLL_SECONDS = 1.0
"""How often a remote reader asks the store for new frames when no notice came (the safety net
for a notice lost: `RunFeed.watch` wakes it as soon as frames are stored)."""
BATCH = 256
"""Frames read per query."""


class RemoteRun:
    """A `contracts.LiveRunHandle` for reading a run another replica executes."""

    def __init__(
        self,
        feed: RunFeed,
        stored: StoredRun,
        resolve: Callable[[list[Frame], Mapping[str, Any]], list[Frame]],
        store: RunStore,
        *,
        durable: bool = True,
    ) -> None:
        self.feed = feed
        self.store = store
        self._resolve = resolve
        """Frames as stored -> as sent (a `tool-start` refers to its model turn's checkpoint)."""
        self._checkpoints: Mapping[str, Any] = {}
        self.run_id = stored.run_id
        self.path = stored.path
        self.conversation_id = stored.conversation_id
        self.user_id = stored.user_id
        self.session_id: str | None = stored.session_id
        self.task: asyncio.Task[Any] | None = None
        self._finished = False
        self._interrupt: str | None = None
        self._wakes: set[asyncio.Event] = set()
        """Each reader's wake-up (`interrupt` sets them all)."""
        self._durable = durable
        """Followed from a durable journal, or from the frame feed (durable runs off)."""

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def held(self) -> bool:
        return False

    @property
    def durable(self) -> bool:
        return self._durable

    @property
    def suspended(self) -> bool:
        return False

    async def publish(self, frame: Frame) -> None:
        raise RuntimeError("a remote run is read-only: its replica publishes its frames")

    def bind(self, run: Run) -> FrameSink:
        raise RuntimeError("a remote run is read-only: its replica runs it")

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        yield

    def cancel(self) -> bool:
        """Nothing here to stop: its replica runs it (`kernel.control` reaches that one)."""
        return False

    async def follow(self, after: int = 0) -> AsyncGenerator[Frame, None]:
        """The stored frames after `after`, then each new one, until the run ends."""
        async with contextlib.aclosing(self.follow_batches(after)) as batches:
            async for batch in batches:
                for frame in batch:
                    yield frame

    async def follow_batches(self, after: int = 0) -> AsyncGenerator[list[Frame], None]:
        """`follow`, each read of the feed in one list."""
        wake = asyncio.Event()

        def woken(seq: int) -> None:
            if seq == 0 or seq > after:  # not a notice of frames this reader already has
                wake.set()

        unwatch = self.feed.watch(self.run_id, woken)
        self._wakes.add(wake)
        try:
            while True:
                # Cleared before the read: a notice that comes during it makes the wait below
                # return at once, so none is lost between reading and waiting.
                wake.clear()
                frames, finished = await self.feed.frames_after(self.run_id, after, BATCH)
                read = len(frames)
                frames = await self._as_sent(frames)
                end = next((i for i, frame in enumerate(frames) if frame.terminal), None)
                if end is not None:
                    frames = frames[: end + 1]
                if frames:
                    after = frames[-1].seq
                    yield frames
                if end is not None:
                    self._finished = True
                    return
                if read == BATCH:
                    continue
                if finished:
                    # Ended (its last frames were read above, or compacted away already).
                    self._finished = True
                    return
                if self._interrupt is not None:
                    yield [
                        Frame(
                            events.ERROR,
                            {"message": self._interrupt, "type": "ServerShutdown"},
                            self.session_id or "",
                            self.conversation_id,
                            after,
                        )
                    ]
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), POLL_SECONDS)
        finally:
            self._wakes.discard(wake)
            unwatch()

    async def _as_sent(self, frames: list[Frame]) -> list[Frame]:
        resolved = self._resolve(frames, self._checkpoints)
        if any(_refers(frame) for frame in resolved):
            # A model turn this reader has not read yet: (re)read the run's checkpoints.
            self._checkpoints, _ = await self.store.load(self.run_id, 0)
            resolved = self._resolve(frames, self._checkpoints)
        return resolved

    def interrupt(self, message: str) -> None:
        """This server stops: end the reader (the run goes on on its own replica)."""
        self._interrupt = message
        for wake in self._wakes:
            wake.set()


def _refers(frame: Frame) -> bool:
    arguments = frame.data.get("arguments")
    return (
        frame.event == events.TOOL_START
        and isinstance(arguments, Mapping)
        and REFERENCE in arguments
    )


def resolved(frames: list[Frame], checkpoints: Mapping[str, Any]) -> list[Frame]:
    """Stored frames as they were sent: references (`REFERENCE`) replaced by arguments."""
    out = []
    for frame in frames:
        arguments = frame.data.get("arguments")
        if frame.event == events.TOOL_START and isinstance(arguments, Mapping):
            key = arguments.get(REFERENCE)
            turn = checkpoints.get(key) if isinstance(key, str) else None
            if isinstance(turn, Mapping):
                call_id = frame.data.get("toolCallId")
                for call in turn.get("calls") or ():
                    if call[0] == call_id:
                        frame = Frame(
                            frame.event,
                            {**frame.data, "arguments": call[2]},
                            frame.session_id,
                            frame.conversation_id,
                            frame.seq,
                        )
                        break
        out.append(frame)
    return out


def ask_payload(path: str, conversation_id: str, session_id: str | None) -> str:
    """A `RunFeed.ask` as its stores send it (JSON: the same on PostgreSQL and Redis)."""
    return json.dumps([path, conversation_id, session_id])


def deliver_ask(payload: str, on_ask: AskListener) -> None:
    """Hand a heard ask to `on_ask`; a payload of any other shape is ignored, and a failure of
    `on_ask` is logged, never raised into the listener that heard it (it goes on listening)."""
    try:
        path, conversation_id, session_id = json.loads(payload)
    except (ValueError, TypeError):
        return
    if not (isinstance(path, str) and isinstance(conversation_id, str)):
        return
    try:
        on_ask(path, conversation_id, session_id if isinstance(session_id, str) else None)
    except Exception as exc:
        fault(log, "could not share a run another replica asked for", exc, every=False)


class RunWatchers:
    """The readers of this process waiting for new frames, by run: what a shared store's
    `RunFeed.watch` keeps, and wakes on each notice that a run's frames were stored.

    A notice's text is `"{seq} {run_id}"`: frames of `run_id` up to `seq` are stored.

    Each run's notices go to a channel of that run's own, so that a replica pays only for the
    runs it has readers of (not for every write of the deployment). With `subscribe` and
    `unsubscribe` (the store's listening connection), the watchers keep that connection on
    exactly the runs with a reader here: a run's first reader subscribes it, its last one
    leaving unsubscribes it, one change at a time in the background. The store wakes a run's
    readers once its subscription is in place (`subscribed_to`): a write stored between a reader's
    first read and the subscription sent no notice this replica could hear, so they read again.
    """

    def __init__(
        self,
        subscribe: Callable[[list[str]], Awaitable[None]] | None = None,
        unsubscribe: Callable[[list[str]], Awaitable[None]] | None = None,
    ) -> None:
        self._watching: dict[str, set[Callable[[int], None]]] = {}
        self._subscribe = subscribe
        self._unsubscribe = unsubscribe
        self._subscribed: set[str] = set()
        """The runs the listening connection is subscribed to (or being subscribed to)."""
        self._heard: set[str] = set()
        """The runs whose subscription the store confirmed (`subscribed_to`)."""
        self._generation = 0
        """Counts `lost()`: a change sent on a connection since lost is not counted as made."""
        self._syncing: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._watching)

    @property
    def listening(self) -> frozenset[str]:
        """The runs whose notices this process hears (their subscription was confirmed)."""
        return frozenset(self._heard)

    def watch(self, run_id: str, wake: Callable[[int], None]) -> Callable[[], None]:
        wakes = self._watching.setdefault(run_id, set())
        first = not wakes
        wakes.add(wake)
        if first:
            self.sync()

        def unwatch() -> None:
            wakes.discard(wake)
            if not wakes and self._watching.get(run_id) is wakes:
                del self._watching[run_id]
                self.sync()

        return unwatch

    def notified(self, text: str) -> None:
        """Wake the readers of the run a notice names."""
        seq, _, run_id = text.partition(" ")
        wakes = self._watching.get(run_id)
        if wakes and seq.isdigit():
            for wake in list(wakes):
                wake(int(seq))

    def subscribed_to(self, run_id: str) -> None:
        """The run's notices are heard from now on: its readers read what came before."""
        if run_id in self._subscribed:
            self._heard.add(run_id)
        for wake in list(self._watching.get(run_id, ())):
            wake(0)

    def wake_all(self) -> None:
        """Notices may have been lost (the listening connection was down): every reader reads."""
        for wakes in list(self._watching.values()):
            for wake in list(wakes):
                wake(0)

    def resubscribed(self) -> None:
        """The listening connection was reopened with every subscription it had (PostgreSQL's
        `LISTEN`s are kept and sent again): every reader reads what it may have missed."""
        self._heard = set(self._subscribed)
        self.wake_all()

    def lost(self) -> None:
        """The listening connection was replaced: the new one is subscribed to nothing yet."""
        self._generation += 1
        self._subscribed.clear()
        self._heard.clear()

    def sync(self) -> None:
        """Bring the listening connection's subscriptions in line with the runs read here (in
        the background; a change that fails waits for the connection's replacement, `lost`)."""
        if self._subscribe is None:
            return
        if self._syncing is None or self._syncing.done():
            self._syncing = asyncio.get_running_loop().create_task(
                self._sync(), name="run-notice-subscriptions"
            )

    async def _sync(self) -> None:
        assert self._subscribe is not None
        assert self._unsubscribe is not None
        while True:
            generation = self._generation
            gone = [run for run in self._subscribed if run not in self._watching]
            new = [run for run in self._watching if run not in self._subscribed]
            if not gone and not new:
                return
            try:
                if gone:
                    self._subscribed.difference_update(gone)
                    self._heard.difference_update(gone)
                    await self._unsubscribe(gone)
                if new:
                    self._subscribed.update(new)
                    await self._subscribe(new)
            except Exception as exc:
                if generation == self._generation:
                    self._subscribed.difference_update(new)
                fault(
                    log,
                    "could not change the runs whose notices this replica hears",
                    exc,
                    every=False,
                )
                return
            if generation != self._generation:
                self._subscribed.clear()  # sent on a connection since replaced: start over
                self._heard.clear()

    async def aclose(self) -> None:
        """Stop changing subscriptions (the store closes)."""
        syncing, self._syncing = self._syncing, None
        if syncing is not None:
            syncing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await syncing
