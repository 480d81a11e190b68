"""`PostgresPlanBus`: plan updates fanned out to viewers on every replica by `LISTEN/NOTIFY`.

Every update is a row of `atmosphere_plan_events` (so any replica can replay it) and a
`NOTIFY atmosphere_plans` sent in the same transaction, whose payload names only the topic and
the row id: the listening replicas read the rows themselves (a plan can exceed NOTIFY's 8000
bytes), one query per conversation and wake-up whatever the number of local viewers.

Ids are `{epoch}-{row id}`, the epoch being random per database, so a `Last-Event-ID` resumes
on any replica, also after a restart. What is kept, and so what a viewer can resume from:

- the newest `history_size` updates of each conversation (older ones are pruned at publish);
- nothing older than `ttl` seconds (expired rows are swept at most every `SWEEP_SECONDS`);
- per topic, `atmosphere_plan_topics.pruned_upto` records the newest pruned id, so an id older
  than that yields `replay=None` (the route then sends a snapshot) instead of a silent gap.

Viewers get the embedded bus's policy: publishing never waits on a viewer, each viewer has a
bounded buffer that drops its oldest pending update when full (every update carries the whole
plan), and a conversation has at most `max_subscribers` viewers on this replica. When the
`LISTEN` connection is lost and restored, every topic re-reads what it may have missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..._errors import PlanBusFull
from ..._log import fault, get_logger
from ..._planning.bus import (
    HISTORY_SIZE,
    MAX_SUBSCRIBERS,
    QUEUE_SIZE,
    PlanEvent,
    PlanSubscription,
    Subscriber,
    encode,
)
from .database import PostgresDatabase

log = get_logger(__name__)

CHANNEL = "atmosphere_plans"
TTL_SECONDS = 3600.0
SWEEP_SECONDS = 60.0
FETCH_BATCH = 256

Topic = tuple[str, str]


@dataclass(eq=False)
class _Viewer(Subscriber):
    """One subscription: what it still has to read, from `after` on."""

    after: int = 0


@dataclass(eq=False)
class _LocalTopic:
    """This replica's viewers of one conversation and the pump that feeds them."""

    last_id: int = 0
    viewers: set[_Viewer] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wanted: asyncio.Event = field(default_factory=asyncio.Event)
    pump: asyncio.Task[None] | None = None


class PostgresPlanBus:
    """A `planning.PlanEventBus` on PostgreSQL (see the module docstring)."""

    def __init__(
        self,
        database: PostgresDatabase,
        *,
        queue_size: int = QUEUE_SIZE,
        history_size: int = HISTORY_SIZE,
        ttl: float = TTL_SECONDS,
        max_subscribers: int = MAX_SUBSCRIBERS,
    ) -> None:
        if min(queue_size, history_size, ttl, max_subscribers) <= 0:
            raise ValueError("plan bus bounds must be positive")
        self.database = database
        self.queue_size = queue_size
        self.history_size = history_size
        self.ttl = ttl
        self.max_subscribers = max_subscribers
        self._topics: dict[Topic, _LocalTopic] = {}
        self._closed = False
        self._next_sweep = 0.0
        database.listen(CHANNEL, self._notified)
        database.on_reconnect(self._wake_all)

    # --- publishing -----------------------------------------------------------------------

    async def publish(self, owner: str, conversation_id: str, data: Mapping[str, Any]) -> PlanEvent:
        text = encode(data)
        now = time.time()
        sweep = now >= self._next_sweep
        if sweep:
            self._next_sweep = now + SWEEP_SECONDS

        async def work(connection: Any) -> int:
            async with connection.transaction():
                row_id = int(
                    await connection.fetchval(
                        "INSERT INTO atmosphere_plan_events (owner, conversation_id, data, "
                        "created_at) VALUES ($1, $2, $3, $4) RETURNING id",
                        owner,
                        conversation_id,
                        text,
                        now,
                    )
                )
                await connection.execute(
                    "WITH gone AS (DELETE FROM atmosphere_plan_events WHERE owner = $1 AND "
                    "conversation_id = $2 AND id <= (SELECT id FROM atmosphere_plan_events "
                    "WHERE owner = $1 AND conversation_id = $2 ORDER BY id DESC LIMIT 1 "
                    "OFFSET $3) RETURNING id) "
                    "INSERT INTO atmosphere_plan_topics (owner, conversation_id, pruned_upto) "
                    "SELECT $1, $2, max(id) FROM gone HAVING count(*) > 0 "
                    "ON CONFLICT (owner, conversation_id) DO UPDATE SET pruned_upto = "
                    "greatest(atmosphere_plan_topics.pruned_upto, excluded.pruned_upto)",
                    owner,
                    conversation_id,
                    self.history_size,
                )
                if sweep:
                    await self._sweep(connection, now - self.ttl)
                await connection.execute(
                    "SELECT pg_notify($1, $2)",
                    CHANNEL,
                    json.dumps([owner, conversation_id, row_id]),
                )
                return row_id

        row_id = await self.database.run(work)
        return PlanEvent(self._event_id(row_id), data, text)

    async def forget(self, owner: str, conversation_id: str) -> None:
        """Drop the conversation's stored updates and its pruning mark."""

        async def work(connection: Any) -> None:
            async with connection.transaction():
                for table in ("atmosphere_plan_events", "atmosphere_plan_topics"):
                    await connection.execute(
                        f"DELETE FROM {table} WHERE owner = $1 AND conversation_id = $2",
                        owner,
                        conversation_id,
                    )

        await self.database.run(work)

    async def _sweep(self, connection: Any, before: float) -> None:
        """Drop expired updates of every conversation, remembering how far each was pruned."""
        await connection.execute(
            "WITH gone AS (DELETE FROM atmosphere_plan_events WHERE created_at < $1 "
            "RETURNING owner, conversation_id, id) "
            "INSERT INTO atmosphere_plan_topics (owner, conversation_id, pruned_upto) "
            "SELECT owner, conversation_id, max(id) FROM gone GROUP BY owner, conversation_id "
            "ON CONFLICT (owner, conversation_id) DO UPDATE SET pruned_upto = "
            "greatest(atmosphere_plan_topics.pruned_upto, excluded.pruned_upto)",
            before,
        )

    def _event_id(self, row_id: int) -> str:
        return f"{self.database.epoch}-{row_id}"

    def _row_id(self, event_id: str | None) -> int | None:
        if event_id is None:
            return None
        epoch, _, number = event_id.strip().partition("-")
        if epoch != self.database.epoch or not number.isdigit() or len(number) > 18:
            return None
        return int(number)

    # --- subscribing ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def subscribe(
        self, owner: str, conversation_id: str, *, last_event_id: str | None = None
    ) -> AsyncIterator[PlanSubscription]:
        key = (owner, conversation_id)
        topic = self._topics.get(key)
        if topic is None:
            topic = self._topics[key] = _LocalTopic()
        if len(topic.viewers) >= self.max_subscribers:
            raise PlanBusFull(
                f"conversation {conversation_id!r} already has {self.max_subscribers} viewers"
            )
        viewer = _Viewer(deque(maxlen=self.queue_size))
        try:
            async with topic.lock:
                cursor, replay = await self._start(key, self._row_id(last_event_id))
                viewer.after = cursor
                viewer.cursor = self._event_id(cursor)
                viewer.replay = replay
                if not topic.viewers:
                    topic.last_id = max(topic.last_id, cursor)
                topic.viewers.add(viewer)
            if self._closed:
                viewer.close()
            if topic.pump is None and not self._closed:
                topic.pump = asyncio.get_running_loop().create_task(
                    self._pump(key, topic), name=f"plan-bus:{owner}:{conversation_id}"
                )
            yield viewer
        finally:
            topic.viewers.discard(viewer)
            if not topic.viewers and self._topics.get(key) is topic:
                del self._topics[key]
                if topic.pump is not None:
                    topic.pump.cancel()

    async def _start(self, key: Topic, after: int | None) -> tuple[int, list[PlanEvent] | None]:
        """The topic's cursor now and, when `after` can be resumed from, the updates after it."""

        async def work(connection: Any) -> tuple[int, list[Any] | None]:
            async with connection.transaction(isolation="repeatable_read", readonly=True):
                row = await connection.fetchrow(
                    "SELECT (SELECT max(id) FROM atmosphere_plan_events WHERE owner = $1 AND "
                    "conversation_id = $2) AS newest, (SELECT pruned_upto FROM "
                    "atmosphere_plan_topics WHERE owner = $1 AND conversation_id = $2) AS pruned",
                    *key,
                )
                pruned = int(row["pruned"] or 0)
                cursor = max(int(row["newest"] or 0), pruned)
                if after is None or after < pruned or after > cursor:
                    return cursor, None
                rows: list[Any] = await connection.fetch(
                    "SELECT id, data FROM atmosphere_plan_events WHERE owner = $1 AND "
                    "conversation_id = $2 AND id > $3 ORDER BY id",
                    *key,
                    after,
                )
                return cursor, rows

        cursor, rows = await self.database.run(work)
        if rows is None:
            return cursor, None
        return cursor, [self._event(row) for row in rows]

    def _event(self, row: Any) -> PlanEvent:
        text = str(row["data"])
        return PlanEvent(self._event_id(int(row["id"])), json.loads(text), text)

    # --- delivery -------------------------------------------------------------------------

    def _notified(self, payload: str) -> None:
        try:
            owner, conversation_id, row_id = json.loads(payload)
        except (ValueError, TypeError):
            return
        topic = self._topics.get((owner, conversation_id))
        if topic is not None and int(row_id) > topic.last_id:
            topic.wanted.set()

    def _wake_all(self) -> None:
        for topic in self._topics.values():
            topic.wanted.set()

    async def _pump(self, key: Topic, topic: _LocalTopic) -> None:
        """Read the topic's new rows whenever told, and hand each viewer what it lacks."""
        while True:
            await topic.wanted.wait()
            topic.wanted.clear()
            try:
                async with topic.lock:
                    await self._deliver(key, topic)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # An outage: viewers keep their stream; the reconnect wakes the pump again.
                fault(log, "plan bus could not read updates", exc, every=False)

    async def _deliver(self, key: Topic, topic: _LocalTopic) -> None:
        while True:

            async def work(connection: Any) -> list[Any]:
                rows: list[Any] = await connection.fetch(
                    "SELECT id, data FROM atmosphere_plan_events WHERE owner = $1 AND "
                    "conversation_id = $2 AND id > $3 ORDER BY id LIMIT $4",
                    *key,
                    topic.last_id,
                    FETCH_BATCH,
                )
                return rows

            rows = await self.database.run(work)
            for row in rows:
                event = self._event(row)
                row_id = int(row["id"])
                for viewer in topic.viewers:
                    if row_id > viewer.after:
                        viewer.push(event)
                        viewer.after = row_id
                topic.last_id = row_id
            if len(rows) < FETCH_BATCH:
                return

    async def aclose(self) -> None:
        """End every subscription (viewers get what was already queued, then the end)."""
        self._closed = True
        for topic in list(self._topics.values()):
            for viewer in topic.viewers:
                viewer.close()
            if topic.pump is not None:
                topic.pump.cancel()
                topic.pump = None

    def subscriber_count(self, owner: str, conversation_id: str) -> int:
        topic = self._topics.get((owner, conversation_id))
        return len(topic.viewers) if topic is not None else 0
