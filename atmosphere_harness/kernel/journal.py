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
  still gets it.

Journals are in memory: a restart forgets them (durable runs are a separate feature).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from typing import Any

from ..contracts import LiveRunHandle
from ..events import Frame
from ..log import get_logger

log = get_logger(__name__)

JOURNAL_FRAMES = 2048
JOURNAL_BYTES = 2 * 1024 * 1024
"""Roughly (the frames' text, not their JSON) what one journal keeps of frames already read."""
KEPT_FINISHED_RUNS = 32
KEEP_FINISHED_SECONDS = 600.0
RUNS_PER_CONVERSATION = 4


class LiveRun:
    """One prompt run, its journal of frames, its readers and what holds it alive."""

    def __init__(
        self, path: str, conversation_id: str, user_id: str | None, capacity: int = JOURNAL_FRAMES
    ) -> None:
        self.path = path
        self.conversation_id = conversation_id
        self.user_id = user_id
        self.capacity = capacity
        self.session_id: str | None = None
        self.task: asyncio.Task[object] | None = None
        self.finished_at: float | None = None
        self._frames: deque[Frame] = deque(maxlen=capacity)
        self._sizes: deque[int] = deque(maxlen=capacity)
        self._bytes = 0
        self._readers: dict[int, int] = {}
        """Reader token -> the last seq it took."""
        self._tokens = itertools.count()
        self._holds = 0
        self._wake = asyncio.Event()
        self._writer_waiting = False

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

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
        if len(self._frames) == self.capacity:
            self._bytes -= self._sizes[0]
        size = _size(frame)
        self._frames.append(frame)
        self._sizes.append(size)
        self._bytes += size
        self._trim()
        self._signal()

    def _trim(self) -> None:
        """Drop the oldest frames past the byte budget, never one an attached reader lacks."""
        read = min(self._readers.values()) if self._readers else None
        while len(self._frames) > 1 and self._bytes > JOURNAL_BYTES:
            if read is not None and self._frames[0].seq > read:
                return
            self._frames.popleft()
            self._bytes -= self._sizes.popleft()

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
        token = next(self._tokens)
        self._readers[token] = after
        try:
            while True:
                batch = self._after(self._readers[token])
                if batch:
                    for frame in batch:
                        # Advance per frame, not per batch: a reader stalled inside a batch
                        # must keep holding the writer back (bounded memory per slow client).
                        self._readers[token] = frame.seq
                        if self._writer_waiting:
                            self._signal()
                        yield frame
                    continue
                if self.finished:
                    return
                await self._changed()
        finally:
            del self._readers[token]
            self._trim()
            self._signal()
            self._reader_left()

    def _after(self, seq: int) -> list[Frame]:
        # Seqs are contiguous within the journal, so the first one after `seq` is found by index.
        if not self._frames:
            return []
        start = max(0, seq - self._frames[0].seq + 1)
        return list(itertools.islice(self._frames, start, None))

    def _reader_left(self) -> None:
        if self._readers or self.finished or self.task is None or self.task.done():
            return
        if self.held:
            log.info(
                "client left while the run waits for an approval; the run continues",
                endpoint=self.path,
                conversation=self.conversation_id,
            )
            return
        self.task.cancel()

    # --- wake-ups ----------------------------------------------------------------------------

    def _signal(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    async def _changed(self) -> None:
        await self._wake.wait()


class LiveRuns:
    """The app's live (and recently finished) runs, by endpoint path and conversation.

    The embedded `contracts.RunJournal`: journals live in this process's memory.
    """

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], list[LiveRun]] = {}
        self._finished: OrderedDict[int, LiveRun] = OrderedDict()

    def start(
        self,
        work: Callable[[LiveRunHandle], Coroutine[Any, Any, Any]],
        *,
        path: str,
        conversation_id: str,
        user_id: str | None,
    ) -> LiveRun:
        """Run `work(live)` in its own task, writing its frames into a new journal."""
        live = LiveRun(path, conversation_id, user_id)
        live.task = asyncio.get_running_loop().create_task(
            work(live), name=f"prompt:{path}:{conversation_id}"
        )
        live.task.add_done_callback(lambda _: self._finish(live))
        runs = self._runs.setdefault((path, conversation_id), [])
        runs.append(live)
        self._trim(runs)
        return live

    def find(
        self, path: str, conversation_id: str, *, session_id: str | None = None
    ) -> LiveRun | None:
        """The run `session_id` names, else the oldest unfinished run, else the newest one."""
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

    async def aclose(self) -> None:
        """Cancel every unfinished run (shutdown) and wait for them to unwind."""
        tasks = [
            live.task
            for runs in self._runs.values()
            for live in runs
            if live.task is not None and not live.task.done()
        ]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        self._runs.clear()
        self._finished.clear()

    def _finish(self, live: LiveRun) -> None:
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


def _size(frame: Frame) -> int:
    return 64 + sum(
        len(value) if isinstance(value, str) else len(str(value)) for value in frame.data.values()
    )
