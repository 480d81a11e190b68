"""`RedisPlanBus`: plan updates on Redis Streams, so a viewer on any replica sees every write.

- **Publish** is one `XADD` to the conversation's stream, trimmed to about `history_size`
  entries (`MAXLEN ~`) and given a TTL (`stream_ttl`, renewed by each publish), so Redis holds a
  bounded, self-expiring replay log per conversation. The event id is the stream id.
- **Follow**: each process runs one *pump* task that reads, with one blocking `XREAD`, every
  stream this process has viewers for, and hands each entry to those viewers' bounded buffers
  (the `InProcessPlanBus` policy: a slow viewer loses its oldest pending updates, never blocks
  anyone; each update carries the whole plan). A new stream joins the read by a write to the
  process's own control stream, which wakes the blocking read. So viewers cost no connection
  each: one per process.
- **Resume** (`Last-Event-ID`) works on any replica, because the id is the stream id: the
  updates after it are an `XRANGE`, exact as long as the stream still holds them. An id older
  than what was trimmed, newer than the stream, or malformed gives `replay=None` (snapshot).
- **Outage**: the pump keeps its place per stream and retries with backoff; viewers stay
  connected and get what they missed once Redis is back (as far as the stream still holds it).
  `publish` raises `RedisUnavailable` (the plan tool logs it; the plan itself is stored first).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from ..._cancel import reraise_cancellation
from ..._errors import PlanBusFull
from ..._log import get_logger
from ..._planning.bus import (
    HISTORY_SIZE,
    MAX_SUBSCRIBERS,
    MAX_TOPICS,
    QUEUE_SIZE,
    PlanEvent,
    PlanSubscription,
    Subscriber,
    encode,
)
from .connection import RedisConnection, digest

log = get_logger(__name__)

STREAM_TTL = 24 * 3600
"""Seconds a conversation's update log outlives its last update."""
BLOCK_MS = 5000
"""One blocking read waits at most this long (then it simply reads again)."""
READ_COUNT = 256
"""Entries read per stream per round trip."""
BACKOFF = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)

_STREAM_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
_ZERO = "0-0"


def parse_id(value: str) -> tuple[int, int] | None:
    value = value.strip()
    if not _STREAM_ID.match(value):
        return None
    first, _, second = value.partition("-")
    return int(first), int(second)


@dataclass(eq=False)
class _Viewer(Subscriber):
    """One subscription: its bounded buffer, its replay and the cursor it started after."""

    after: tuple[int, int] = (0, 0)

    def offer(self, event: PlanEvent, order: tuple[int, int]) -> None:
        if order <= self.after:
            return  # already in the snapshot or the replay this viewer was given
        self.after = order
        self.push(event)


@dataclass(eq=False, slots=True)
class _Stream:
    """A stream this process follows: where the pump is, and who gets what it reads."""

    last_id: str
    viewers: set[_Viewer] = field(default_factory=set)


class RedisPlanBus:
    """A `PlanEventBus` on Redis Streams (see the module docstring)."""

    def __init__(
        self,
        connection: RedisConnection,
        *,
        queue_size: int = QUEUE_SIZE,
        history_size: int = HISTORY_SIZE,
        max_topics: int = MAX_TOPICS,
        max_subscribers: int = MAX_SUBSCRIBERS,
        stream_ttl: int = STREAM_TTL,
    ) -> None:
        if min(queue_size, history_size, max_topics, max_subscribers, stream_ttl) <= 0:
            raise ValueError("plan bus bounds must be positive")
        self.connection = connection
        self.queue_size = queue_size
        self.history_size = history_size
        self.max_topics = max_topics
        self.max_subscribers = max_subscribers
        self.stream_ttl = stream_ttl
        self._streams: dict[str, _Stream] = {}
        self._control = connection.key("bus", "control", secrets.token_hex(8))
        self._pump: asyncio.Task[None] | None = None
        self._reader: Redis | None = None
        self._reading = False
        self._wanted = asyncio.Event()
        self._pokes: set[asyncio.Task[None]] = set()
        self._closed = False

    def __repr__(self) -> str:
        return f"RedisPlanBus({self.connection!r})"

    def stream_key(self, owner: str, conversation_id: str) -> str:
        return self.connection.key("bus", digest(owner, conversation_id))

    async def publish(self, owner: str, conversation_id: str, data: Mapping[str, Any]) -> PlanEvent:
        text = encode(data)
        key = self.stream_key(owner, conversation_id)
        client = self.connection.client
        with self.connection.unavailable("publishing a plan update"):
            async with client.pipeline(transaction=True) as pipe:
                pipe.xadd(key, {"d": text}, maxlen=self.history_size, approximate=True)
                pipe.expire(key, self.stream_ttl)
                event_id, _ = await pipe.execute()
        return PlanEvent(str(event_id), data, text)

    async def forget(self, owner: str, conversation_id: str) -> None:
        """Drop the conversation's stream (its stored updates)."""
        with self.connection.unavailable("deleting a conversation's plan updates"):
            await self.connection.client.delete(self.stream_key(owner, conversation_id))

    @contextlib.asynccontextmanager
    async def subscribe(
        self, owner: str, conversation_id: str, *, last_event_id: str | None = None
    ) -> AsyncIterator[PlanSubscription]:
        key = self.stream_key(owner, conversation_id)
        stream = self._streams.get(key)
        if stream is not None and len(stream.viewers) >= self.max_subscribers:
            raise PlanBusFull(
                f"conversation {conversation_id!r} already has {self.max_subscribers} viewers"
            )
        if stream is None and len(self._streams) >= self.max_topics:
            raise PlanBusFull(
                f"this process already follows {self.max_topics} conversations' plans"
            )
        with self.connection.unavailable("opening a plan stream"):
            replay, cursor = await self._position(key, last_event_id)
        viewer = _Viewer(
            deque(maxlen=self.queue_size),
            replay,
            cursor,
            after=parse_id(replay[-1].id if replay else cursor) or (0, 0),
        )
        if self._closed:
            viewer.close()
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream(cursor)
            self._wake_pump()
        stream.viewers.add(viewer)
        try:
            await self._fill_gap(key, stream, viewer)
            yield viewer
        finally:
            stream.viewers.discard(viewer)
            if not stream.viewers and self._streams.get(key) is stream:
                del self._streams[key]

    async def _fill_gap(self, key: str, stream: _Stream, viewer: _Viewer) -> None:
        """Give a viewer what the pump read for others between its snapshot and its joining.

        Everything the pump reads from now on is pushed to it; what the pump had already read
        past the viewer's cursor is fetched here and put before it, so nothing is skipped.
        """
        start = viewer.after
        end = parse_id(stream.last_id) or (0, 0)
        if end <= start:
            return
        with self.connection.unavailable("opening a plan stream"):
            entries: Any = await self.connection.client.xrange(
                key, min=f"({start[0]}-{start[1]}", max=f"{end[0]}-{end[1]}"
            )
        missed = [self._event(entry_id, fields) for entry_id, fields in entries]
        viewer.pending = deque([*missed, *viewer.pending], maxlen=self.queue_size)
        viewer.after = max(viewer.after, end)
        if missed:
            viewer.wakeup.set()

    async def _position(
        self, key: str, last_event_id: str | None
    ) -> tuple[list[PlanEvent] | None, str]:
        """`(the updates after last_event_id, or None; the id to follow the stream from)`.

        A resume is exact or refused: the range is read from `last_event_id` inclusive, and
        only when that very entry is still in the stream (nothing after it can have been
        trimmed) are the entries after it the replay. `0-0` (the cursor of a conversation
        nobody had published to) resumes while the stream has never been trimmed.
        """
        client = self.connection.client
        seen = parse_id(last_event_id) if last_event_id else None
        if seen is not None:
            entries: Any = await client.xrange(key, min=f"{seen[0]}-{seen[1]}", max="+")
            events = [self._event(entry_id, fields) for entry_id, fields in entries]
            if events and parse_id(events[0].id) == seen:
                replay = events[1:]
                return replay, (replay[-1].id if replay else events[0].id)
            if seen == (0, 0) and await self._never_trimmed(key):
                return events, (events[-1].id if events else _ZERO)
        newest: Any = await client.xrevrange(key, count=1)
        return None, (str(newest[0][0]) if newest else _ZERO)

    async def _never_trimmed(self, key: str) -> bool:
        try:
            info: dict[str, Any] = await self.connection.client.xinfo_stream(key)
        except ResponseError:  # no such key: nothing was ever published (or it expired)
            return True
        return int(info.get("entries-added", 0)) == int(info.get("length", 0))

    @staticmethod
    def _event(entry_id: Any, fields: Any) -> PlanEvent:
        text = str(fields.get("d", "{}"))
        return PlanEvent(str(entry_id), json.loads(text), text)

    def _wake_pump(self) -> None:
        """Start the pump, or make it read the streams again (one was added)."""
        if self._closed:
            return
        self._wanted.set()
        if self._pump is None or self._pump.done():
            self._pump = asyncio.get_running_loop().create_task(
                self._run_pump(), name="redis-plan-bus"
            )
        elif self._reading:
            # The pump is inside a blocking read of the old set: a control entry wakes it.
            task = asyncio.get_running_loop().create_task(self._poke())
            self._pokes.add(task)
            task.add_done_callback(self._pokes.discard)

    async def _poke(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            async with self.connection.client.pipeline(transaction=False) as pipe:
                pipe.xadd(self._control, {"w": "1"}, maxlen=8)
                pipe.expire(self._control, 3600)
                await pipe.execute()

    async def _run_pump(self) -> None:
        failures = 0
        control_id = _ZERO
        while not self._closed:
            if not self._streams:
                self._wanted.clear()
                await self._wanted.wait()
                continue
            if self._reader is None:
                self._reader = self.connection.dedicated()
            wanted: dict[Any, Any] = {self._control: control_id}
            for key, stream in self._streams.items():
                wanted[key] = stream.last_id
            self._reading = True
            try:
                replies: Any = await self._reader.xread(wanted, count=READ_COUNT, block=BLOCK_MS)
                reraise_cancellation()
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                delay = BACKOFF[min(failures, len(BACKOFF) - 1)]
                failures += 1
                if failures == 1:
                    log.warning(
                        "plan bus lost Redis; viewers stay connected and catch up when it is back",
                        error=self.connection.scrub(exc),
                    )
                await self._drop_reader()
                await asyncio.sleep(delay)
                continue
            finally:
                self._reading = False
            if failures:
                log.info("plan bus reconnected to Redis", after_failures=failures)
                failures = 0
            for key, entries in replies or ():
                if key == self._control:
                    control_id = str(entries[-1][0])
                    continue
                following = self._streams.get(key)
                if following is None:
                    continue
                for entry_id, fields in entries:
                    event = self._event(entry_id, fields)
                    order = parse_id(event.id) or (0, 0)
                    following.last_id = event.id
                    for viewer in list(following.viewers):
                        viewer.offer(event, order)
        await self._drop_reader()

    async def _drop_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(RedisError, OSError):
                await reader.aclose()

    async def aclose(self) -> None:
        """End every subscription (viewers get what was already queued, then the end)."""
        self._closed = True
        for stream in self._streams.values():
            for viewer in stream.viewers:
                viewer.close()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
            self._pump = None
        await self._drop_reader()
        with contextlib.suppress(RedisError, OSError):
            await self.connection.client.delete(self._control)

    def subscriber_count(self, owner: str, conversation_id: str) -> int:
        stream = self._streams.get(self.stream_key(owner, conversation_id))
        return len(stream.viewers) if stream is not None else 0
