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

Without a store, journals are in memory: a restart forgets them. With a `contracts.RunStore`
(durable runs, `ATMOSPHERE_DURABLE_RUNS_ENABLED`), every frame and checkpoint is also written to
the store before any reader sees it: frames are appended to the in-memory journal at once, but a
reader only gets those the store holds (`_stored_seq`). Writes are grouped: while one write is in
flight, the frames and checkpoints published meanwhile wait and go in the next one, so a streamed
answer of many small frames costs a few writes, not one each. `LiveRuns.open` claims the runs a
dead process left unfinished and starts them again (`resume`), keeps this process's leases alive
and expires finished records; `aclose` (shutdown) ends every reader with an `error` frame and
leaves the runs unfinished in the store, released for the next start.

The frame feed (durable runs off, a shared store that is a `contracts.RunFeed`: PostgreSQL or
Redis) is the light version that lets another replica follow a run (`kernel.remote.RemoteRun`):
frames go to the store grouped and in the background, as above, but readers never wait for it
(`_stored_seq` plays no part), nothing else is journalled (no checkpoints, no message), and the
runs are owned as `contracts.FEED_OWNER`..., so no replica ever claims or resumes them. A write
that fails or lags costs remote readers frames, never the run or its local readers. A replica
that dies leaves its runs unfinished: once their lease runs out, any replica's upkeep ends them
with an `error` frame (`RunFeed.abandon`), so their readers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any

from .. import _events as events
from .._cancel import reraise_cancellation
from .._contracts import FEED_OWNER, LiveRunHandle, RunFeed, RunStore, RunStoreNow, StoredRun
from .._errors import LeaseLost
from .._events import Frame
from .._jsontext import compact_json
from .._log import fault, get_logger
from .remote import RemoteRun

log = get_logger(__name__)

JOURNAL_FRAMES = 2048
JOURNAL_BYTES = 2 * 1024 * 1024
"""Roughly (the frames' text, not their JSON) what one journal keeps of frames already read."""
KEPT_FINISHED_RUNS = 32
KEEP_FINISHED_SECONDS = 600.0
RUNS_PER_CONVERSATION = 4
LEASE_SECONDS = 15.0
"""How long a durable run's owner may go silent before another process takes the run over."""
CLAIM_BATCH = 64
"""Runs one claim scan resumes at most (the next scan takes more)."""
ENDED = "ended"
"""Checkpoint key: the run's client stopped it (it is not resumed)."""
RESTARTING = "server is restarting; the run resumes"
STOPPING = "server is shutting down; the run was stopped"
MOVED = "another server took this run over; re-attach to follow it"
FEED_LINGER_SECONDS = 0.05
"""The frame feed gathers a run's frames this long before each write (remote readers poll
every `kernel.remote.POLL_SECONDS`, 0.25 s, so they do not notice)."""
FEED_FIRST_SECONDS = 0.01
"""The frame feed's first write (the run's record) waits this long, or until the run's terminal
frame if that comes sooner: a run that ends within it (a scripted or cached answer, a refusal)
is shared in one write instead of two, and another replica finds a longer one 10 ms after it
started instead of about a round trip after (a re-attach there answers 404 meanwhile)."""
ABANDONED = "the server running this run stopped; the frames it had not shared are lost"
"""The frame feed's last word on a run whose replica died (`RunFeed.abandon`)."""
STOPPED = "the run was stopped before it finished"
"""The frame feed's last frame for a run that ended without one (its client left)."""

Resume = Callable[[LiveRunHandle, StoredRun], Coroutine[Any, Any, Any]]


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
        writer: _StoreWriter | None = None,
        checkpoints: Mapping[str, Any] | None = None,
        frames: list[Frame] | None = None,
        feed: _StoreWriter | None = None,
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
        self._feed = feed
        """The frame feed: frames shared for other replicas' readers, never waited for."""
        self._checkpoints: Mapping[str, Any] = checkpoints or {}
        self._suspended = False
        self._interrupt: str | None = None
        self._frames: deque[Frame] = deque(maxlen=capacity)
        self._sizes: deque[int] = deque(maxlen=capacity)
        self._bytes = 0
        self._readers: dict[int, int] = {}
        """Reader token -> the last seq it took."""
        self._tokens = itertools.count()
        self._holds = 0
        self._wake = asyncio.Event()
        self._writer_waiting = False
        self._stored_seq = 0
        """Durable: the last seq the store holds; readers never get past it."""
        self._start_seq = 0
        for frame in frames or ():
            self._frames.append(frame)
            self._sizes.append(_size(frame))
            self._bytes += self._sizes[-1]
        if self._frames:
            self._start_seq = self._stored_seq = self._frames[-1].seq

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
        return self._start_seq

    @property
    def checkpoints(self) -> Mapping[str, Any]:
        return self._checkpoints

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
        if self._writer is not None:
            # Readers get it once the store holds it (`_stored`), not before.
            self._writer.frame(frame)
            return
        if self._feed is not None:
            self._feed.frame(frame)
        self._signal()

    async def checkpoint(self, key: str, value: Any, *, wait: bool = False) -> None:
        """Journal `value` under `key` in order with the frames; `wait` until it is stored."""
        if self._writer is None:
            return
        self._writer.checkpoint(key, value)
        if wait:
            await self._writer.flushed()

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
                if self._interrupt is not None and not self.finished:
                    # Not journalled: the run goes on (in its next life, when durable).
                    yield Frame(
                        events.ERROR,
                        {"message": self._interrupt, "type": "ServerShutdown"},
                        self.session_id or "",
                        self.conversation_id,
                        self._readers[token],
                    )
                    return
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
        if self._writer is None:
            return list(itertools.islice(self._frames, start, None))
        stop = self._stored_seq - self._frames[0].seq + 1
        return list(itertools.islice(self._frames, start, max(start, stop)))

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
        if self._writer is not None and not self._suspended:
            # Journalled before the cancellation writes anything: a run its client stopped is
            # over, and a restart that finds it unfinished must not run it again.
            self._writer.checkpoint(ENDED, "client-left")
        self.task.cancel()

    # --- wake-ups ----------------------------------------------------------------------------

    def _signal(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    async def _changed(self) -> None:
        await self._wake.wait()


FOLLOWED = ("model:", "result:")
"""Checkpoints the kernel publishes right before a frame: a model turn (then its calls'
`tool-start` or the run's end), a call's result (then its `tool-result`)."""
GROUP_SECONDS = 0.002
"""With a `RunStoreNow`, the least time between two writes of one run's frames: a burst of them
(an instant model, a batch of fast tools) shares writes; a frame waits at most this long."""
STARTED = "started:"
"""A call's mark that its handler is about to run: it matters on a restart only for a tool that
must not run twice, whose executor waits until it is stored (`flushed`); the others run again
either way, so theirs goes with the run's next write, and not at all if the call's result comes
before that write (`_StoreWriter.checkpoint`)."""
RESULT = "result:"
"""A call's result (`result:<turn>:<call>`, its `started:<turn>:<call>` mark before it)."""


class _StoreWriter:
    """One durable run's writes to its store, grouped: what comes while a write is in flight
    goes in the next one. Readers are told each stored seq (`on_stored`)."""

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
        self._last_seq = 0
        self._task: asyncio.Task[None] | None = None
        self._now = store if isinstance(store, RunStoreNow) else None
        """The store, if it can write on the event loop (see `_kick`)."""
        self._encode = self._now.encode if self._now is not None else encode
        """How payloads are encoded for the store (JSON text, or the store's own form of it)."""
        self._true = self._encode(True)
        """`True` encoded once: a call's `started` mark when it runs with the model's own
        arguments (most calls)."""
        self._soon: asyncio.Handle | None = None
        """The write of what waits for a later one, while one is due (see `_kick`)."""
        self._next_write = 0.0
        """Loop time before which a publish waits for a later write (see `_kick`)."""
        self._calls: dict[str, tuple[str, Any]] = {}
        """The last model turn's calls: id -> (its checkpoint key, its arguments)."""
        self._result: tuple[Any, str] | None = None
        """The last call result journalled, and its payload (see `_tool_result`)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The run's loop, once known (`asyncio.get_running_loop` costs a `getpid()` call)."""

    # Encoded now, when published: what is journalled is what was sent, whatever changes later.

    def frame(self, frame: Frame) -> None:
        if frame.event == events.TOOL_START:
            payload = self._tool_start(frame.data)
        elif frame.event == events.TOOL_RESULT:
            payload = self._tool_result(frame.data)
        else:
            payload = self._encode(frame.data)
        self._frames.append((frame.seq, frame.event, payload))
        self._last_seq = frame.seq
        # A run's last frame is written at once: nothing comes after it to share the write, and
        # its readers (the end of the stream) would wait out the group's time for nothing.
        self._kick(now=frame.terminal)

    def checkpoint(self, key: str, value: Any) -> None:
        if key.startswith("model:") and isinstance(value, Mapping):
            self._calls = {
                str(call[0]): (key, call[2]) for call in value.get("calls") or () if len(call) == 3
            }
        payload = self._true if value is True else self._encode(value)
        if key.startswith(RESULT):
            if self._checkpoints:
                self._moot(STARTED + key[len(RESULT) :])
            self._result = (value, payload)
        self._checkpoints.append((key, payload))
        if key.startswith(STARTED):
            return  # with the next write (`flushed` writes it now for a caller that waits)
        # The others (an approval, its answer, the history mark, `ENDED`) are written at once:
        # `ENDED`, for one, must be stored before the stopped run unwinds and writes anything.
        held = key.startswith(FOLLOWED)
        self._kick(hold=held, now=not held)

    def _tool_start(self, data: Mapping[str, Any]) -> str:
        """A `tool-start` frame's payload. When its arguments are the model's own, they refer
        to the model turn's checkpoint (`REFERENCE`) instead of repeating them. The kernel's
        shape of such a frame (call id, tool, arguments) is spelled out around its strings,
        each encoded alone: plain JSON, which every store takes, for under half the cost of
        building the referring dict and encoding it (once per call of every durable run)."""
        call_id, tool = data.get("toolCallId"), data.get("tool")
        known = self._calls.get(str(call_id))
        if known is None or data.get("arguments") != known[1]:
            return self._encode(data)
        if len(data) == 3 and type(call_id) is str and type(tool) is str:
            return (
                f'{{"toolCallId":{_STRING(call_id)},"tool":{_STRING(tool)},'
                f'"arguments":{{{_REFERENCE_KEY}:{_STRING(known[0])}}}}}'
            )
        return self._encode({**data, "arguments": {REFERENCE: known[0]}})

    def _tool_result(self, data: Mapping[str, Any]) -> str:
        """A `tool-result` frame's payload: the kernel's shape of it (call id, tool, result)
        spelled out around the JSON its result checkpoint got just before, when that is plain
        JSON text (a long result is in the store's own form, `RunStoreNow.encode`: encoded
        again here)."""
        call_id, tool = data.get("toolCallId"), data.get("tool")
        last = self._result
        if (
            last is not None
            and len(data) == 3
            and data.get("result") is last[0]
            and type(call_id) is str
            and type(tool) is str
            and last[1][:1] == '"'
        ):
            return f'{{"toolCallId":{_STRING(call_id)},"tool":{_STRING(tool)},"result":{last[1]}}}'
        return self._encode(data)

    def _moot(self, started: str) -> None:
        """Leave out the `started` mark still waiting for a write when its call's result is
        journalled: the result goes in the same write (one record, whole or not at all), and a
        restart that finds a result replays it without ever reading the mark. A mark someone
        waited for (a tool that must not run twice) was written before its tool ran. One
        payload fewer per model turn: a built-in's calls (most of them) finish within the
        group's time (`GROUP_SECONDS`)."""
        pending = self._checkpoints
        for index in range(len(pending) - 1, -1, -1):
            if pending[index][0] == started:
                del pending[index]
                return

    def _kick(self, *, hold: bool = False, now: bool = False) -> None:
        """Start writing what is pending, unless a write is in flight (it takes it next).

        With a `RunStoreNow`, the write is made right here on the loop, synchronously (one
        left for later runs while the run waits for something, often a tool in a worker
        thread, and the two fight over the GIL). Frames are written at most once per
        `GROUP_SECONDS`: one that comes sooner waits for the next publish past it (or a timer,
        if the run goes quiet). A `hold` (a checkpoint the kernel publishes right before a
        frame) waits for that frame, at the latest until the end of this step of the event
        loop (or the group's time); `now` writes at once."""
        if self.lost:
            self._frames.clear()
            self._checkpoints.clear()
            return
        if self._task is None or self._task.done():
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            if self._now is not None:
                due = self._next_write
                if not now and (hold or loop.time() < due):
                    if self._soon is None:
                        self._soon = loop.call_at(due, self._drain_soon)
                    return
                if self._drain_now():
                    self._next_write = loop.time() + GROUP_SECONDS
                    return
            self._task = loop.create_task(self._drain(), name=f"journal:{self.run_id}")

    def _drain_soon(self) -> None:
        self._soon = None
        if self._frames or self._checkpoints or self._create is not None:
            self._kick(now=True)

    def _drain_now(self) -> bool:
        """Write what is pending right here through `RunStoreNow`; `False` if the store
        could not (nothing written)."""
        assert self._now is not None
        frames, checkpoints, create = self._frames, self._checkpoints, self._create
        try:
            if not self._now.append_now(
                self.run_id,
                frames,
                checkpoints,
                create=create,
                owner=self.owner,
                lease_seconds=self.lease_seconds,
            ):
                return False
        except Exception:
            return False  # `append` says it (and logs it) the usual way
        self._frames, self._checkpoints, self._create = [], [], None
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        if frames and self.on_stored is not None:
            self.on_stored(frames[-1][0])
        return True

    async def _drain(self) -> None:
        while self._frames or self._checkpoints or self._create is not None:
            if self._now is not None and self._drain_now():
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
                log.warning(
                    "another process took this durable run over; stopping it here",
                    run=self.run_id,
                    exc_info=True,
                )
                self.lost = True
                self._frames.clear()
                self._checkpoints.clear()
                if self.on_lost is not None:
                    self.on_lost()
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
            if frames and self.on_stored is not None:
                self.on_stored(frames[-1][0])

    async def flushed(self) -> None:
        """Return once everything given so far is stored (or its write failed)."""
        if self._frames or self._checkpoints or self._create is not None:
            self._kick(now=True)
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)


class LiveRuns:
    """The app's live (and recently finished) runs, by endpoint path and conversation.

    The embedded `contracts.RunJournal`: journals live in this process's memory and, with a
    `store` (durable runs), in the store too; with a `feed` instead (durable runs off, a shared
    store), frames are shared there for other replicas to follow (see the module docstring).
    """

    def __init__(
        self,
        store: RunStore | None = None,
        *,
        feed: RunStore | None = None,
        lease_seconds: float = LEASE_SECONDS,
        keep_seconds: float = KEEP_FINISHED_SECONDS,
    ) -> None:
        if store is not None and feed is not None:
            raise ValueError("a run journal has a durable store or a frame feed, not both")
        self.store = store
        self.feed = feed
        """The frame feed's store (durable runs off): frames only, for other replicas."""
        self.lease_seconds = lease_seconds
        self.keep_seconds = keep_seconds
        self.owner = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex}"
        """This process as a lease owner (`host/pid/token`, see `RunStore`)."""
        if feed is not None:
            self.owner = FEED_OWNER + self.owner
        self._runs: dict[tuple[str, str], list[LiveRun]] = {}
        self._finished: OrderedDict[int, LiveRun] = OrderedDict()
        self._resume: Resume | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._closers: set[asyncio.Task[None]] = set()
        self._opened = False

    @property
    def durable(self) -> bool:
        return self.store is not None

    def start(
        self,
        work: Callable[[LiveRunHandle], Coroutine[Any, Any, Any]],
        *,
        path: str,
        conversation_id: str,
        user_id: str | None,
        session_id: str | None = None,
        message: str = "",
    ) -> LiveRun:
        """Run `work(live)` in its own task, writing its frames into a new journal."""
        writer = feed = None
        if self.store is not None or self.feed is not None:
            session_id = session_id or uuid.uuid4().hex
            record = StoredRun(
                run_id=uuid.uuid4().hex,
                path=path,
                conversation_id=conversation_id,
                user_id=user_id,
                session_id=session_id,
                # A feed's run is never run again: its message stays out of the store.
                message=message if self.store is not None else "",
                started_at=time.time(),
            )
            if self.store is not None:
                writer = _StoreWriter(
                    self.store,
                    record.run_id,
                    owner=self.owner,
                    lease_seconds=self.lease_seconds,
                    create=record,
                )
            elif self.feed is not None:
                feed = _FeedWriter(
                    _FeedStore(self.feed),
                    record.run_id,
                    owner=self.owner,
                    lease_seconds=self.lease_seconds,
                    create=record,
                )
        live = LiveRun(
            path, conversation_id, user_id, session_id=session_id, writer=writer, feed=feed
        )
        return self._launch(live, work)

    def _launch(
        self, live: LiveRun, work: Callable[[LiveRunHandle], Coroutine[Any, Any, Any]]
    ) -> LiveRun:
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
        another replica executes is found there and followed from it (`kernel.remote.RemoteRun`)."""
        local = self._find_local(path, conversation_id, session_id)
        shared = self.store if self.store is not None else self.feed
        feed: object = shared
        if shared is None or not isinstance(feed, RunFeed):
            return local
        if (
            local is not None
            and not local.finished
            and (session_id is None or local.session_id == session_id)
        ):
            return local
        try:
            found = await feed.latest(path, conversation_id, session_id=session_id)
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
        return RemoteRun(feed, stored, _resolved, shared, durable=self.durable)

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

    # --- durable: resume, leases, expiry ------------------------------------------------------

    async def open(self, resume: Resume) -> None:
        """Open the store, resume the unfinished runs it holds, and keep leases alive."""
        if self.feed is not None and not self._opened:
            self._opened = True
            await self.feed.open()
            self._keeper = asyncio.get_running_loop().create_task(
                self._keep_feed(), name="run-feed"
            )
            return
        if self.store is None or self._opened:
            return
        self._opened = True
        await self.store.open()
        self._resume = resume
        await self._claim()
        self._keeper = asyncio.get_running_loop().create_task(self._keep(), name="run-journal")

    async def _claim(self) -> None:
        assert self.store is not None
        for stored in await self.store.claim(self.owner, self.lease_seconds, CLAIM_BATCH):
            try:
                await self._resume_one(stored)
            except Exception:
                # One unreadable run must not keep the others (or the server) from starting.
                log.error("could not resume a durable run", run=stored.run_id, exc_info=True)

    async def _resume_one(self, stored: StoredRun) -> None:
        assert self.store is not None
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
        writer = _StoreWriter(
            self.store,
            stored.run_id,
            owner=self.owner,
            lease_seconds=self.lease_seconds,
            create=None,
        )
        live = LiveRun(
            stored.path,
            stored.conversation_id,
            stored.user_id,
            session_id=stored.session_id,
            writer=writer,
            checkpoints=checkpoints,
            frames=_resolved(frames, checkpoints),
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

        def work(handle: LiveRunHandle) -> Coroutine[Any, Any, Any]:
            return resume(handle, stored)

        self._launch(live, work)

    async def _keep(self) -> None:
        """Every third of a lease: extend ours, take over expired ones, expire finished ones."""
        assert self.store is not None
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.store.heartbeat(self.owner, self.lease_seconds)
                await self._claim()
                await self.store.expire(time.time() - self.keep_seconds)
                await _abandon(self.store)
            except Exception as exc:
                fault(log, "run journal upkeep failed; retrying", exc, every=False)
            reraise_cancellation()  # (one the store's driver swallowed: `_cancel`)

    async def _keep_feed(self) -> None:
        """The frame feed's upkeep, every third of a lease: extend this replica's leases (so
        its runs read as alive), end the runs of replicas that died, drop finished ones."""
        assert self.feed is not None
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.feed.heartbeat(self.owner, self.lease_seconds)
                await _abandon(self.feed)
                await self.feed.expire(time.time() - self.keep_seconds)
            except Exception as exc:
                fault(log, "run feed upkeep failed; retrying", exc, every=False)
            reraise_cancellation()

    # --- shutdown -------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Shutdown: end every reader with an `error` frame, stop every unfinished run and wait
        for it to unwind; durable runs stay unfinished in the store, released for a restart."""
        message = RESTARTING if self.store is not None else STOPPING
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
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        shared = self.store if self.store is not None else self.feed
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
        if live._writer is not None:
            closer = asyncio.get_running_loop().create_task(self._finish_durable(live))
            self._closers.add(closer)
            closer.add_done_callback(self._closers.discard)
            return
        self._finished_now(live)
        if live._feed is not None:
            closer = asyncio.get_running_loop().create_task(self._finish_feed(live))
            self._closers.add(closer)
            closer.add_done_callback(self._closers.discard)

    async def _finish_feed(self, live: LiveRun) -> None:
        """Share the run's last frames (and a last `error` frame if it ended without one, so
        remote readers end), then mark it finished (its frames go after a grace period)."""
        writer = live._feed
        assert writer is not None
        assert self.feed is not None
        last = live._frames[-1] if live._frames else None
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
        if writer.lost or (isinstance(shared, _FeedStore) and not shared.failed):
            return  # (its terminal frame's write finished it in the store)
        try:
            await self.feed.finish(writer.run_id)
        except Exception as exc:
            fault(log, "could not mark a shared run finished", exc, every=False, run=writer.run_id)

    async def _finish_durable(self, live: LiveRun) -> None:
        """Store the run's last frames before readers see its end, then compact it (unless a
        shutdown suspended it: it stays unfinished, to resume)."""
        writer = live._writer
        assert writer is not None
        assert self.store is not None
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


class _FeedWriter(_StoreWriter):
    """The frame feed's writer: a `_StoreWriter` whose first write (the run's record, so that
    other replicas find the run) goes after `FEED_FIRST_SECONDS`, and every later group after
    gathering frames for `FEED_LINGER_SECONDS`; the terminal frame cuts either wait short. A
    long run costs a write per linger at most, one that ends within the first wait one write
    (with its terminal frame, which also finishes it: `RunStore`). Remote readers poll slower
    than the linger anyway."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ended = asyncio.Event()

    def frame(self, frame: Frame) -> None:
        if frame.terminal:
            self._ended.set()
        super().frame(frame)

    async def _drain(self) -> None:
        if not self._ended.is_set():
            wait = FEED_FIRST_SECONDS if self._create is not None else FEED_LINGER_SECONDS
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._ended.wait()
        await super()._drain()


class _FeedStore:
    """The frame feed's store as its `_StoreWriter` sees it: a failed write is a warning
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


async def _abandon(store: RunStore) -> None:
    """End the frame-feed runs of replicas that died (their lease ran out), if `store` can."""
    feed: object = store
    if isinstance(feed, RunFeed):
        await feed.abandon(ABANDONED, CLAIM_BATCH)


def encode(value: Any) -> str:
    """JSON as a `RunStore` takes it: compact, ASCII (a lone surrogate a model sent survives as
    an escape; it is also CPython's fastest encoder)."""
    return _ENCODE(value)


_ENCODE = compact_json(default=str)
_STRING = compact_json(check_circular=False)
"""`encode` of a string (it has no cycle to check for)."""


REFERENCE = "$model"
"""A stored `tool-start` frame's `arguments` as `{"$model": "<checkpoint key>"}`: the very
arguments of that call in that model turn's checkpoint (a large argument is stored once)."""
_REFERENCE_KEY = _STRING(REFERENCE)


def _resolved(frames: list[Frame], checkpoints: Mapping[str, Any]) -> list[Frame]:
    """Stored frames as they were sent: references (`_StoreWriter._tool_start`) replaced by
    arguments."""
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


def _size(frame: Frame) -> int:
    return 64 + sum(_text_size(value) for value in frame.data.values())


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
