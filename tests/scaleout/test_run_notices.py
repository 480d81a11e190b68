"""A run's frame notices go to the replicas that follow it, and only to them.

Over a real PostgreSQL (`NOTIFY` on the run's channel, `LISTEN`ed while a reader here follows
the run) and a real Redis (`PUBLISH` on the run's channel, subscribed likewise), three
"replicas" each (three pools / connections): a follower gets every frame in order, from the
notices alone (the safety-net poll is set far beyond the tests' guards), including when it
starts following mid-run, when a write lands between its first read and its subscription, and
when the connections drop; a replica with no reader of a run receives none of its notices.
Over real processes: `test_run_feed_replicas`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from atmosphere_harness._backends.postgres import PostgresDatabase, PostgresRunStore
from atmosphere_harness._backends.redis import RedisConnection, RedisRunStore
from atmosphere_harness._contracts import FEED_OWNER
from atmosphere_harness._events import Frame
from atmosphere_harness._kernel import remote as remote_module
from atmosphere_harness._kernel.remote import RemoteRun, RunWatchers, resolved
from atmosphere_harness._kernel.writer import encode

from .postgres_service import create_database, drop_database, terminate_backends
from .redis_service import PrivateRedis
from .test_postgres_runs import frame, stored

pytestmark = pytest.mark.services

Store = PostgresRunStore | RedisRunStore
OWNER = FEED_OWNER + "a"
GUARD = 20.0
"""Seconds a test waits for what must come (far less than the poll it must not need)."""


@pytest.fixture(autouse=True)
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader polls after 10 minutes only: what it gets within a guard came by a notice."""
    monkeypatch.setattr(remote_module, "POLL_SECONDS", 600.0)


class Replicas:
    """Three replicas' stores on one backend, and a way to cut every connection to it."""

    def __init__(self, stores: list[Store], cut: Callable[[], Awaitable[None]]) -> None:
        self.stores = stores
        self.cut = cut


@pytest.fixture
def heard(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[str]]:
    """Every notice each replica's watchers received, by `id()` of the watchers."""
    notices: dict[int, list[str]] = {}
    notified = RunWatchers.notified

    def counted(self: RunWatchers, text: str) -> None:
        notices.setdefault(id(self), []).append(text)
        notified(self, text)

    monkeypatch.setattr(RunWatchers, "notified", counted)
    return notices


@pytest.fixture(params=["postgres", "redis"])
async def replicas(
    request: pytest.FixtureRequest, tmp_path: Path, heard: dict[int, list[str]]
) -> AsyncIterator[Replicas]:
    """PostgreSQL: a fresh database (cut: `pg_terminate_backend` of its connections). Redis: a
    private server of the test's own (cut: `CLIENT KILL` of every client but the killer's).
    Made once `heard` counts notices (a store may take its callback when it is made)."""
    if request.param == "postgres":
        url = await asyncio.to_thread(create_database)
        databases = [PostgresDatabase(url, pool_max=4) for _ in range(3)]
        made = [PostgresRunStore(database) for database in databases]

        async def cut_postgres() -> None:
            await terminate_backends(url)

        try:
            for database in databases:
                await database.open()
            yield Replicas(list(made), cut_postgres)
        finally:
            for database in databases:
                await database.aclose()
            await asyncio.to_thread(drop_database, url)
    else:
        server = PrivateRedis(tmp_path).start()
        connections = [RedisConnection(server.url("notices:")) for _ in range(3)]

        async def cut_redis() -> None:
            killer = aioredis.Redis(host="127.0.0.1", port=server.port)
            try:
                await killer.client_kill_filter(_type="pubsub")
                await killer.client_kill_filter(_type="normal", skipme=True)
            finally:
                await killer.aclose()

        try:
            for connection in connections:
                await connection.open()
            yield Replicas([RedisRunStore(connection) for connection in connections], cut_redis)
        finally:
            for connection in connections:
                await connection.aclose()
            server.stop()


def follower(store: Store, run_id: str) -> RemoteRun:
    return RemoteRun(store, stored(run_id), resolved, store, durable=False)


def done(seq: int) -> tuple[int, str, str]:
    return seq, "complete", encode({"summary": "ok"})


async def write(store: Store, run_id: str, frames: list[tuple[int, str, str]]) -> None:
    """One feed write, tried again while the backend's connections come back (a cut)."""
    for attempt in range(50):
        try:
            await store.append(run_id, frames, [], owner=OWNER, lease_seconds=60)
            return
        except Exception:
            if attempt == 49:
                raise
            await asyncio.sleep(0.1)


async def start(store: Store, run_id: str, frames: list[tuple[int, str, str]]) -> None:
    await store.append(run_id, frames, [], create=stored(run_id), owner=OWNER, lease_seconds=60)


async def take(followed: AsyncIterator[Frame], count: int) -> list[int]:
    """The seqs of the next `count` frames (hang guard: `GUARD`)."""
    seqs = []
    async with asyncio.timeout(GUARD):
        for _ in range(count):
            seqs.append((await anext(followed)).seq)
    return seqs


async def until_heard(heard: dict[int, list[str]], watchers: RunWatchers, notice: str) -> None:
    async with asyncio.timeout(GUARD):
        while notice not in heard.get(id(watchers), []):
            await asyncio.sleep(0.01)


async def settled(watchers: RunWatchers, runs: set[str]) -> None:
    """Until the notices of exactly `runs` are heard (their subscriptions confirmed)."""
    async with asyncio.timeout(GUARD):
        while watchers.listening != runs:
            await asyncio.sleep(0.01)


async def hearing(
    a: Store, run_id: str, seq: int, heard: list[str], followed: AsyncIterator[Frame]
) -> int:
    """Write frames of `run_id` from `seq` on until the follower's replica hears one's notice
    (its subscription is in place); the next seq."""
    async with asyncio.timeout(GUARD):
        while True:
            await write(a, run_id, [frame(seq)])
            assert await take(followed, 1) == [seq]
            for _ in range(20):
                if f"{seq} {run_id}" in heard:
                    return seq + 1
                await asyncio.sleep(0.01)
            seq += 1


async def test_a_replica_hears_only_the_runs_it_follows(
    replicas: Replicas, heard: dict[int, list[str]]
) -> None:
    a, b, c = replicas.stores
    on_b = heard.setdefault(id(b._watchers), [])
    for run_id in ("x", "y", "z"):
        await start(a, run_id, [frame(1)])
    followed = follower(b, "x").follow()
    assert await take(followed, 1) == [1]
    seq = await hearing(a, "x", 2, on_b, followed)
    await write(a, "y", [frame(2)])
    await write(a, "x", [frame(seq)])
    assert await take(followed, 1) == [seq]
    await until_heard(heard, b._watchers, f"{seq} x")
    # B heard x's notice and not y's, sent before it.
    assert "2 y" not in on_b
    await followed.aclose()

    # B's reader left: B stops hearing x once it follows another run (changes apply in order).
    followed = follower(b, "z").follow()
    assert await take(followed, 1) == [1]
    at = await hearing(a, "z", 2, on_b, followed)
    await write(a, "x", [frame(seq + 1)])
    await write(a, "z", [frame(at)])
    assert await take(followed, 1) == [at]
    await until_heard(heard, b._watchers, f"{at} z")
    assert f"{seq + 1} x" not in on_b
    await followed.aclose()
    assert heard.get(id(c._watchers), []) == []  # never followed anything: never heard a notice
    assert len(b._watchers) == 0


async def test_a_follower_that_starts_mid_run_gets_every_frame_in_order(
    replicas: Replicas,
) -> None:
    a, b, _ = replicas.stores
    await start(a, "run", [frame(1), frame(2), frame(3)])
    subscribe = b._watchers._subscribe
    assert subscribe is not None

    async def late(runs: list[str]) -> None:
        # A write between the reader's first read and its subscription: no notice of it
        # reaches B, which must read it anyway once subscribed.
        await write(a, "run", [frame(4)])
        await subscribe(runs)

    b._watchers._subscribe = late
    followed = follower(b, "run").follow()
    assert await take(followed, 4) == [1, 2, 3, 4]
    b._watchers._subscribe = subscribe
    for seq in range(5, 25):
        await write(a, "run", [frame(seq)])
    await write(a, "run", [done(25)])
    assert await take(followed, 21) == list(range(5, 26))
    async with asyncio.timeout(GUARD):
        assert await anext(followed, None) is None


async def test_a_follower_gets_every_frame_when_the_connections_drop(
    replicas: Replicas,
) -> None:
    """The writer's and the follower's connections cut mid-run: the writer's next write goes
    on a new connection, the follower's listener comes back subscribed and reads again."""
    a, b, _ = replicas.stores
    await start(a, "run", [frame(1)])
    followed = follower(b, "run").follow()
    assert await take(followed, 1) == [1]
    await settled(b._watchers, {"run"})
    for seq in (2, 3):
        await replicas.cut()
        await write(a, "run", [frame(seq)])
        assert await take(followed, 1) == [seq]
    await settled(b._watchers, {"run"})
    await write(a, "run", [frame(4)])  # heard on the new subscription
    assert await take(followed, 1) == [4]
    await write(a, "run", [done(5)])
    assert await take(followed, 1) == [5]
    with contextlib.suppress(StopAsyncIteration):
        await anext(followed)


async def test_a_subscription_follows_its_readers(replicas: Replicas) -> None:
    """The first reader of a run subscribes, the last one leaving unsubscribes; a reader that
    comes back subscribes again; two readers of one run share a subscription."""
    a, b, _ = replicas.stores
    await start(a, "run", [frame(1)])
    first = follower(b, "run").follow()
    second = follower(b, "run").follow()
    assert await take(first, 1) == [1]
    assert await take(second, 1) == [1]
    await settled(b._watchers, {"run"})
    await first.aclose()
    await write(a, "run", [frame(2)])
    assert await take(second, 1) == [2]
    await second.aclose()
    await settled(b._watchers, set())
    again = follower(b, "run").follow()
    assert await take(again, 2) == [1, 2]
    await settled(b._watchers, {"run"})
    await write(a, "run", [done(3)])
    assert await take(again, 1) == [3]
    await again.aclose()
    await settled(b._watchers, set())


def test_a_run_channel_is_a_valid_postgres_name() -> None:
    from atmosphere_harness._backends.postgres.runs import channel

    for run_id in ("r", "x" * 500, "a run id with spaces, 'quotes' and ü"):
        name = channel(run_id)
        assert len(name.encode()) <= 63
        assert name == channel(run_id)
    assert channel("a") != channel("b")
