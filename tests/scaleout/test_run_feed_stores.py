"""The run frame feed on a real PostgreSQL and a real Redis (durable runs off).

Each test runs on both stores, two "replicas" each (two pools / connections on one database):
feed runs are never claimed or resumed, a dead replica's runs end with an `error` frame once its
lease ran out (`abandon`), a finished run's frames go after the grace period, and `LiveRuns`
in feed mode shares frames without making its own readers wait for the store. Over real
processes: `test_run_feed_replicas`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_client

from atmosphere_harness import HarnessSettings
from atmosphere_harness import _events as events
from atmosphere_harness._backends import resolve_backends
from atmosphere_harness._backends.postgres import PostgresDatabase, PostgresRunStore
from atmosphere_harness._backends.postgres import runs as postgres_runs
from atmosphere_harness._backends.redis import RedisConnection, RedisRunStore
from atmosphere_harness._backends.redis import runs as redis_runs
from atmosphere_harness._contracts import FEED_OWNER, LiveRunHandle, RunRecord, StoredRun
from atmosphere_harness._errors import LeaseLost
from atmosphere_harness._events import Frame
from atmosphere_harness._kernel import feed as journal
from atmosphere_harness._kernel import remote as remote_module
from atmosphere_harness._kernel.feed import ABANDONED, STOPPED
from atmosphere_harness._kernel.live import LiveRuns
from atmosphere_harness._kernel.remote import RemoteRun, resolved
from atmosphere_harness._kernel.writer import encode

from .postgres_service import create_database, drop_database
from .redis_service import PrivateRedis, url_for
from .test_postgres_runs import frame, stored

pytestmark = pytest.mark.services

Store = PostgresRunStore | RedisRunStore


@pytest.fixture(params=["postgres", "redis"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[list[Store]]:
    """Replica A's store and replica B's, on one PostgreSQL database or one Redis prefix."""
    if request.param == "postgres":
        url = await asyncio.to_thread(create_database)
        databases = [PostgresDatabase(url, pool_max=4) for _ in range(2)]
        # Made before the databases open, as the backend does (its `LISTEN` starts there).
        made = [PostgresRunStore(database) for database in databases]
        try:
            for database in databases:
                await database.open()
            yield made
        finally:
            for database in databases:
                await database.aclose()
            await asyncio.to_thread(drop_database, url)
    else:
        prefix = request.getfixturevalue("redis_prefix")
        connections = [RedisConnection(url_for(prefix)) for _ in range(2)]
        try:
            for connection in connections:
                await connection.open()
            yield [RedisRunStore(connection) for connection in connections]
        finally:
            for connection in connections:
                await connection.aclose()


async def test_a_feed_run_is_never_claimed_and_ends_as_abandoned_once_its_lease_ran_out(
    stores: list[Store],
) -> None:
    a, b = stores
    owner = FEED_OWNER + "a"
    await a.append(
        "feed", [frame(1), frame(2)], [], create=stored("feed"), owner=owner, lease_seconds=0.3
    )
    await a.append(
        "durable", [frame(1)], [], create=stored("durable", 2.0), owner="a", lease_seconds=0.3
    )
    assert await b.abandon(ABANDONED, 10) == 0  # alive: nothing to end
    await asyncio.sleep(0.5)
    # Both leases ran out: the durable run is taken over, the feed run never is.
    assert [run.run_id for run in await b.claim("b", 60, 10)] == ["durable"]
    assert await b.claim("c", 60, 10) == []
    # The feed run ends with a terminal frame after its last one; the durable one is left alone.
    assert await b.abandon(ABANDONED, 10) == 1
    frames, finished = await b.frames_after("feed", 0, 10)
    assert finished
    assert [(f.seq, f.event) for f in frames] == [(1, "text"), (2, "text"), (3, events.ERROR)]
    assert frames[-1].data == {"message": ABANDONED, "type": "ServerLost"}
    assert frames[-1].terminal
    assert frames[-1].session_id == "session"
    assert await b.abandon(ABANDONED, 10) == 0  # once
    # Replica A comes back from its stall: its writes are refused, nothing overwrites the end.
    with pytest.raises(LeaseLost):
        await a.append("feed", [frame(3, "late")], [], owner=owner)
    assert (await b.frames_after("feed", 2, 10))[0][0].event == events.ERROR
    _, durable_finished = await b.frames_after("durable", 0, 10)
    assert not durable_finished


async def test_a_feed_append_ending_with_a_terminal_frame_finishes_the_run(
    stores: list[Store],
) -> None:
    a, b = stores
    owner = FEED_OWNER + "a"
    done = (2, events.COMPLETE, encode({"summary": "ok"}))
    await a.append("one", [frame(1), done], [], create=stored("one"), owner=owner, lease_seconds=60)
    frames, finished = await b.frames_after("one", 0, 10)
    assert ([f.seq for f in frames], finished) == ([1, 2], True)
    await a.append("two", [frame(1)], [], create=stored("two", 2.0), owner=owner, lease_seconds=60)
    assert (await b.frames_after("two", 0, 10))[1] is False
    await a.append("two", [(2, events.ERROR, encode({"message": "no"}))], [], owner=owner)
    frames, finished = await b.frames_after("two", 0, 10)
    assert ([f.event for f in frames], finished) == (["text", events.ERROR], True)
    with pytest.raises(LeaseLost):
        await a.append("two", [frame(3)], [], owner=owner)
    # A durable owner's terminal frame finishes nothing: the journal calls `finish` itself.
    await a.append("three", [frame(1), done], [], create=stored("three", 3.0), owner="a")
    assert (await b.frames_after("three", 0, 10))[1] is False


async def test_a_redis_feed_ends_its_run_after_the_server_lost_its_scripts(
    redis_prefix: str,
) -> None:
    """The terminal write is `EVALSHA` in a pipeline (one round trip); a Redis that forgot
    its scripts (restarted, `SCRIPT FLUSH`) answers `NOSCRIPT`, and the store loads them and
    writes the same again, one call at a time: the run still ends, its frames once each."""
    connection = RedisConnection(url_for(redis_prefix))
    await connection.open()
    try:
        store = RedisRunStore(connection)
        owner = FEED_OWNER + "a"
        await store.append(
            "run", [frame(1)], [], create=stored("run"), owner=owner, lease_seconds=60
        )
        await connection.client.script_flush()
        done = (2, events.COMPLETE, encode({"summary": "ok"}))
        await store.append("run", [done], [], owner=owner)
        frames, finished = await store.frames_after("run", 0, 10)
        assert ([(f.seq, f.event) for f in frames], finished) == (
            [(1, "text"), (2, events.COMPLETE)],
            True,
        )
    finally:
        await connection.aclose()


async def test_a_heartbeat_keeps_a_feed_run_alive(stores: list[Store]) -> None:
    a, b = stores
    owner = FEED_OWNER + "a"
    await a.append("feed", [frame(1)], [], create=stored("feed"), owner=owner, lease_seconds=0.4)
    for _ in range(3):
        await asyncio.sleep(0.2)
        await a.heartbeat(owner, 0.4)
        assert await b.abandon(ABANDONED, 10) == 0
    assert (await b.frames_after("feed", 0, 10))[1] is False


async def test_a_finished_feed_run_is_followable_for_the_grace_period_then_dropped(
    stores: list[Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = stores
    owner = FEED_OWNER + "a"
    await a.append(
        "feed", [frame(1), frame(2)], [], create=stored("feed"), owner=owner, lease_seconds=60
    )
    await a.finish("feed")
    await b.expire(time.time() - 3600)
    assert [f.seq for f in (await b.frames_after("feed", 0, 10))[0]] == [1, 2]
    # Past the grace period, `expire` (each replica's upkeep) drops the frames.
    module: Any = postgres_runs if isinstance(a, PostgresRunStore) else redis_runs
    monkeypatch.setattr(module, "FOLLOW_GRACE_SECONDS", -1.0)
    await b.expire(time.time() - 3600)
    assert await b.frames_after("feed", 0, 10) == ([], True)


async def test_feed_mode_shares_frames_without_checkpoints_and_never_resumes(
    stores: list[Store],
) -> None:
    a, b = stores
    # A stale durable run and a stale feed run of dead replicas: a feed journal resumes neither.
    await a.append(
        "stale", [frame(1)], [], create=stored("stale", 0.5), owner="dead", lease_seconds=0
    )
    resumed: list[str] = []

    async def resume(handle: LiveRunHandle, run: StoredRun) -> None:
        resumed.append(run.run_id)

    runs_a = LiveRuns(feed=a, lease_seconds=0.6)
    runs_b = LiveRuns(feed=b, lease_seconds=0.6)
    runs_b.in_flight = in_flight_on(runs_a)
    await runs_a.open(resume)
    await runs_b.open(resume)
    try:
        assert not runs_a.durable
        assert runs_a.owner.startswith(FEED_OWNER)
        go_on = asyncio.Event()

        async def work(handle: LiveRunHandle) -> None:
            # (A feed's run has no checkpoints to give: only a durable run journals them.)
            await handle.publish(Frame("text", {"text": "one"}, "s", "live", 1))
            await go_on.wait()
            await handle.publish(Frame(events.COMPLETE, {"summary": "ok"}, "s", "live", 2))

        live = runs_a.start(
            work, path="/p", conversation_id="live", user_id=None, message="secret prompt"
        )
        local = live.follow()
        # A local reader is not held back by the store.
        assert (await anext(local)).data == {"text": "one"}
        remote = await until(lambda: runs_b.find("/p", "live"), RemoteRun)
        assert not remote.durable
        followed = remote.follow()
        assert (await anext(followed)).data == {"text": "one"}
        go_on.set()
        assert (await anext(local)).event == events.COMPLETE
        assert (await anext(followed)).event == events.COMPLETE
        await anext(followed, None)
        # Its terminal frame's write finished it in the store (no `finish` call of its own).
        assert (await b.frames_after(live_run_id(live), 0, 10))[1] is True
        checkpoints, frames = await b.load(live_run_id(live), 10)
        assert checkpoints == {}
        assert [f.seq for f in frames] == [1, 2]
        found = await b.latest("/p", "live", session_id=live.session_id)
        assert found is not None
        assert found[0].message == ""  # never run again: not kept
        # Upkeep (every third of a lease) never claims: the stale durable run stays unresumed.
        await asyncio.sleep(0.5)
        assert resumed == []
    finally:
        await runs_a.aclose()
        await runs_b.aclose()


async def test_a_feed_run_stopped_before_its_end_tells_remote_readers(
    stores: list[Store],
) -> None:
    a, b = stores
    runs_a = LiveRuns(feed=a, lease_seconds=60)

    async def work(handle: LiveRunHandle) -> None:
        await handle.publish(Frame("text", {"text": "one"}, "s", "conv", 1))
        await asyncio.Event().wait()

    await runs_a.open(_no_resume)
    try:
        live = runs_a.start(work, path="/p", conversation_id="conv", user_id=None)
        local = live.follow()
        await anext(local)
        await local.aclose()  # its only client left: the run is stopped
        runs_b = LiveRuns(feed=b, lease_seconds=60)
        # Asked for after its end (a client naming its session): shared with a last frame.
        remote = await until(
            lambda: runs_b.find("/p", "conv", session_id=live.session_id), RemoteRun
        )
        seen = [f async for f in remote.follow()]
        assert [(f.seq, f.event) for f in seen] == [(1, "text"), (2, events.ERROR)]
        assert seen[-1].data == {"message": STOPPED, "type": "RunStopped"}
    finally:
        await runs_a.aclose()


@pytest.mark.parametrize("owner", [FEED_OWNER + "a", "a"], ids=["feed", "durable"])
async def test_a_write_wakes_the_followers_on_other_replicas_without_their_poll(
    stores: list[Store], monkeypatch: pytest.MonkeyPatch, owner: str
) -> None:
    """Each write of frames sends a notice (`RunFeed.watch`): a reader on replica B gets a
    frame A stores while it waits, long before its next poll (here 30 s, the guard 10 s)."""
    monkeypatch.setattr(remote_module, "POLL_SECONDS", 30.0)
    a, b = stores
    await a.append("run", [frame(1)], [], create=stored("run"), owner=owner, lease_seconds=60)
    follower = RemoteRun(b, stored("run"), resolved, b, durable=not owner.startswith(FEED_OWNER))
    followed = follower.follow()
    assert (await anext(followed)).seq == 1
    second = asyncio.ensure_future(anext(followed))
    await asyncio.sleep(0.3)  # the reader read again, found nothing and now waits
    assert not second.done()
    await a.append("run", [frame(2, "two")], [], owner=owner)
    async with asyncio.timeout(10):
        got = await second
    assert (got.seq, got.data) == (2, {"text": "two"})
    await followed.aclose()
    # A reader that left is no longer woken (nothing is kept for it).
    assert len(b._watchers) == 0


class _Counted:
    """A run store that records each `append` (its frames' events, whether it created the run)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.appends: list[tuple[bool, list[str]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def append(self, run_id: str, frames: Any, checkpoints: Any, **kwargs: Any) -> None:
        self.appends.append((kwargs.get("create") is not None, [f[1] for f in frames]))
        await self.store.append(run_id, frames, checkpoints, **kwargs)


async def test_a_run_nobody_asks_for_writes_nothing_and_one_asked_for_after_its_end_one_write(
    stores: list[Store],
) -> None:
    """A run no other replica follows costs the store nothing; asked for after its end (while
    its replica keeps it), the run, all its frames and its end go in one write."""
    a, b = stores
    counted = _Counted(a)
    runs_a = LiveRuns(feed=counted, lease_seconds=60)  # type: ignore[arg-type]
    runs_b = LiveRuns(feed=b, lease_seconds=60)

    async def work(handle: LiveRunHandle) -> None:
        await handle.publish(Frame("text", {"text": "one"}, "s", "quick", 1))
        await asyncio.sleep(0.05)
        await handle.publish(Frame(events.COMPLETE, {"summary": "ok"}, "s", "quick", 2))

    await runs_a.open(_no_resume)
    try:
        live = runs_a.start(work, path="/p", conversation_id="quick", user_id=None)
        assert [f.event async for f in live.follow()] == ["text", events.COMPLETE]
        await asyncio.sleep(0.2)
        assert counted.appends == []
        assert await b.latest("/p", "quick") is None
        assert await runs_b.find("/p", "quick") is None  # (no run in flight: nothing asked)
        remote = await until(
            lambda: runs_b.find("/p", "quick", session_id=live.session_id), RemoteRun
        )
        assert [f.event async for f in remote.follow()] == ["text", events.COMPLETE]
        assert counted.appends == [(True, ["text", events.COMPLETE])]
        assert (await b.frames_after(live_run_id(live), 0, 10))[1] is True  # finished
    finally:
        await runs_a.aclose()


class _FirstAskLost:
    """A store whose first `ask` goes nowhere (as a pub/sub message sent while the listener
    reconnects)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.asks = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def ask(self, path: str, conversation_id: str, session_id: str | None) -> None:
        self.asks += 1
        if self.asks > 1:
            await self.store.ask(path, conversation_id, session_id)


async def test_an_ask_that_was_lost_is_sent_again_before_the_asker_gives_up(
    stores: list[Store],
) -> None:
    a, b = stores
    runs_a = LiveRuns(feed=a, lease_seconds=60)
    lossy = _FirstAskLost(b)
    runs_b = LiveRuns(feed=lossy, lease_seconds=60)  # type: ignore[arg-type]
    runs_b.in_flight = in_flight_on(runs_a)
    go_on = asyncio.Event()

    async def work(handle: LiveRunHandle) -> None:
        await handle.publish(Frame("text", {"text": "one"}, "s", "lost", 1))
        await go_on.wait()
        await handle.publish(Frame(events.COMPLETE, {"summary": "ok"}, "s", "lost", 2))

    await runs_a.open(_no_resume)
    try:
        runs_a.start(work, path="/p", conversation_id="lost", user_id=None)
        await asyncio.sleep(0.05)
        remote = await runs_b.find("/p", "lost")  # one call: the second ask gets it
        assert isinstance(remote, RemoteRun)
        assert lossy.asks == 2
        go_on.set()
        assert [f.event async for f in remote.follow()] == ["text", events.COMPLETE]
    finally:
        await runs_a.aclose()


def test_a_failing_ask_listener_never_raises_and_a_malformed_ask_is_ignored() -> None:
    heard: list[tuple[str, str, str | None]] = []

    def failing(path: str, conversation_id: str, session_id: str | None) -> None:
        heard.append((path, conversation_id, session_id))
        raise RuntimeError("boom")

    for payload in ("not json", "[1, 2, 3]", '["/p"]', "null"):
        remote_module.deliver_ask(payload, failing)
    assert heard == []
    remote_module.deliver_ask(remote_module.ask_payload("/p", "c", None), failing)  # no raise
    assert heard == [("/p", "c", None)]


async def test_a_run_asked_for_mid_run_is_written_at_once_then_in_groups(
    stores: list[Store],
) -> None:
    """A replica whose registry says another runs the conversation asks for it: its replica
    writes what it has at once, then the rest as it comes."""
    a, b = stores
    counted = _Counted(a)
    runs_a = LiveRuns(feed=counted, lease_seconds=60)  # type: ignore[arg-type]
    runs_b = LiveRuns(feed=b, lease_seconds=60)
    runs_b.in_flight = in_flight_on(runs_a)
    go_on = asyncio.Event()

    async def work(handle: LiveRunHandle) -> None:
        await handle.publish(Frame("text", {"text": "one"}, "s", "long", 1))
        await go_on.wait()
        await handle.publish(Frame("text", {"text": "two"}, "s", "long", 2))
        await handle.publish(Frame(events.COMPLETE, {"summary": "ok"}, "s", "long", 3))

    await runs_a.open(_no_resume)
    try:
        runs_a.start(work, path="/p", conversation_id="long", user_id=None)
        remote = await until(lambda: runs_b.find("/p", "long"), RemoteRun)
        assert counted.appends == [(True, ["text"])]
        go_on.set()
        assert [f.event async for f in remote.follow()] == ["text", "text", events.COMPLETE]
        assert counted.appends == [(True, ["text"]), (False, ["text", events.COMPLETE])]
    finally:
        await runs_a.aclose()


def test_only_a_scale_out_backend_gets_a_feed(tmp_path: Any) -> None:
    embedded = resolve_backends(HarnessSettings(workspace_root=tmp_path, durable_runs=False))
    assert isinstance(embedded.runs, LiveRuns)
    assert embedded.runs.store is None
    assert embedded.runs.feed is None
    for postgres, redis in (("postgresql://u@127.0.0.1:1/x", None), (None, url_for("p:"))):

        def settings(
            durable: bool, postgres: str | None = postgres, redis: str | None = redis
        ) -> HarnessSettings:
            return HarnessSettings(
                workspace_root=tmp_path,
                durable_runs=durable,
                postgres_url=postgres,
                redis_url=redis,
            )

        off = resolve_backends(settings(False))
        on = resolve_backends(settings(True))
        assert isinstance(off.runs, LiveRuns)
        assert isinstance(on.runs, LiveRuns)
        assert (off.runs.store, off.runs.durable) == (None, False)
        assert off.runs.feed is not None
        assert (on.runs.feed, on.runs.durable) == (None, True)
    # Both URLs: PostgreSQL keeps the durable journal (state), Redis carries the feed (fan-out).
    both = {"postgres": "postgresql://u@127.0.0.1:1/x", "redis": url_for("p:")}
    off = resolve_backends(settings(False, **both))
    on = resolve_backends(settings(True, **both))
    assert isinstance(off.runs, LiveRuns)
    assert isinstance(on.runs, LiveRuns)
    assert isinstance(off.runs.feed, RedisRunStore)
    assert isinstance(on.runs.store, PostgresRunStore)


async def _no_resume(handle: LiveRunHandle, run: StoredRun) -> None:
    raise AssertionError("a feed journal resumes nothing")


async def until(find: Any, kind: type[RemoteRun]) -> RemoteRun:
    """What `find()` returns once it is a `kind` (the feed's first write is in the background)."""
    async with asyncio.timeout(30):
        while True:
            found = await find()
            if isinstance(found, kind):
                return found
            await asyncio.sleep(0.02)


def in_flight_on(runs: LiveRuns) -> Any:
    """A registry's answer for `LiveRuns.in_flight`: `runs`' replica runs every conversation."""

    async def in_flight(path: str, conversation_id: str) -> list[RunRecord]:
        return [RunRecord("run", path, conversation_id, None, "running", owner=runs.owner)]

    return in_flight


def live_run_id(live: Any) -> str:
    return str(live._feed.run_id)


class _Batched(_Counted):
    """`_Counted` that also records each batch of several runs' frames (`append_feeds`)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.batches: list[dict[str, list[int]]] = []

    async def append_feeds(self, owner: str, runs: Any) -> dict[str, str]:
        self.batches.append({run_id: [f[0] for f in frames] for run_id, frames in runs})
        return await self.store.append_feeds(owner, runs)


async def test_a_batch_writes_each_run_it_may_and_names_the_ones_it_may_not(
    stores: list[Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several runs' frames in one write: each run still the owner's and unfinished gets its
    frames (and its followers a notice); a finished run, another owner's and an unknown one are
    named with why, and nothing of theirs is written."""
    monkeypatch.setattr(remote_module, "POLL_SECONDS", 30.0)
    a, b = stores
    owner = FEED_OWNER + "a"
    for n, run in enumerate(("one", "two", "done")):
        await a.append(run, [frame(1)], [], create=stored(run, n), owner=owner, lease_seconds=60)
    await a.append("done", [(2, events.COMPLETE, encode({}))], [], owner=owner)
    await a.append(
        "theirs",
        [frame(1)],
        [],
        create=stored("theirs", 5),
        owner=FEED_OWNER + "b",
        lease_seconds=60,
    )
    follower = RemoteRun(b, stored("two"), resolved, b, durable=False)
    followed = follower.follow()
    assert (await anext(followed)).seq == 1
    woken = asyncio.ensure_future(anext(followed))
    await asyncio.sleep(0.3)  # it found nothing more and waits
    refused = await a.append_feeds(
        owner,
        [
            ("one", [frame(2), frame(3, "three")]),
            ("two", [frame(2, "two")]),
            ("done", [frame(3)]),
            ("theirs", [frame(2)]),
            ("nobody", [frame(1)]),
        ],
    )
    assert refused == {"done": "ended", "theirs": "ended", "nobody": "missing"}
    async with asyncio.timeout(10):  # the notice, not the 30 s poll
        got = await woken
    assert (got.seq, got.data) == (2, {"text": "two"})
    await followed.aclose()
    one, finished = await b.frames_after("one", 0, 10)
    assert ([(f.seq, f.data["text"]) for f in one], finished) == (
        [(1, "x"), (2, "x"), (3, "three")],
        False,
    )
    assert [f.seq for f in (await b.frames_after("done", 0, 10))[0]] == [1, 2]
    assert [f.seq for f in (await b.frames_after("theirs", 0, 10))[0]] == [1]


async def test_the_runs_of_a_replica_share_their_frames_in_common_writes(
    stores: list[Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between its first write and its end, a run's frames go in the replica's batch: the
    frames of every run that published meanwhile in one write, each run's in order, and each
    run's end in its own write after them."""
    a, b = stores
    counted = _Batched(a)
    runs_a = LiveRuns(feed=counted, lease_seconds=60)  # type: ignore[arg-type]
    go_on = asyncio.Event()
    names = [f"conv-{n}" for n in range(5)]

    async def work(handle: LiveRunHandle) -> None:
        conversation = handle.conversation_id
        await handle.publish(Frame("text", {"text": "0"}, "s", conversation, 1))
        await go_on.wait()
        for seq in range(2, 6):
            await handle.publish(Frame("text", {"text": str(seq)}, "s", conversation, seq))
            await asyncio.sleep(0)
        await handle.publish(Frame(events.COMPLETE, {"summary": "ok"}, "s", conversation, 6))

    await runs_a.open(_no_resume)
    try:
        lives = [
            runs_a.start(work, path="/p", conversation_id=name, user_id=None) for name in names
        ]
        await asyncio.sleep(0.05)  # (each run published its first frame)
        for name in names:
            runs_a.share("/p", name)
        async with asyncio.timeout(10):  # every run's first write done
            for live in lives:
                while not (await b.frames_after(live_run_id(live), 0, 10))[0]:
                    await asyncio.sleep(0.01)
        go_on.set()
        for live in lives:
            assert [f.seq async for f in live.follow()] == [1, 2, 3, 4, 5, 6]
        await runs_a.aclose()
        for live in lives:
            frames, finished = await b.frames_after(live_run_id(live), 0, 10)
            assert ([f.seq for f in frames], finished) == ([1, 2, 3, 4, 5, 6], True)
        assert counted.batches, "no frames went in a batch"
        assert len(counted.batches[0]) == len(names)  # every run's next frame, in one write
        written = sum(len(seqs) for batch in counted.batches for seqs in batch.values())
        assert len(counted.batches) < written
        for batch in counted.batches:
            for seqs in batch.values():
                assert seqs == sorted(seqs)
        # Each run: its first write, then its end (with what the batch had not taken yet).
        assert [created for created, _ in counted.appends].count(True) == len(names)
        assert all(
            events_[-1] == events.COMPLETE for created, events_ in counted.appends if not created
        )
    finally:
        await runs_a.aclose()


async def test_a_run_whose_batched_write_is_refused_stops_sharing_and_goes_on(
    stores: list[Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that stalled past its lease finds its run ended by another's upkeep: the
    batch's write is refused for that run, which stops sharing frames (nothing more lands after
    the `error` frame that ended it) while its local reader still gets every frame."""
    a, b = stores
    runs_a = LiveRuns(feed=a, lease_seconds=0.3)  # never opened: no heartbeat keeps its lease
    go_on = asyncio.Event()

    async def work(handle: LiveRunHandle) -> None:
        await handle.publish(Frame("text", {"text": "one"}, "s", "conv", 1))
        await go_on.wait()
        await handle.publish(Frame("text", {"text": "two"}, "s", "conv", 2))
        await asyncio.Event().wait()  # (until its reader leaves)

    live = runs_a.start(work, path="/p", conversation_id="conv", user_id=None)
    local = live.follow()
    try:
        assert (await anext(local)).seq == 1
        runs_a.share("/p", "conv")
        async with asyncio.timeout(10):
            while not (await b.frames_after(live_run_id(live), 0, 10))[0]:
                await asyncio.sleep(0.01)
            while await b.abandon(ABANDONED, 10) == 0:
                await asyncio.sleep(0.05)
        go_on.set()
        assert (await anext(local)).seq == 2
        writer = live._feed
        assert isinstance(writer, journal.FeedWriter)
        async with asyncio.timeout(10):
            while not writer.lost:
                await asyncio.sleep(0.01)
        frames, finished = await b.frames_after(live_run_id(live), 0, 10)
        assert ([(f.seq, f.event) for f in frames], finished) == ([(1, "text"), (2, "error")], True)
    finally:
        await local.aclose()
        await runs_a.aclose()


_OURS = ("info", "hello", "client|setinfo")
"""The commands `_used` itself sends (a connection of its own)."""


def _commands(server: PrivateRedis) -> dict[str, int]:
    """Calls so far by command on a private Redis (`INFO commandstats`)."""
    client = redis_client.Redis(host="127.0.0.1", port=server.port)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


async def _used(server: PrivateRedis, write: Any) -> dict[str, int]:
    """The commands Redis ran for `await write()`, by name."""
    before = _commands(server)
    await write()
    after = _commands(server)
    used = {name: count - before.get(name, 0) for name, count in after.items()}
    return {name: count for name, count in used.items() if count and name not in _OURS}


async def test_a_redis_batch_costs_one_zadd_and_one_publish_a_run_whatever_its_frames(
    tmp_path: Path,
) -> None:
    """On Redis, a batch of the frame feed costs each run one `HMGET` (owner, finished), one
    `ZADD` of all its frames and one `PUBLISH`, whatever the number of its frames: no `EXPIRE`
    (the keys keep the TTL of the run's first write, which `heartbeat` moves), no per-frame
    replace. A run first written without frames gets its frames' TTL in its first batch, and
    a burst of frames beyond what one `ZADD` takes still lands whole, in order."""
    server = PrivateRedis(tmp_path).start()
    connection = RedisConnection(server.url("feed:"))
    try:
        await connection.open()
        store = RedisRunStore(connection)
        owner = FEED_OWNER + "a"
        runs = [f"run-{n}" for n in range(4)]
        for n, run in enumerate(runs):
            first = [frame(1)] if n else []  # run-0: its first write holds no frame
            await store.append(run, first, [], create=stored(run, n), owner=owner, lease_seconds=60)
        # (the script loaded first: Redis runs it by its digest from then on)
        await store.append(
            "warm", [frame(1)], [], create=stored("warm"), owner=owner, lease_seconds=60
        )
        assert await store.append_feeds(owner, [("warm", [frame(2)])]) == {}
        batch = [(run, [frame(seq) for seq in range(2, 7)]) for run in runs]
        used = await _used(server, lambda: store.append_feeds(owner, batch))
        # run-0's frames key did not exist: its TTL is set once (EXPIRE), and the mark cleared.
        assert used == {"evalsha": 1, "hmget": 4, "zadd": 4, "publish": 4, "expire": 1, "hdel": 1}
        batch = [(run, [frame(7)]) for run in runs]
        used = await _used(server, lambda: store.append_feeds(owner, batch))
        assert used == {"evalsha": 1, "hmget": 4, "zadd": 4, "publish": 4}
        client = connection.client
        for run in runs:
            assert 0 < await client.ttl(f"feed:run:{run}:frames") <= redis_runs.SAFETY_TTL
            frames, finished = await store.frames_after(run, 0, 100)
            expected = list(range(1 if run != "run-0" else 2, 8))
            assert ([f.seq for f in frames], finished) == (expected, False)
        burst = [frame(seq, f"t{seq}") for seq in range(8, 8 + 1203)]
        assert await store.append_feeds(owner, [("run-1", burst)]) == {}
        frames, _ = await store.frames_after("run-1", 7, 2000)
        assert [(f.seq, f.data["text"]) for f in frames] == [
            (seq, f"t{seq}") for seq in range(8, 8 + 1203)
        ]
    finally:
        await connection.aclose()
        server.stop()
