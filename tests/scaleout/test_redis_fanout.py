"""The Redis live fan-out between replicas: the plan bus, approvals, conversation locks, and the
connection (start-up failure, outage, recovery). Two `RedisConnection`s on one Redis stand for two
replicas; the HTTP tests (`test_redis_replicas.py`) do the same with two servers."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import HarnessSettings
from atmosphere_harness._backends import StateBackends, resolve_backends
from atmosphere_harness._backends.redis import (
    RedisApprovalStore,
    RedisConnection,
    RedisConversationLocks,
    RedisHistory,
    RedisPlanBus,
    RedisRunStore,
    with_redis_events,
)
from atmosphere_harness._backends.redis.connection import digest
from atmosphere_harness._errors import HarnessError, PlanBusFull, RedisUnavailable
from atmosphere_harness._governance.approvals import Answer, AnswerStatus
from atmosphere_harness._kernel.live import LiveRuns
from atmosphere_harness._memory.history import ConversationKey, HistoryRead
from atmosphere_harness._planning.bus import PlanEvent
from atmosphere_harness._runtimes.base import Message
from tests.scaleout.redis_service import PrivateRedis, keys_under, url_for

pytestmark = pytest.mark.services

WAIT = 30.0
"""Hang guard for anything that must arrive (never a speed expectation)."""


def plan(n: int) -> dict[str, object]:
    return {"steps": [{"content": f"step {n}", "status": "pending"}], "goal": None}


async def take(subscription: Any, count: int) -> list[PlanEvent]:
    events: list[PlanEvent] = []

    async def read() -> None:
        async for batch in subscription:
            assert batch, "batches are never empty"
            events.extend(batch)
            if len(events) >= count:
                return

    await asyncio.wait_for(read(), WAIT)
    return events


def steps(events: Sequence[PlanEvent]) -> list[str]:
    return [str(event.data["steps"][0]["content"]) for event in events]  # type: ignore[index]


# --- plan bus -------------------------------------------------------------------------------------


async def test_an_update_published_on_one_replica_reaches_viewers_on_another(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    a, b = RedisPlanBus(connection), RedisPlanBus(other_connection)
    try:
        async with (
            b.subscribe("o", "c") as first,
            b.subscribe("o", "c") as second,
            b.subscribe("o", "other") as elsewhere,
        ):
            assert first.replay is None
            assert first.cursor == "0-0"
            published = [await a.publish("o", "c", plan(n)) for n in range(3)]
            assert [e.id for e in await take(first, 3)] == [e.id for e in published]
            assert steps(await take(second, 3)) == ["step 0", "step 1", "step 2"]
            await a.publish("o", "other", plan(9))
            assert steps(await take(elsewhere, 1)) == ["step 9"]
    finally:
        await a.aclose()
        await b.aclose()


async def test_last_event_id_resumes_on_any_replica(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    a, b = RedisPlanBus(connection), RedisPlanBus(other_connection)
    try:
        first = await a.publish("o", "c", plan(1))
        await a.publish("o", "c", plan(2))
        await a.publish("o", "c", plan(3))
        async with b.subscribe("o", "c", last_event_id=first.id) as resumed:
            assert resumed.replay is not None
            assert steps(resumed.replay) == ["step 2", "step 3"]
            await a.publish("o", "c", plan(4))
            assert steps(await take(resumed, 1)) == ["step 4"], "no repeat of the replay"
        async with b.subscribe("o", "c") as fresh:
            assert fresh.replay is None
            async with a.subscribe("o", "c", last_event_id=fresh.cursor) as again:
                assert again.replay == []
    finally:
        await a.aclose()
        await b.aclose()


@pytest.mark.parametrize("stale", ["garbage", "1-", "99999999999999-0", "1-1"])
async def test_an_id_the_stream_cannot_resume_from_asks_for_a_snapshot(
    connection: RedisConnection, stale: str
) -> None:
    bus = RedisPlanBus(connection)
    try:
        newest = [await bus.publish("o", "c", plan(n)) for n in range(2)][-1]
        async with bus.subscribe("o", "c", last_event_id=stale) as subscription:
            assert subscription.replay is None
            assert subscription.cursor == newest.id
    finally:
        await bus.aclose()


async def test_a_trimmed_id_asks_for_a_snapshot(connection: RedisConnection) -> None:
    bus = RedisPlanBus(connection, history_size=5)
    try:
        first = await bus.publish("o", "c", plan(0))
        for n in range(1, 400):  # MAXLEN ~ trims whole nodes, so publish well past it
            await bus.publish("o", "c", plan(n))
        async with bus.subscribe("o", "c", last_event_id=first.id) as subscription:
            assert subscription.replay is None
    finally:
        await bus.aclose()


async def test_nothing_is_skipped_for_a_viewer_joining_a_followed_stream(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    a, b = RedisPlanBus(connection), RedisPlanBus(other_connection)
    try:
        async with b.subscribe("o", "c") as early:
            publishing = asyncio.create_task(
                _publish_many(a, 60),
            )
            joined: list[PlanEvent] = []
            async with b.subscribe("o", "c") as late:
                await publishing
                start = late.cursor
                joined = await take(late, 1) if start != publishing.result()[-1].id else []
                while not joined or joined[-1].id != publishing.result()[-1].id:
                    joined.extend(await take(late, 1))
            everything = await take(early, 60)
        ids = [e.id for e in publishing.result()]
        assert [e.id for e in everything] == ids
        got = [e.id for e in joined]
        assert got == ids[ids.index(got[0]) :], "the late viewer saw every update after its start"
    finally:
        await a.aclose()
        await b.aclose()


async def _publish_many(bus: RedisPlanBus, count: int) -> list[PlanEvent]:
    published = []
    for n in range(count):
        published.append(await bus.publish("o", "c", plan(n)))
        await asyncio.sleep(0)
    return published


async def test_a_slow_viewer_keeps_the_newest_and_blocks_nobody(
    connection: RedisConnection,
) -> None:
    bus = RedisPlanBus(connection, queue_size=4)
    try:
        async with bus.subscribe("o", "c") as slow:
            last = [await bus.publish("o", "c", plan(n)) for n in range(50)][-1]
            seen: list[PlanEvent] = []
            while not seen or seen[-1].id != last.id:
                seen.extend(await take(slow, 1))
            assert len(seen) < 50
            assert seen[-1].id == last.id
    finally:
        await bus.aclose()


async def test_close_ends_every_subscription_and_viewers_are_bounded(
    connection: RedisConnection,
) -> None:
    bus = RedisPlanBus(connection, max_subscribers=2)
    async with bus.subscribe("o", "c") as one, bus.subscribe("o", "c"):
        with pytest.raises(PlanBusFull):
            async with bus.subscribe("o", "c"):
                pass
        await bus.aclose()
        assert await take(one, 0) == []


async def test_viewers_survive_a_redis_restart_and_catch_up(private_redis: PrivateRedis) -> None:
    publisher, follower = RedisConnection(private_redis.url()), RedisConnection(private_redis.url())
    await publisher.open()
    await follower.open()
    a, b = RedisPlanBus(publisher), RedisPlanBus(follower)
    try:
        async with b.subscribe("o", "c") as viewer:
            await a.publish("o", "c", plan(1))
            assert steps(await take(viewer, 1)) == ["step 1"]
            private_redis.stop()
            with pytest.raises(RedisUnavailable, match="ATMOSPHERE_REDIS_URL"):
                await a.publish("o", "c", plan(2))
            private_redis.start()
            await _eventually(lambda: a.publish("o", "c", plan(3)))
            assert steps(await take(viewer, 1)) == ["step 3"]
    finally:
        await a.aclose()
        await b.aclose()
        await publisher.aclose()
        await follower.aclose()


async def _eventually(action: Any) -> Any:
    """Retry `action` while Redis comes back (a hang guard, not a timing expectation)."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        try:
            return await action()
        except RedisUnavailable:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)


# --- approvals ------------------------------------------------------------------------------------


async def _open(store: RedisApprovalStore, user: str | None = "alice", timeout: float = 60) -> Any:
    pending = await store.open(
        path="/p",
        conversation_id="c",
        user_id=user,
        tool="transfer",
        tool_call_id="call-1",
        arguments={"amount": 3},
        timeout=timeout,
    )
    assert pending is not None
    return pending


async def test_an_approval_raised_on_one_replica_is_answered_on_another(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    a, b = RedisApprovalStore(connection), RedisApprovalStore(other_connection)
    pending = await _open(a)
    waiting = asyncio.create_task(a.wait(pending, WAIT))
    listed = await b.pending("/p", "c", user_id="alice")
    assert [entry.to_wire() for entry in listed] == [pending.to_wire()]
    assert await b.pending("/p", "c", user_id="mallory") == []
    assert await b.answer("/p", pending.id, Answer(True), user_id="mallory") is (
        AnswerStatus.FORBIDDEN
    )
    assert await b.answer("/q", pending.id, Answer(True), user_id="alice") is AnswerStatus.UNKNOWN
    edited = Answer(True, {"amount": 1})
    assert await b.answer("/p", pending.id, edited, user_id="alice") is AnswerStatus.ACCEPTED
    assert await waiting == edited
    assert await a.answer("/p", pending.id, Answer(False), user_id="alice") is (
        AnswerStatus.ALREADY_ANSWERED
    )
    assert await b.pending("/p", "c", user_id="alice") == []
    assert await b.answer("/p", "no-such-id", Answer(True), user_id=None) is AnswerStatus.UNKNOWN


async def test_a_timed_out_or_discarded_approval_is_gone(
    connection: RedisConnection, other_connection: RedisConnection, redis_prefix: str
) -> None:
    a, b = RedisApprovalStore(connection), RedisApprovalStore(other_connection)
    pending = await _open(a, user=None)
    assert await a.wait(pending, 0.05) is None
    assert await b.answer("/p", pending.id, Answer(True), user_id=None) is AnswerStatus.UNKNOWN
    other = await _open(a, user=None)
    await a.discard(other)
    assert await b.answer("/p", other.id, Answer(True), user_id=None) is AnswerStatus.UNKNOWN
    assert [k for k in keys_under(redis_prefix) if "approval" in k] == []


async def test_pending_approvals_are_bounded_app_wide(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    a = RedisApprovalStore(connection, max_pending=2)
    b = RedisApprovalStore(other_connection, max_pending=2)
    first = await _open(a)
    await _open(b)
    assert (
        await a.open(
            path="/p",
            conversation_id="c",
            user_id=None,
            tool="t",
            tool_call_id="x",
            arguments={},
            timeout=60,
        )
        is None
    )
    await a.discard(first)
    assert await _open(a) is not None


async def test_an_answer_sent_while_the_listener_was_away_still_arrives(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    a, b = RedisApprovalStore(connection), RedisApprovalStore(other_connection)
    pending = await _open(a)
    assert a._listener is not None
    a._listener.cancel()  # the wake-up is lost, as during a reconnect
    with contextlib.suppress(asyncio.CancelledError):
        await a._listener
    assert await b.answer("/p", pending.id, Answer(False), user_id="alice") is (
        AnswerStatus.ACCEPTED
    )
    assert await a.wait(pending, WAIT) == Answer(False)
    late = await _open(a)
    assert await b.answer("/p", late.id, Answer(True), user_id="alice") is AnswerStatus.ACCEPTED
    assert await a.wait(late, 0) == Answer(True), "an accepted answer never becomes a timeout"


# --- locks ----------------------------------------------------------------------------------------


async def test_a_conversation_runs_on_one_replica_at_a_time(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    replicas = [RedisConversationLocks(connection), RedisConversationLocks(other_connection)]
    inside: list[int] = []
    overlaps: list[int] = []

    async def prompt(n: int) -> None:
        async with replicas[n % 2].hold("/p", "c"):
            inside.append(n)
            if len(inside) > 1:
                overlaps.append(n)
            await asyncio.sleep(0.005)
            inside.remove(n)

    await asyncio.gather(*(prompt(n) for n in range(12)))
    assert overlaps == []
    async with replicas[0].hold("/p", "c"), replicas[1].hold("/p", "other"):
        pass  # other conversations are not held up


async def test_a_dead_holders_lock_lapses_and_a_lapsed_lock_is_never_freed_by_it(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    a = RedisConversationLocks(connection, ttl=0.3, poll=0.01)
    b = RedisConversationLocks(other_connection, ttl=5)
    holder = asyncio.create_task(_hold_forever(a))
    await asyncio.sleep(0.05)
    holder.cancel()  # (a cancelled holder releases; a dead one does not:)
    with contextlib.suppress(asyncio.CancelledError):
        await holder
    key = connection.key("lock", "x")
    await connection.client.set(key, "dead-replica", px=300)
    from atmosphere_harness._backends.redis.locks import lock_key

    await connection.client.set(lock_key(connection, "/p", "c"), "dead-replica", px=300)
    async with asyncio.timeout(WAIT), b.hold("/p", "c"):
        token = await connection.client.get(lock_key(connection, "/p", "c"))
        assert token not in (None, "dead-replica")
    await b.drain()  # the release runs after the block, in a task of its own
    assert await connection.client.get(lock_key(connection, "/p", "c")) is None


async def test_the_next_prompt_on_a_replica_waits_for_its_own_release_not_a_poll(
    connection: RedisConnection,
) -> None:
    # The release runs after the block; a hold that found the lock still taken would sleep a
    # poll interval (an hour here) instead of waiting for that release.
    locks = RedisConversationLocks(connection, poll=3600)
    for _ in range(5):
        async with asyncio.timeout(WAIT), locks.hold("/p", "c"):
            pass


async def test_a_release_in_flight_is_finished_before_the_pool_closes(
    connection: RedisConnection, redis_prefix: str
) -> None:
    from atmosphere_harness._backends.redis.locks import lock_key

    own = RedisConnection(url_for(redis_prefix))
    await own.open()
    locks = RedisConversationLocks(own)
    async with locks.hold("/p", "c"):
        assert await connection.client.get(lock_key(connection, "/p", "c")) is not None
    await own.aclose()
    assert await connection.client.get(lock_key(connection, "/p", "c")) is None


async def _hold_forever(locks: RedisConversationLocks) -> None:
    async with locks.hold("/p", "c"):
        await asyncio.sleep(3600)


async def test_a_lock_is_renewed_while_its_run_lasts(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    a = RedisConversationLocks(connection, ttl=0.3, poll=0.01)
    b = RedisConversationLocks(other_connection, ttl=0.3, poll=0.01)
    order: list[str] = []
    async with a.hold("/p", "c"):
        waiting = asyncio.create_task(_record(b, order))
        await asyncio.sleep(1.0)  # three TTLs: only renewal keeps b out
        order.append("a done")
    await asyncio.wait_for(waiting, WAIT)
    assert order == ["a done", "b in"]


async def _record(locks: RedisConversationLocks, order: list[str]) -> None:
    async with locks.hold("/p", "c"):
        order.append("b in")


def test_the_lock_lives_as_long_as_a_durable_runs_lease(tmp_path: Path, redis_prefix: str) -> None:
    """A dead replica's conversation locks lapse within the lease, as its runs' leases do, so a
    replica taking its runs over is never kept waiting for the conversation longer."""
    settings = HarnessSettings(
        workspace_root=tmp_path, redis_url=url_for(redis_prefix), durable_runs_lease_seconds=2
    )
    locks = resolve_backends(settings).locks
    assert isinstance(locks, RedisConversationLocks)
    assert locks.ttl == 2


async def test_a_lapsed_lock_is_taken_back_by_its_renewal(connection: RedisConnection) -> None:
    """Redis forgot the lock (it was away longer than the TTL): the holder's renewal sets it
    again with its own token, since nobody else took it."""
    from atmosphere_harness._backends.redis.locks import lock_key

    key = lock_key(connection, "/p", "c")
    locks = RedisConversationLocks(connection, ttl=0.3, poll=0.01)
    async with asyncio.timeout(WAIT), locks.hold("/p", "c"):
        token = await connection.client.get(key)
        await connection.client.delete(key)
        while await connection.client.get(key) is None:
            await asyncio.sleep(0.01)
        assert await connection.client.get(key) == token


async def test_a_release_that_met_an_outage_frees_the_lock_once_redis_is_back(
    private_redis: PrivateRedis,
) -> None:
    """The block ends while Redis is down: its release is tried again, so the conversation is
    free as soon as Redis is back, not once the lock's TTL (an hour here) runs out."""
    from atmosphere_harness._backends.redis.locks import lock_key

    opened = RedisConnection(private_redis.url())
    await opened.open()
    locks = RedisConversationLocks(opened, ttl=3600)
    key = lock_key(opened, "/p", "c")
    try:
        async with locks.hold("/p", "c"):
            private_redis.stop()
        private_redis.start()  # (the append-only file keeps the lock key and its TTL)
        async with asyncio.timeout(WAIT):
            await asyncio.wait(list(locks._releasing.values()))
        assert await opened.client.get(key) is None
    finally:
        await opened.aclose()


class SwallowingHistory(RedisHistory):
    """A `RedisHistory` whose lock tries return as a command does when the driver swallowed a
    cancellation (Python 3.11's `asyncio.wait_for` returns the result of a write that completed
    just as the cancellation came): the task is marked cancelled, nothing is raised."""

    tries = 0

    async def lock_and_read(self, lock: str, token: bytes, ttl_ms: int, read: HistoryRead) -> bool:
        self.tries += 1
        got = await super().lock_and_read(lock, token, ttl_ms, read)
        if self.tries == 3:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)
        return got


async def test_a_cancelled_wait_for_a_lock_ends_though_the_driver_swallowed_the_cancellation(
    connection: RedisConnection,
) -> None:
    """A run stopped while it waits for another replica's lock stops waiting: it neither polls
    on until the lock frees nor runs once it is taken (a shutdown would wait for it)."""
    from atmosphere_harness._backends.redis.locks import lock_key

    await connection.client.set(lock_key(connection, "/p", "c"), "other-replica", px=60_000)
    history = SwallowingHistory(connection)
    read = HistoryRead(history, ConversationKey("/p", None, "c"), 0, 20)
    locks = RedisConversationLocks(connection, poll=0.01)
    entered = False

    async def prompt() -> None:
        nonlocal entered
        async with locks.hold("/p", "c", read):
            entered = True

    task = asyncio.create_task(prompt())
    done, _ = await asyncio.wait([task], timeout=WAIT)
    assert done, "the cancelled wait went on polling"
    assert task.cancelled()
    assert history.tries == 3
    assert not entered


class CountingHistory(RedisHistory):
    """A `RedisHistory` that counts the lock's tries that offered it a read."""

    tries = 0

    async def lock_and_read(self, lock: str, token: bytes, ttl_ms: int, read: HistoryRead) -> bool:
        self.tries += 1
        return await super().lock_and_read(lock, token, ttl_ms, read)


async def test_a_read_offered_to_the_lock_is_made_once_it_is_taken_and_sees_the_last_turn(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    """The run's first history read rides on the script that takes the lock: never made by a
    try that found the lock taken (a dead replica's, until it lapses), and made once it is
    taken, so it sees the turn the previous holder stored; the lock is renewed and released
    with the token that script set."""
    from atmosphere_harness._backends.redis.locks import lock_key

    key = ConversationKey("/p", "ann", "c")
    history_a, history_b = RedisHistory(connection), CountingHistory(other_connection)
    await history_a.append(key, [Message("user", "one")])
    await connection.client.set(lock_key(connection, "/p", "c"), "dead-replica", px=500)
    b = RedisConversationLocks(other_connection, ttl=0.3, poll=0.01)
    read = HistoryRead(history_b, key, 0, 20)
    async with asyncio.timeout(WAIT):
        waiting = asyncio.create_task(_hold_reading(b, read))
        while not history_b.tries:
            await asyncio.sleep(0.01)
        assert not read.delivered, "a try that found the lock taken read nothing"
        await history_a.append(key, [Message("assistant", "1")])  # the dead holder's last turn
        summary, items, token = await waiting
    assert summary is None
    assert [(seq, m.content) for seq, m in items] == [(1, "one"), (2, "1")]
    assert token not in (None, "dead-replica"), "held one TTL past its first: renewed"
    await b.drain()
    assert await connection.client.get(lock_key(connection, "/p", "c")) is None


async def _hold_reading(locks: RedisConversationLocks, read: HistoryRead) -> tuple[Any, Any, Any]:
    async with locks.hold(read.key.endpoint, read.key.conversation_id, read):
        delivered, (summary, items) = read.take()
        assert delivered
        await asyncio.sleep(0.6)  # two TTLs: the renewal keeps the lock ours
        token = await locks.connection.client.get(
            locks.connection.key("lock", digest(read.key.endpoint, read.key.conversation_id))
        )
    return summary, items, token


async def test_a_lock_taken_by_a_script_whose_read_then_failed_is_released(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    """`_LOCK_READ` sets the lock, then its read fails (the history's key holds a string,
    here): a script keeps the writes it made, so the lock frees it itself, long before its TTL."""
    from redis.exceptions import ResponseError

    key = ConversationKey("/p", None, "c")
    history = RedisHistory(connection)
    await connection.client.set(history._meta(key), "not a hash")
    a = RedisConversationLocks(connection, ttl=3600)
    b = RedisConversationLocks(other_connection, ttl=3600, poll=0.01)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        async with a.hold("/p", "c", HistoryRead(history, key, 0, 20)):
            pass
    async with asyncio.timeout(WAIT), b.hold("/p", "c"):
        pass


async def test_a_read_on_another_redis_is_left_to_its_reader(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    read = HistoryRead(RedisHistory(other_connection), ConversationKey("/p", None, "c"), 0, 20)
    async with asyncio.timeout(WAIT), RedisConversationLocks(connection).hold("/p", "c", read):
        assert read.take() == (False, None)


# --- connection, start-up, outage -----------------------------------------------------------------


async def test_an_unreachable_url_fails_naming_the_variable_never_the_password() -> None:
    unreachable = RedisConnection("redis://:s3cret-pw@127.0.0.1:1/0?key_prefix=x:")
    with pytest.raises(HarnessError) as caught:
        await unreachable.open()
    message = str(caught.value)
    assert "ATMOSPHERE_REDIS_URL" in message
    assert "127.0.0.1:1" in message
    assert "s3cret-pw" not in message
    assert "s3cret-pw" not in repr(caught.value.__cause__)


async def test_a_host_with_an_unreachable_redis_does_not_start(tmp_path: Path) -> None:
    from atmosphere_harness._assembly import build_host
    from atmosphere_harness._runtimes.scripted import ScriptedRuntime

    settings = HarnessSettings(
        workspace_root=tmp_path, redis_url="redis://user:s3cret-pw@127.0.0.1:1/0"
    )
    host = build_host(settings, runtime=ScriptedRuntime.demo(), specs=[])
    with pytest.raises(HarnessError, match="ATMOSPHERE_REDIS_URL") as caught:
        await host.start()
    assert "s3cret-pw" not in str(caught.value)


def test_redis_alone_holds_every_kind_of_state(redis_prefix: str, tmp_path: Path) -> None:
    settings = HarnessSettings(workspace_root=tmp_path, redis_url=url_for(redis_prefix))
    backends = resolve_backends(settings)
    assert backends.describe() == {"state": "redis", "events": "redis", "workspace": "files"}
    assert isinstance(backends.locks, RedisConversationLocks)
    assert isinstance(backends.history, RedisHistory)
    assert isinstance(backends.plan_bus, RedisPlanBus)
    assert isinstance(backends.approvals, RedisApprovalStore)
    assert [type(r).__name__ for r in backends.resources] == ["RedisConnection"]
    assert type(backends.plan_stores(tmp_path / "agents" / "a")).__name__ == "RedisPlanStore"


def test_with_redis_events_moves_only_the_fan_out(redis_prefix: str, tmp_path: Path) -> None:
    settings = HarnessSettings(workspace_root=tmp_path, redis_url=url_for(redis_prefix))
    state = StateBackends(state="sqlite", events="local", resources=[_Marker()])
    mixed = with_redis_events(state, settings)
    assert mixed.describe() == {"state": "sqlite", "events": "redis", "workspace": "files"}
    assert isinstance(mixed.plan_bus, RedisPlanBus)
    for kept in ("locks", "approvals", "history", "long_term_memory", "plan_stores"):
        assert getattr(mixed, kept) is getattr(state, kept), kept
    assert mixed.resources[0] is state.resources[0], "the state backend's pool opens first"
    assert type(mixed.resources[1]).__name__ == "RedisConnection"
    # Durable runs off: the run frame feed is fan-out, so it moves to Redis too.
    assert isinstance(mixed.runs, LiveRuns)
    assert isinstance(mixed.runs.feed, RedisRunStore)
    assert not mixed.runs.durable
    # Durable runs on: the journal is state and stays with the state backend.
    durable = HarnessSettings(
        workspace_root=tmp_path, redis_url=url_for(redis_prefix), durable_runs=True
    )
    assert with_redis_events(state, durable).runs is state.runs


class _Marker:
    async def open(self) -> None: ...

    async def aclose(self) -> None: ...


def test_a_postgres_url_without_its_backend_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if the extra were missing: `None` in sys.modules makes the import raise ImportError.
    monkeypatch.setitem(sys.modules, "atmosphere_harness._backends.postgres", None)
    settings = HarnessSettings(workspace_root=tmp_path, postgres_url="postgresql://x@h/db")
    with pytest.raises(HarnessError, match=r"\[postgres\]"):
        resolve_backends(settings)


async def test_an_outage_is_a_clear_error_and_the_stores_recover(
    private_redis: PrivateRedis,
) -> None:
    opened = RedisConnection(private_redis.url())
    await opened.open()
    history = RedisHistory(opened)
    key = ConversationKey("/e", "u", "c")
    try:
        await history.append(key, [Message.user("before")])
        private_redis.stop()
        with pytest.raises(RedisUnavailable) as caught:
            await history.append(key, [Message.user("during")])
        assert "ATMOSPHERE_REDIS_URL" in str(caught.value)
        assert "try again once it is back" in str(caught.value)
        private_redis.start()
        await _eventually(lambda: history.append(key, [Message.user("after")]))
        assert [m.content for m in await history.messages(key)] == ["before", "after"]
    finally:
        await opened.aclose()


@contextlib.asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


async def test_with_redis_events_streams_plans_between_hosts_on_another_state_backend(
    redis_prefix: str, tmp_path: Path
) -> None:
    """The state backend stays (here the embedded one, on one workspace root); only the plan
    fan-out is Redis: a plan written through one app reaches a viewer on the other."""
    import httpx2

    from atmosphere_harness import ScriptedRuntime
    from atmosphere_harness._assembly import default_primitives
    from tests.scaleout.redis_app import PATH, Scribe, turn
    from tests.support import make_app, own, serve

    settings = HarnessSettings(workspace_root=tmp_path, redis_url=url_for(redis_prefix))
    mixed = [with_redis_events(StateBackends("sqlite", "local"), settings) for _ in range(2)]
    apps = [
        make_app(
            [Scribe],
            runtime=ScriptedRuntime((), default=turn),
            workspace=tmp_path,
            router={"primitives": default_primitives(backends)},
        )
        for backends in mixed
    ]
    await own(tmp_path, PATH, "m")  # as the first prompt would: the viewer comes first here
    try:
        async with (
            serve(apps[0]) as first,
            serve(apps[1]) as second,
            httpx2.AsyncClient(base_url=first, timeout=WAIT) as a,
            httpx2.AsyncClient(base_url=second, timeout=WAIT) as b,
            b.stream("GET", f"{PATH}/plan/events", params={"conversationId": "m"}) as view,
        ):
            lines = view.aiter_lines()
            events: list[str] = []

            async def until(kind: str) -> None:
                while True:
                    line = await asyncio.wait_for(anext(lines), WAIT)
                    if line.startswith("event:"):
                        events.append(line.split(":", 1)[1].strip())
                        if events[-1] == kind:
                            return

            await until("plan-snapshot")
            reply = await a.post(PATH, json={"message": "plan gamma", "conversationId": "m"})
            assert "planned gamma" in reply.text
            await until("plan-update")
    finally:
        for backends in mixed:
            for resource in backends.resources:
                await resource.aclose()
