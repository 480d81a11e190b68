"""Live runs: a prompt run decoupled from the connection that started it.

A run started through `LiveRuns.start` writes its frames into a bounded journal instead of
straight into one connection. Readers follow the journal (`LiveRun.follow(after=seq)`): the
`POST P` stream is the first reader, and a client that lost its stream re-attaches with
`GET P/conversations/{id}/events` and `Last-Event-ID`, getting every frame after that seq.

Rules, in order:

- back-pressure: while a reader is attached, the run waits when the slowest reader is a whole
  journal (`JOURNAL_FRAMES`) behind, so a slow client slows the run instead of growing memory;
- a run whose last reader leaves is cancelled, as a plain stream's run always was, unless
  something holds it (`LiveRun.hold()`): a call waiting for a person's approval does, so the run
  outlives its connection until the approval is answered or expires;
- once held past its connection, a run goes on to its end (a person acted on it); its frames wait
  in the journal for a reader;
- a journal keeps its last `JOURNAL_FRAMES` frames, and drops its oldest frames (once every
  attached reader has them) beyond `JOURNAL_BYTES`; finished runs are kept (the newest
  `KEPT_FINISHED_RUNS`, for `KEEP_FINISHED_SECONDS`) so a client that reconnects after the end
  still gets it;
- a run's consecutive text frames are kept `SPAN_FRAMES` at a time as one string (a span, see
  `Span`): a reader gets each frame back as it was published, whatever seq it asks after.

Journals are in this process's memory: a restart forgets them. With a shared store that is a
`contracts.RunFeed` (`feed`, durable runs off), a run's frames are also shared there once
another replica asks for them, so that it can follow the run (`kernel.feed`). Durable runs
(`durable.DurableRuns`) extend this journal: every frame is written to a `RunStore` before any
reader gets it, and runs outlive the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import struct
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterator, Mapping
from typing import Any, cast

from .. import _events as events
from .._cancel import reraise_cancellation
from .._contracts import (
    FEED_OWNER,
    FrameSink,
    LiveRunHandle,
    Run,
    RunFeed,
    RunHooks,
    RunRecord,
    RunStore,
    StoredRun,
)
from .._events import Frame
from .._log import fault, get_logger
from .feed import STOPPED, FeedBatch, FeedBatches, FeedStore, FeedWriter, abandon
from .remote import RemoteRun, resolved
from .writer import StoreWriter

log = get_logger(__name__)

JOURNAL_FRAMES = 2048
JOURNAL_BYTES = 2 * 1024 * 1024
"""Roughly (the frames' text, not their JSON) what one journal keeps of frames already read."""
SPAN_FRAMES = 32
"""Consecutive text frames of a run joined into one span (`Span`) once this many are kept."""
BATCH_FRAMES = 64
BATCH_BYTES = 64 * 1024
"""A batch a reader takes at once (`LiveRun.follow_batches`): at most this many frames, and
about this much of their text."""
KEPT_FINISHED_RUNS = 32
KEEP_FINISHED_SECONDS = 600.0
RUNS_PER_CONVERSATION = 4
LEASE_SECONDS = 15.0
"""How long a run's owner may go silent before its lease runs out (another process then takes a
durable run over, or ends a followed one)."""
ASK_SECONDS = 1.0
"""How long a replica waits for another to share a run it asked for (`LiveRuns.find`) before
it answers that there is none to follow."""
ASK_FIRST_PAUSE = 0.002
"""The first wait before reading the store after an ask; each next one is twice as long."""
RESTARTING = "server is restarting; the run resumes"
STOPPING = "server is shutting down; the run was stopped"
MOVED = "another server took this run over; re-attach to follow it"

Work = Callable[[LiveRunHandle], Coroutine[Any, Any, Any]]


class LiveRun:
    """One prompt run, its journal of frames, its readers and what holds it alive."""

    def __init__(
        self,
        path: str,
        conversation_id: str,
        user_id: str | None,
        capacity: int = JOURNAL_FRAMES,
        *,
        session_id: str | None = None,
        writer: StoreWriter | None = None,
        frames: list[Frame] | None = None,
        feed: StoreWriter | None = None,
    ) -> None:
        self.path = path
        self.conversation_id = conversation_id
        self.user_id = user_id
        self.capacity = capacity
        self.session_id: str | None = session_id
        self.task: asyncio.Task[object] | None = None
        self.finished_at: float | None = None
        self.detached = False
        """A resumed run: nobody started it in this process, so no reader leaving stops it."""
        self._writer = writer
        """A durable journal's writer: readers only get the frames it stored."""
        self._feed = feed
        """The frame feed: frames shared for other replicas' readers, never waited for."""
        self._suspended = False
        self._interrupt: str | None = None
        self._frames: deque[Entry] = deque(maxlen=capacity)
        """One entry a frame (see `Entry`): a span is the entry of each of its frames."""
        self._loose = 0
        """How many entries at the journal's end are bare texts not yet joined (`_join`)."""
        self._last_seq = 0
        """The seq of the journal's last frame (its seqs are contiguous: the first one is
        `_last_seq - len(_frames) + 1`)."""
        self._bytes = 0
        self._readers: dict[int, int] = {}
        """Reader token -> the last seq it took."""
        self._tokens = 0
        """Reader tokens handed out so far."""
        self._holds = 0
        self._waiting: list[asyncio.Future[None]] = []
        """The writer and readers waiting for the next change (`_changed`)."""
        self._writer_waiting = False
        self._stored_seq = 0
        """Durable: the last seq the store holds; readers never get past it."""
        self._start_seq = 0
        self._newest: Frame | None = None
        """The frame `publish` took last, as it came: a reader that keeps up reads it back
        as it is (`_after`) instead of one rebuilt from the journal."""
        for frame in frames or ():
            self._append(frame)
        if self._frames:
            self._start_seq = self._stored_seq = self._last_seq

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def durable(self) -> bool:
        return self._writer is not None

    @property
    def suspended(self) -> bool:
        return self._suspended

    @property
    def start_seq(self) -> int:
        """The seq of the last frame a resumed run's first life journalled (0 for a new run)."""
        return self._start_seq

    @property
    def readers(self) -> int:
        return len(self._readers)

    @property
    def held(self) -> bool:
        return self._holds > 0

    # --- the writer side ---------------------------------------------------------------------

    async def publish(self, frame: Frame) -> None:
        """The run's frame sink: waits while the slowest attached reader is a journal behind."""
        while self._readers and min(self._readers.values()) <= frame.seq - self.capacity:
            self._writer_waiting = True
            try:
                await self._changed()
            finally:
                self._writer_waiting = False
        if self.session_id is None:
            self.session_id = frame.session_id
        self._append(frame)
        self._newest = frame
        if self._bytes > JOURNAL_BYTES:
            self._trim()
        if self._writer is not None:
            # Readers get it once the store holds it (`_stored`), not before.
            self._writer.frame(frame)
            return
        if self._feed is not None:
            self._feed.frame(frame)
        self._signal()

    def _append(self, frame: Frame) -> None:
        frames = self._frames
        if len(frames) == self.capacity:
            self._bytes -= _entry_size(frames[0], self._first_seq())
        self._last_seq = frame.seq
        data = frame.data
        if (
            frame.event == events.TEXT
            and len(data) == 1
            and type(text := data.get("text")) is str
            and frame.session_id == self.session_id
            and frame.conversation_id == self.conversation_id
        ):
            # A text frame of this run: its bare text (its seq is its place in the journal;
            # `_join` makes spans of them).
            frames.append(text)
            self._bytes += TEXT_SIZE + len(text)
            self._loose += 1
            if self._loose >= SPAN_FRAMES:
                self._join()
        else:
            packed = _pack(frame)
            frames.append(packed)
            self._bytes += packed[5]
            self._loose = 0

    def _join(self) -> None:
        """The bare texts at the journal's end become one span (see `Span`)."""
        frames = self._frames
        count = min(self._loose, len(frames))
        self._loose = 0
        if count < 2:
            return
        texts = [cast(str, frames.pop()) for _ in range(count)]
        texts.reverse()
        ends = [0, *itertools.accumulate(map(len, texts))]
        span: Span = (
            self._last_seq - count + 1,
            "".join(texts),
            struct.pack(f"={len(ends)}I", *ends),
        )
        frames.extend(itertools.repeat(span, count))

    def bind(self, run: Run) -> FrameSink:
        """`contracts.LiveRunHandle.bind`: the run's frames come straight here."""
        return self.publish

    def _stored(self, seq: int) -> None:
        """The store holds every frame up to `seq`: readers may have them."""
        if seq > self._stored_seq:
            self._stored_seq = seq
            self._signal()

    def interrupt(self, message: str) -> None:
        """End every reader with an `error` frame (shutdown); a durable run is suspended."""
        if self.finished or self._interrupt is not None:
            return
        self._interrupt = message
        self._suspended = self.durable
        self._signal()

    def _trim(self) -> None:
        """Drop the oldest frames past the byte budget, never one an attached reader lacks."""
        if self._bytes <= JOURNAL_BYTES:
            return  # (`publish` looks first, the run's end and a leaving reader here)
        read = min(self._readers.values()) if self._readers else None
        frames = self._frames
        while len(frames) > 1 and self._bytes > JOURNAL_BYTES:
            first = self._first_seq()
            if read is not None and first > read:
                return
            self._bytes -= _entry_size(frames.popleft(), first)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Keep the run alive while the block runs, even if every reader leaves."""
        self._holds += 1
        try:
            yield
        finally:
            self._holds -= 1

    def finish(self) -> None:
        self.finished_at = time.monotonic()
        self._trim()
        self._signal()

    # --- the reader side ---------------------------------------------------------------------

    async def follow(self, after: int = 0) -> AsyncGenerator[Frame, None]:
        """Every frame with a seq above `after`, then each new one, until the run ends.

        Frames that fell out of the journal are skipped. When the reader leaves (it is closed
        or cancelled) and it was the last one, the run is cancelled unless it is held.
        """
        async with contextlib.aclosing(self.follow_batches(after)) as batches:
            async for batch in batches:
                for frame in batch:
                    yield frame

    async def follow_batches(self, after: int = 0) -> AsyncGenerator[list[Frame], None]:
        """`follow`, the frames ready at each wake-up in one list (never waiting to fill one).

        A reader stalled inside a batch keeps holding the writer back (bounded memory per slow
        client): its position moves past a batch only once it asks for the next one.
        """
        token = self._tokens = self._tokens + 1
        seq = self._readers[token] = after
        try:
            while True:
                batch = (
                    self._after(seq)
                    if seq < (self._last_seq if self._writer is None else self._stored_seq)
                    else None
                )
                if batch:
                    yield batch
                    seq = self._readers[token] = batch[-1].seq
                    if self._writer_waiting:
                        self._signal()
                    continue
                if self._interrupt is not None and self.finished_at is None:
                    # Not journalled: the run goes on (in its next life, when durable).
                    yield [
                        Frame(
                            events.ERROR,
                            {"message": self._interrupt, "type": "ServerShutdown"},
                            self.session_id or "",
                            self.conversation_id,
                            seq,
                        )
                    ]
                    return
                if self.finished_at is not None:
                    return
                await self._changed()
        finally:
            del self._readers[token]
            self._trim()
            self._signal()
            self._reader_left()

    def _after(self, seq: int) -> list[Frame]:
        """The next batch after `seq`, which readers may have: at most `BATCH_FRAMES` frames and
        about `BATCH_BYTES` (always one), so a reader stalled in a send holds at most one batch
        in its buffers."""
        readable = self._last_seq if self._writer is None else self._stored_seq
        newest = self._newest
        if newest is not None and newest.seq == seq + 1 == readable:
            return [newest]  # (a reader that keeps up: one frame a wake-up)
        # Seqs are contiguous within the journal, so the first one after `seq` is found by index.
        frames = self._frames
        first = self._first_seq()
        start = max(0, seq - first + 1)
        stop = len(frames)
        if self._writer is not None:
            stop = max(start, self._stored_seq - first + 1)
        stop = min(stop, start + BATCH_FRAMES)
        # By index, not `islice`: a live reader's batch is at the journal's end, and a deque
        # is indexed from its nearer end (`islice` would walk the whole journal each time).
        if stop - start > 1:
            size = 0
            for index in range(start, stop):
                entry = frames[index]
                if type(entry) is str:
                    size += TEXT_SIZE + len(entry)
                else:
                    size += _entry_size(entry, first + index)
                if size > BATCH_BYTES and index > start:
                    stop = index
                    break
        return [self._unpack(frames[index], first + index) for index in range(start, stop)]

    def _first_seq(self) -> int:
        return self._last_seq - len(self._frames) + 1

    def kept(self) -> list[Frame]:
        """Every frame the journal keeps, oldest first."""
        first = self._first_seq()
        return [self._unpack(entry, first + index) for index, entry in enumerate(self._frames)]

    def _unpack(self, entry: Entry, seq: int) -> Frame:
        if type(entry) is str:
            text = entry
        elif len(entry) == 3:
            first, joined, ends = cast(Span, entry)
            start, end = _BOUNDS.unpack_from(ends, 4 * (seq - first))
            text = joined[start:end]
        else:
            return _unpack(cast(Packed, entry))
        return Frame(events.TEXT, {"text": text}, self.session_id or "", self.conversation_id, seq)

    def _last_frame(self) -> Frame | None:
        return self._unpack(self._frames[-1], self._last_seq) if self._frames else None

    def _reader_left(self) -> None:
        if self._readers or self.finished or self.task is None or self.task.done():
            return
        if self.detached and not self._suspended:
            return
        if self.held:
            log.info(
                "client left while the run waits for an approval; the run continues",
                endpoint=self.path,
                conversation=self.conversation_id,
            )
            return
        if not self._suspended:
            self.stopped_by_client()
        self.task.cancel()

    def cancel(self) -> bool:
        """`contracts.LiveRunHandle.cancel`: journal the end (durable), then cancel the task."""
        if self.finished or self.task is None or self.task.done():
            return False
        self.stopped_by_client()
        self.task.cancel()
        return True

    def stopped_by_client(self) -> None:
        """Its last reader left and nothing holds it: it is cancelled right after this (a
        durable run journals first that it ended, so that a restart does not run it again)."""

    # --- wake-ups ----------------------------------------------------------------------------

    def _signal(self) -> None:
        # One future per wait, resolved here: cheaper per frame than an `asyncio.Event` made
        # and set for every frame, and a run's frames published together wake a reader once.
        if self._waiting:
            waiting, self._waiting = self._waiting, []
            for waiter in waiting:
                if not waiter.done():
                    waiter.set_result(None)

    def _changed(self) -> asyncio.Future[None]:
        """What the writer or a reader awaits until the next change (`_signal`): a future, not
        a coroutine around one (one call less a token). A wait cancelled leaves its future in
        `_waiting` until the next signal, which skips it; a reader that leaves signals."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        return waiter


class LiveRuns:
    """The app's live (and recently finished) runs, by endpoint path and conversation.

    The embedded `contracts.RunJournal`: journals live in this process's memory; with a `feed`
    (durable runs off, a shared store), frames are also shared there for other replicas to
    follow (see the module docstring). `durable.DurableRuns` is the durable one.
    """

    def __init__(
        self,
        *,
        feed: RunStore | None = None,
        lease_seconds: float = LEASE_SECONDS,
        keep_seconds: float = KEEP_FINISHED_SECONDS,
    ) -> None:
        self.feed = feed
        """The frame feed's store (durable runs off): frames only, for other replicas."""
        self.lease_seconds = lease_seconds
        self.keep_seconds = keep_seconds
        self.owner = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex}"
        """This process as a lease owner (`host/pid/token`, see `RunStore`)."""
        if feed is not None:
            self.owner = FEED_OWNER + self.owner
        batches: object = feed
        self._batch: FeedBatch | None = (
            FeedBatch(batches, self.owner) if isinstance(batches, FeedBatches) else None
        )
        """The frame feed's writes of every run of this process, grouped (`kernel.feed`)."""
        self.in_flight: Callable[[str, str], Awaitable[list[RunRecord]]] | None = None
        """The conversation's runs in flight on any replica (`RunControl.active`, set by the
        host): `find` asks for them when this replica runs none of them."""
        self._runs: dict[tuple[str, str], list[LiveRun]] = {}
        self._finished: OrderedDict[int, LiveRun] = OrderedDict()
        self._keeper: asyncio.Task[None] | None = None
        self._closers: set[asyncio.Task[None]] = set()
        self._opened = False

    store: RunStore | None = None
    """The store durable runs are journalled in (`durable.DurableRuns`); `None` here."""

    @property
    def durable(self) -> bool:
        return False

    @property
    def store_name(self) -> str | None:
        return None

    @property
    def hooks(self) -> RunHooks | None:
        return None

    @property
    def shared(self) -> RunStore | None:
        """The store other replicas read this journal's runs from, if any."""
        return self.feed

    def start(
        self,
        work: Work,
        *,
        path: str,
        conversation_id: str,
        user_id: str | None,
        session_id: str | None = None,
        message: str = "",
        run_id: str | None = None,
    ) -> LiveRun:
        """Run `work(live)` in its own task, writing its frames into a new journal."""
        live = self._new_run(
            path, conversation_id, user_id, session_id or None, message, run_id or uuid.uuid4().hex
        )
        return self._launch(live, work)

    def _new_run(
        self,
        path: str,
        conversation_id: str,
        user_id: str | None,
        session_id: str | None,
        _: str,
        run_id: str,
    ) -> LiveRun:
        feed = None
        if self.feed is not None:
            session_id = session_id or uuid.uuid4().hex
            record = self._record(path, conversation_id, user_id, session_id, "", run_id)
            feed = FeedWriter(
                FeedStore(self.feed),
                record.run_id,
                owner=self.owner,
                lease_seconds=self.lease_seconds,
                create=record,
                batch=self._batch,
            )
        return LiveRun(path, conversation_id, user_id, session_id=session_id, feed=feed)

    @staticmethod
    def _record(
        path: str,
        conversation_id: str,
        user_id: str | None,
        session_id: str,
        message: str,
        run_id: str,
    ) -> StoredRun:
        return StoredRun(
            run_id=run_id,
            path=path,
            conversation_id=conversation_id,
            user_id=user_id,
            session_id=session_id,
            message=message,
            started_at=time.time(),
        )

    def _launch(self, live: LiveRun, work: Work) -> LiveRun:
        if live._writer is not None:
            live._writer.on_stored = live._stored
            live._writer.on_lost = lambda: self._lost(live)
        live.task = asyncio.get_running_loop().create_task(
            work(live), name=f"prompt:{live.path}:{live.conversation_id}"
        )
        live.task.add_done_callback(lambda _: self._finish(live))
        runs = self._runs.setdefault((live.path, live.conversation_id), [])
        runs.append(live)
        self._trim(runs)
        return live

    async def find(
        self, path: str, conversation_id: str, *, session_id: str | None = None
    ) -> LiveRunHandle | None:
        """The run `session_id` names, else the oldest unfinished run, else the newest one.

        Runs of this process first; with a store (or frame feed) that is a `RunFeed`, a run that
        another replica executes is found there and followed from it (`kernel.remote.RemoteRun`).
        A frame-feed run is in the store only once asked for: when the registry has a run of the
        conversation in flight on another replica (`in_flight`), or the client names a session
        not here, this replica asks (`RunFeed.ask`) and reads the store until the run is there,
        `ASK_SECONDS` at most."""
        local = self._find_local(path, conversation_id, session_id)
        shared = self.shared
        feed: object = shared
        if shared is None or not isinstance(feed, RunFeed):
            return local
        if local is not None and (
            local.session_id == session_id if session_id is not None else not local.finished
        ):
            return local  # (a session names one run: this one, finished or not)
        try:
            found = await feed.latest(path, conversation_id, session_id=session_id)
            if (found is None or found[1]) and await self._elsewhere(
                path, conversation_id, session_id
            ):
                found = await self._ask(feed, path, conversation_id, session_id, found)
        except Exception as exc:
            fault(log, "could not look for the run in the shared journal", exc, every=False)
            return local
        if found is None:
            return local
        stored, finished = found
        if local is not None and (finished or local.session_id == stored.session_id):
            return local
        if finished:
            # Ended on another replica: followable while its frames are kept (a client that
            # re-attaches just after the end gets the tail), else the history has it.
            try:
                kept, _ = await feed.frames_after(stored.run_id, 0, 1)
            except Exception as exc:
                fault(log, "could not read the run from the shared journal", exc, every=False)
                return None
            if not kept:
                return None
        return RemoteRun(feed, stored, resolved, shared, durable=self.durable)

    async def _elsewhere(self, path: str, conversation_id: str, session_id: str | None) -> bool:
        """Another replica may run the conversation's run unshared: the client names its
        session, or the registry has a run in flight there."""
        if self.feed is None:
            return False  # (a durable journal: every run's frames are in the store)
        if session_id is not None:
            return True
        if self.in_flight is None:
            return False
        runs = await self.in_flight(path, conversation_id)
        return any(record.owner != self.owner for record in runs)

    async def _ask(
        self,
        feed: RunFeed,
        path: str,
        conversation_id: str,
        session_id: str | None,
        before: tuple[StoredRun, bool] | None,
    ) -> tuple[StoredRun, bool] | None:
        """Ask the other replicas to share the conversation's run (`RunFeed.ask`), then read the
        store until it is there (`ASK_SECONDS` at most): what `latest` finds then. The ask is
        sent once more a quarter of the way (Redis's pub/sub drops what comes while a listener
        reconnects)."""
        await feed.ask(path, conversation_id, session_id)
        loop = asyncio.get_running_loop()
        again = loop.time() + ASK_SECONDS / 4
        deadline = loop.time() + ASK_SECONDS
        pause = ASK_FIRST_PAUSE
        while True:
            await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
            found = await feed.latest(path, conversation_id, session_id=session_id)
            if found is not None and (
                before is None or found[0].run_id != before[0].run_id or not found[1]
            ):
                return found
            if loop.time() >= deadline:
                return before
            if again and loop.time() >= again:
                again = 0.0
                await feed.ask(path, conversation_id, session_id)
            pause *= 2

    def _find_local(
        self, path: str, conversation_id: str, session_id: str | None
    ) -> LiveRun | None:
        self._expire()
        runs = self._runs.get((path, conversation_id), [])
        if session_id is not None:
            for live in runs:
                if live.session_id == session_id:
                    return live
        for live in runs:
            if not live.finished:
                return live
        return runs[-1] if runs else None

    # --- upkeep -------------------------------------------------------------------------------

    async def open(
        self, resume: Callable[[LiveRunHandle, StoredRun], Coroutine[Any, Any, Any]]
    ) -> None:
        """Start the frame feed's upkeep (nothing to resume: these runs end with their process)."""
        if self.feed is None or self._opened:
            return
        self._opened = True
        await self.feed.open()
        feed: object = self.feed
        if isinstance(feed, RunFeed):
            await feed.hear_asks(self.share)
        self._keeper = asyncio.get_running_loop().create_task(self._keep_feed(), name="run-feed")

    def share(self, path: str, conversation_id: str, session_id: str | None = None) -> None:
        """Share the conversation's run that `find` would pick here (if this replica runs or
        still keeps it) in the frame feed: another replica asked for it (`RunFeed.ask`)."""
        live = self._find_local(path, conversation_id, session_id)
        if live is None or live._feed is None or not isinstance(live._feed, FeedWriter):
            return
        writer = live._feed
        if writer.sharing:
            return
        writer.share(live.kept())
        if live.finished:
            self._close_later(self._finish_feed(live))

    async def _keep_feed(self) -> None:
        """The frame feed's upkeep, every third of a lease: extend this replica's leases (so
        its runs read as alive), end the runs of replicas that died, drop finished ones."""
        assert self.feed is not None
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.feed.heartbeat(self.owner, self.lease_seconds)
                await abandon(self.feed)
                await self.feed.expire(time.time() - self.keep_seconds)
            except Exception as exc:
                fault(log, "run feed upkeep failed; retrying", exc, every=False)
            reraise_cancellation()

    # --- deleting a conversation ------------------------------------------------------------

    async def forget(self, path: str, conversation_id: str) -> None:
        """Drop the conversation's finished runs and their frames, here and in the shared store
        (`contracts.RunJournal.forget`). The last writes of runs that just ended are waited for
        first (bounded), so none of them lands after the deletion."""
        if self._closers:
            await asyncio.wait(set(self._closers), timeout=10)
        for live in list(self._runs.get((path, conversation_id), [])):
            if live.finished:
                self._finished.pop(id(live), None)
                self._forget(live)
        shared = self.shared
        if shared is not None:
            await shared.forget(path, conversation_id)

    # --- shutdown -------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Shutdown: end every reader with an `error` frame, stop every unfinished run and wait
        for it to unwind; durable runs stay unfinished in the store, released for a restart."""
        message = RESTARTING if self.durable else STOPPING
        live_runs = [
            live
            for runs in self._runs.values()
            for live in runs
            if live.task is not None and not live.task.done()
        ]
        for live in live_runs:
            live.interrupt(message)
        tasks = [live.task for live in live_runs if live.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        if self._closers:
            await asyncio.wait(set(self._closers), timeout=10)
        if self._batch is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await self._batch.flushed()
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        shared = self.shared
        if shared is not None and self._opened:
            try:
                await shared.release(self.owner)
            finally:
                await shared.aclose()
                self._opened = False
        self._runs.clear()
        self._finished.clear()

    # --- bookkeeping ----------------------------------------------------------------------

    def _lost(self, live: LiveRun) -> None:
        """Another process owns the run now (this one stalled past its lease): stop it here
        without a trace of its end (suspended: no history write, no `complete`), so that only
        the new owner finishes it; readers get an `error` frame telling them to re-attach."""
        live.interrupt(MOVED)
        if live.task is not None and not live.task.done():
            live.task.cancel()

    def _finish(self, live: LiveRun) -> None:
        self._finished_now(live)
        feed = live._feed
        if feed is not None and (not isinstance(feed, FeedWriter) or feed.sharing):
            self._close_later(self._finish_feed(live))

    def _close_later(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a finished run's last writes in the background (`aclose` waits for them)."""
        closer = asyncio.get_running_loop().create_task(work)
        self._closers.add(closer)
        closer.add_done_callback(self._closers.discard)

    async def _finish_feed(self, live: LiveRun) -> None:
        """Share the run's last frames (and a last `error` frame if it ended without one, so
        remote readers end), then mark it finished (its frames go after a grace period)."""
        writer = live._feed
        assert writer is not None
        assert self.feed is not None
        last = live._last_frame()
        if last is None or not last.terminal:
            shutdown = live._interrupt is not None
            writer.frame(
                Frame(
                    events.ERROR,
                    {
                        "message": live._interrupt if shutdown else STOPPED,
                        "type": "ServerShutdown" if shutdown else "RunStopped",
                    },
                    live.session_id or "",
                    live.conversation_id,
                    (last.seq if last is not None else 0) + 1,
                )
            )
        await writer.flushed()
        shared = writer.store
        if writer.lost or (isinstance(shared, FeedStore) and not shared.failed):
            return  # (its terminal frame's write finished it in the store)
        try:
            await self.feed.finish(writer.run_id)
        except Exception as exc:
            fault(log, "could not mark a shared run finished", exc, every=False, run=writer.run_id)

    def _finished_now(self, live: LiveRun) -> None:
        live.finish()
        self._finished[id(live)] = live
        while len(self._finished) > KEPT_FINISHED_RUNS:
            _, oldest = self._finished.popitem(last=False)
            self._forget(oldest)

    def _trim(self, runs: list[LiveRun]) -> None:
        while len(runs) > RUNS_PER_CONVERSATION and runs[0].finished:
            self._finished.pop(id(runs.pop(0)), None)

    def _expire(self) -> None:
        deadline = time.monotonic() - KEEP_FINISHED_SECONDS
        while self._finished:
            oldest = next(iter(self._finished.values()))
            if oldest.finished_at is None or oldest.finished_at > deadline:
                break
            self._finished.popitem(last=False)
            self._forget(oldest)

    def _forget(self, live: LiveRun) -> None:
        key = (live.path, live.conversation_id)
        runs = self._runs.get(key)
        if runs is None:
            return
        if live in runs:
            runs.remove(live)
        if not runs:
            del self._runs[key]


Packed = tuple[str, "Mapping[str, Any] | str", str, str, int, int]
"""A journalled frame as a plain tuple of `Frame`'s fields and its size (`_size`), a text
frame's data as its bare text. Such a tuple holds no container, so Python stops tracking it: a
journal's thousands of text frames add nothing to a full garbage collection's walk (a `Frame`
object, or a tuple holding a dict, stays tracked for life), and each keeps about 180 bytes less
than a `Frame` and its dict. Readers get `Frame`s back (`_unpack`)."""

Span = tuple[int, str, bytes]
"""Consecutive text frames of the journal's own run: the seq of the first, their texts joined,
and where each text starts in it (`SPAN_FRAMES` + 1 unsigned 32-bit offsets, the last one the
end). A text frame of the journal's own run is kept as its bare text (`LiveRun._append`), and
every `SPAN_FRAMES` of them in a row become one span, the journal entry of each of them: a
streamed token then keeps its characters, its offset and its entry, under 40 bytes for a 4
character token instead of about 90 as a string of its own, 220 as a tuple. Like a `Packed`
tuple, a span holds no container: the garbage collector stops walking it."""

Entry = Packed | str | Span
"""What the journal keeps a frame as: a `Packed` tuple, a text frame of its own run as its bare
text, or that text inside a `Span`."""

TEXT_SIZE = 64
"""What a text frame counts beyond its text against `JOURNAL_BYTES` and `BATCH_BYTES`."""

_BOUNDS = struct.Struct("=II")
"""Where one text of a span starts and ends (two consecutive offsets)."""


def _entry_size(entry: Entry, seq: int) -> int:
    """The size (`_size`) of the frame `seq` that `entry` keeps."""
    if type(entry) is str:
        return TEXT_SIZE + len(entry)
    if len(entry) == 3:
        first, _, ends = cast(Span, entry)
        start, end = _BOUNDS.unpack_from(ends, 4 * (seq - first))
        return TEXT_SIZE + end - start  # type: ignore[no-any-return]
    return cast(Packed, entry)[5]


def _pack(frame: Frame) -> Packed:
    data: Mapping[str, Any] | str = frame.data
    if frame.event == events.TEXT and len(frame.data) == 1:
        text = frame.data.get("text")
        if type(text) is str:
            data = text
    return (frame.event, data, frame.session_id, frame.conversation_id, frame.seq, _size(frame))


def _unpack(packed: Packed) -> Frame:
    event, data, session_id, conversation_id, seq, _ = packed
    if type(data) is str:
        return Frame(event, {"text": data}, session_id, conversation_id, seq)
    return Frame(event, data, session_id, conversation_id, seq)  # type: ignore[arg-type]


def _size(frame: Frame) -> int:
    size = TEXT_SIZE
    for value in frame.data.values():
        # A text frame's value is a `str`: measured here, without a call (one per token).
        size += len(value) if type(value) is str else _text_size(value)
    return size


def _text_size(value: Any, depth: int = 0) -> int:
    """Roughly the text `value` holds: its strings' lengths, walked (a tool call's 50 KiB
    arguments are not copied into a `str()` just to be measured); 8 for any other scalar."""
    if isinstance(value, str):
        return len(value)
    if depth < 8 and isinstance(value, Mapping):
        return sum(len(str(key)) + _text_size(item, depth + 1) for key, item in value.items())
    if depth < 8 and isinstance(value, list | tuple):
        return sum(_text_size(item, depth + 1) for item in value)
    if depth >= 8:
        return len(str(value))
    return 8
