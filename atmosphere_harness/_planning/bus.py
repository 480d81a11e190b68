"""The plan event bus: every `plan-update` of a conversation, fanned out to its live viewers.

`write_todos` publishes each saved plan under its owner and conversation; `GET P/plan/events`
subscribes. The bus is a small protocol so a shared broker (Redis Streams) can replace the
in-process implementation when several workers serve one app; ids are opaque strings so a Redis
stream id can be used as is.

`InProcessPlanBus` policy, chosen so no viewer can hurt the agent or its other viewers:

- **Publishing never waits.** Each subscriber has a bounded buffer (`queue_size` events). When a
  slow subscriber's buffer is full, its *oldest* pending update is dropped (and a WARN logged
  once for that subscriber). Every update carries the whole plan, so a subscriber that loses
  intermediate updates still ends on the current plan. A viewer that stops reading altogether is
  disconnected by the SSE layer's send timeout.
- **Replay is bounded.** Each conversation keeps its last `history_size` updates for
  `Last-Event-ID` resumption, and all conversations together keep at most `history_bytes` of
  them and `max_topics` conversations (least recently active first out; a conversation with live
  viewers only loses its history). An id the bus no longer knows (evicted, from before a
  restart, or simply wrong) yields `replay=None`, and the caller sends a fresh snapshot instead.
- Ids are `{epoch}-{n}`: `n` counts the conversation's updates and `epoch` is random per
  conversation record, so an id from an earlier record (or process) is never mistaken for one
  of the current record.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._errors import PlanBusFull
from .._events import json_line
from .._log import get_logger

log = get_logger(__name__)

QUEUE_SIZE = 64
HISTORY_SIZE = 64
HISTORY_BYTES = 16 * 1024 * 1024
MAX_TOPICS = 4096
MAX_SUBSCRIBERS = 10_000


@dataclass(frozen=True, slots=True)
class PlanEvent:
    """One published plan: its id (the SSE `id:`), the payload, and the payload as JSON.

    `json` is encoded once at publish time, so a thousand viewers cost one encoding.
    """

    id: str
    data: Mapping[str, Any]
    json: str


class PlanSubscription(Protocol):
    """A live view of one conversation's updates.

    `replay` holds the updates published after the `last_event_id` given to `subscribe`, or is
    `None` when that id was absent or unknown (then send a snapshot, with id `cursor`). Iterating
    yields every update published after the subscription began, in order, until the bus closes:
    each item is a non-empty batch of whatever accumulated since the previous one, so a viewer
    that fell behind catches up in one write instead of one write per update.
    """

    @property
    def replay(self) -> Sequence[PlanEvent] | None: ...

    @property
    def cursor(self) -> str: ...

    def __aiter__(self) -> AsyncIterator[Sequence[PlanEvent]]: ...


class PlanEventBus(Protocol):
    """Fan-out of plan updates keyed by owner + conversation."""

    async def publish(
        self, owner: str, conversation_id: str, data: Mapping[str, Any]
    ) -> PlanEvent: ...

    def subscribe(
        self, owner: str, conversation_id: str, *, last_event_id: str | None = None
    ) -> AbstractAsyncContextManager[PlanSubscription]: ...

    async def forget(self, owner: str, conversation_id: str) -> None:
        """Drop the conversation's stored updates (a deleted conversation); its viewers here
        end."""
        ...

    async def aclose(self) -> None: ...


def encode(data: Mapping[str, Any]) -> str:
    """A plan event's `data:` line (see `events.line_safe`)."""
    return json_line(data)


@dataclass(eq=False)
class Subscriber:
    """One viewer's bounded queue of plan updates: the `PlanSubscription` every bus hands out.

    Shared by the embedded, PostgreSQL and Redis buses so that a slow viewer is treated the same
    on each (its oldest pending updates go, with one WARN) and batches come out the same way.
    """

    pending: deque[PlanEvent]
    replay: Sequence[PlanEvent] | None = None
    cursor: str = ""
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False
    dropped: int = 0

    def push(self, event: PlanEvent) -> None:
        if len(self.pending) == self.pending.maxlen:
            if not self.dropped:
                log.warning(
                    "slow plan subscriber: dropping its oldest pending updates",
                    buffer=self.pending.maxlen,
                )
            self.dropped += 1
        self.pending.append(event)
        self.wakeup.set()

    def close(self) -> None:
        self.closed = True
        self.wakeup.set()

    def __aiter__(self) -> AsyncIterator[Sequence[PlanEvent]]:
        return self._batches()

    async def _batches(self) -> AsyncIterator[Sequence[PlanEvent]]:
        while True:
            if self.pending:
                batch = list(self.pending)
                self.pending.clear()
                yield batch
                continue
            if self.closed:
                return
            self.wakeup.clear()
            await self.wakeup.wait()


@dataclass(eq=False, slots=True)
class _Topic:
    epoch: str = field(default_factory=lambda: secrets.token_hex(4))
    seq: int = 0
    history: deque[tuple[int, PlanEvent]] = field(default_factory=deque)
    history_bytes: int = 0
    subscribers: set[Subscriber] = field(default_factory=set)

    def cursor(self) -> str:
        return f"{self.epoch}-{self.seq}"

    def replay_after(self, last_event_id: str | None) -> list[PlanEvent] | None:
        """The updates after `last_event_id`, or `None` when the id cannot be resumed from."""
        if last_event_id is None:
            return None
        epoch, _, number = last_event_id.strip().partition("-")
        if epoch != self.epoch or not number.isdigit():
            return None
        seen = int(number)
        if seen > self.seq:
            return None
        oldest = self.history[0][0] if self.history else self.seq + 1
        if seen < oldest - 1:
            return None
        return [event for seq, event in self.history if seq > seen]


class InProcessPlanBus:
    """The single-worker bus: per-subscriber bounded buffers, bounded replay history."""

    def __init__(
        self,
        *,
        queue_size: int = QUEUE_SIZE,
        history_size: int = HISTORY_SIZE,
        history_bytes: int = HISTORY_BYTES,
        max_topics: int = MAX_TOPICS,
        max_subscribers: int = MAX_SUBSCRIBERS,
    ) -> None:
        if min(queue_size, history_size, history_bytes, max_topics, max_subscribers) <= 0:
            raise ValueError("plan bus bounds must be positive")
        self.queue_size = queue_size
        self.history_size = history_size
        self.history_bytes = history_bytes
        self.max_topics = max_topics
        self.max_subscribers = max_subscribers
        self._topics: OrderedDict[tuple[str, str], _Topic] = OrderedDict()
        self._bytes = 0
        self._closed = False

    async def publish(self, owner: str, conversation_id: str, data: Mapping[str, Any]) -> PlanEvent:
        key = (owner, conversation_id)
        topic = self._topic(key)
        topic.seq += 1
        event = PlanEvent(f"{topic.epoch}-{topic.seq}", data, encode(data))
        if len(topic.history) >= self.history_size:
            self._forget_oldest(topic)
        topic.history.append((topic.seq, event))
        topic.history_bytes += len(event.json)
        self._bytes += len(event.json)
        for subscriber in topic.subscribers:
            subscriber.push(event)
        self._enforce_bounds()
        return event

    @contextlib.asynccontextmanager
    async def subscribe(
        self, owner: str, conversation_id: str, *, last_event_id: str | None = None
    ) -> AsyncIterator[PlanSubscription]:
        key = (owner, conversation_id)
        topic = self._topic(key)
        if len(topic.subscribers) >= self.max_subscribers:
            raise PlanBusFull(
                f"conversation {conversation_id!r} already has {self.max_subscribers} viewers"
            )
        subscriber = Subscriber(
            deque(maxlen=self.queue_size), topic.replay_after(last_event_id), topic.cursor()
        )
        if self._closed:
            subscriber.close()
        topic.subscribers.add(subscriber)
        try:
            yield subscriber
        finally:
            topic.subscribers.discard(subscriber)
            if not topic.subscribers and not topic.history and self._topics.get(key) is topic:
                del self._topics[key]

    async def aclose(self) -> None:
        """End every subscription (viewers get what was already queued, then the end)."""
        self._closed = True
        for topic in self._topics.values():
            for subscriber in topic.subscribers:
                subscriber.close()

    async def forget(self, owner: str, conversation_id: str) -> None:
        topic = self._topics.pop((owner, conversation_id), None)
        if topic is None:
            return
        self._bytes -= topic.history_bytes
        topic.history.clear()
        topic.history_bytes = 0
        for subscriber in topic.subscribers:
            subscriber.close()

    def subscriber_count(self, owner: str, conversation_id: str) -> int:
        topic = self._topics.get((owner, conversation_id))
        return len(topic.subscribers) if topic is not None else 0

    # --- bounds -------------------------------------------------------------------------------

    def _topic(self, key: tuple[str, str]) -> _Topic:
        topic = self._topics.get(key)
        if topic is None:
            topic = self._topics[key] = _Topic()
        else:
            self._topics.move_to_end(key)
        return topic

    def _forget_oldest(self, topic: _Topic) -> None:
        _seq, old = topic.history.popleft()
        topic.history_bytes -= len(old.json)
        self._bytes -= len(old.json)

    def _enforce_bounds(self) -> None:
        """Least recently active first: drop idle conversations, clear busy ones' history."""
        if self._bytes <= self.history_bytes and len(self._topics) <= self.max_topics:
            return
        for key in list(self._topics):
            topic = self._topics[key]
            self._bytes -= topic.history_bytes
            topic.history.clear()
            topic.history_bytes = 0
            if not topic.subscribers:
                del self._topics[key]
            if self._bytes <= self.history_bytes and len(self._topics) <= self.max_topics:
                return
