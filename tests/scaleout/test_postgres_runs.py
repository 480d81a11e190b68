"""`PostgresRunStore` on a real database: the `RunStore` contract, and two replicas claiming.

A "replica" here is a second `PostgresDatabase` on the same URL (its own pool), as a second
process would have. The kill-and-take-over behaviour over real processes is in
`test_postgres_durable_replicas`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from atmosphere_harness import HarnessSettings
from atmosphere_harness._backends import resolve_backends
from atmosphere_harness._backends.postgres import PostgresDatabase, PostgresRunStore
from atmosphere_harness._backends.postgres.runs import channel
from atmosphere_harness._contracts import FEED_OWNER, LiveRunHandle, StoredRun
from atmosphere_harness._durable import writer as durable_writer
from atmosphere_harness._durable.journal import DurableRuns
from atmosphere_harness._errors import LeaseLost
from atmosphere_harness._events import Frame
from atmosphere_harness._kernel import live as live_runs
from atmosphere_harness._kernel import remote
from atmosphere_harness._kernel.live import LiveRuns
from atmosphere_harness._kernel.writer import encode

from .postgres_service import create_database, drop_database

pytestmark = pytest.mark.services


def stored(run_id: str = "run-1", started_at: float = 1.0) -> StoredRun:
    return StoredRun(run_id, "/p", "conv", "ann", "session", "hello", started_at)


def frame(seq: int, text: str = "x") -> tuple[int, str, str]:
    return seq, "text", encode({"text": text})


def checkpoint(key: str, value: Any) -> tuple[str, str]:
    return key, encode(value)


@pytest.fixture
async def url() -> AsyncIterator[str]:
    url = await asyncio.to_thread(create_database)
    try:
        yield url
    finally:
        await asyncio.to_thread(drop_database, url)


@pytest.fixture
async def databases(url: str) -> AsyncIterator[list[PostgresDatabase]]:
    """Two opened databases on one URL: replica A's and replica B's."""
    opened: list[PostgresDatabase] = []
    try:
        for _ in range(2):
            database = PostgresDatabase(url, pool_max=4)
            await database.open()
            opened.append(database)
        yield opened
    finally:
        for database in opened:
            await database.aclose()


@pytest.fixture
def stores(databases: list[PostgresDatabase]) -> list[PostgresRunStore]:
    return [PostgresRunStore(database) for database in databases]


async def test_what_is_appended_is_loaded_back_on_another_replica(
    stores: list[PostgresRunStore],
) -> None:
    a, b = stores
    big = "line of model text\n" * 500
    odd = "lone \ud800 surrogate and é"  # not UTF-8 encodable: stored as ASCII escapes
    await a.append(
        "run-1",
        [frame(1), frame(2, big)],
        [checkpoint("model:1", {"text": odd}), checkpoint("tool:1:a", big)],
        create=stored(),
        owner="a/1/x",
        lease_seconds=60,
    )
    await a.append(
        "run-1",
        [frame(3)],
        [checkpoint("model:1", {"text": "first"}), checkpoint("model:1", {"text": "replaced"})],
        owner="a/1/x",
    )
    checkpoints, frames = await b.load("run-1", 2)
    assert checkpoints == {"model:1": {"text": "replaced"}, "tool:1:a": big}
    assert [(f.seq, f.data["text"]) for f in frames] == [(2, big), (3, "x")]
    assert (frames[0].session_id, frames[0].conversation_id) == ("session", "conv")
    _, every = await b.load("run-1", 10)
    assert [f.seq for f in every] == [1, 2, 3]
    await a.append("run-1", [], [checkpoint("odd", odd)])
    assert (await b.load("run-1", 0))[0]["odd"] == odd
    assert await b.load("missing", 10) == ({}, [])
    with pytest.raises(LookupError):
        await a.append("missing", [frame(1)], [])


async def test_a_live_lease_is_not_taken_an_expired_or_released_one_is(
    stores: list[PostgresRunStore],
) -> None:
    a, b = stores
    await a.append("live", [], [], create=stored("live", 1.0), owner="a", lease_seconds=60)
    await a.append("short", [], [], create=stored("short", 2.0), owner="a", lease_seconds=0.2)
    await a.append("gone", [], [], create=stored("gone", 3.0), owner="a", lease_seconds=60)
    await a.finish("gone")
    await asyncio.sleep(0.3)  # the short lease runs out (database clock)
    assert [run.run_id for run in await b.claim("b", 60, 10)] == ["short"]
    assert await b.claim("b", 60, 10) == []  # its own, now
    assert await a.claim("a", 60, 10) == []  # b holds it on a live lease
    await a.release("a")
    [taken] = await b.claim("b", 60, 10)
    assert taken == stored("live", 1.0)
    # The new owner writes; the old one is fenced off.
    await b.append("live", [frame(1)], [], owner="b", lease_seconds=60)
    with pytest.raises(LeaseLost):
        await a.append("live", [frame(2)], [], owner="a", lease_seconds=60)
    assert [f.seq for f in (await b.load("live", 10))[1]] == [1]


async def test_heartbeat_keeps_the_lease_release_gives_it_up(
    stores: list[PostgresRunStore],
) -> None:
    a, b = stores
    await a.append("r", [], [], create=stored("r"), owner="a", lease_seconds=0.3)
    for _ in range(3):
        await asyncio.sleep(0.15)
        await a.heartbeat("a", 0.3)
        assert await b.claim("b", 60, 10) == []
    await a.release("a")
    assert [run.run_id for run in await b.claim("b", 60, 10)] == ["r"]


async def test_finish_marks_the_run_and_expire_drops_it(
    stores: list[PostgresRunStore], databases: list[PostgresDatabase]
) -> None:
    a, _ = stores
    await a.append("r", [frame(1), frame(2)], [checkpoint("k", 1)], create=stored("r"), owner="a")
    await a.append("kept", [frame(1)], [], create=stored("kept"), owner="a")
    await a.finish("r")

    async def count(connection: Any) -> tuple[int, int, int]:
        return (
            await connection.fetchval("SELECT count(*) FROM atmosphere_runs"),
            await connection.fetchval("SELECT count(*) FROM atmosphere_run_frames"),
            await connection.fetchval("SELECT count(*) FROM atmosphere_run_checkpoints"),
        )

    # Frames and checkpoints stay a little, for readers on other replicas
    # (`FOLLOW_GRACE_SECONDS`; a record past it is tested on the remote reader).
    assert await databases[0].run(count) == (2, 3, 1)
    frames, finished = await a.frames_after("r", 0, 10)
    assert ([f.seq for f in frames], finished) == ([1, 2], True)
    assert [run.run_id for run in await a.claim("b", 60, 10)] == ["kept"]  # never "r"
    assert await a.expire(0.0) == 0
    assert await databases[0].run(count) == (2, 3, 1)
    assert await a.expire(1e12) == 1
    assert await databases[0].run(count) == (1, 1, 0)


async def test_two_replicas_claiming_at_once_never_get_one_run(
    stores: list[PostgresRunStore],
) -> None:
    a, b = stores
    runs = [f"run-{index}" for index in range(60)]
    for index, run_id in enumerate(runs):
        await a.append(run_id, [frame(1)], [], create=stored(run_id, float(index)), owner="dead")
    claimers = [(store, f"owner-{index}") for index in range(3) for store in (a, b)]

    async def claim_all(store: PostgresRunStore, owner: str) -> list[str]:
        got: list[str] = []
        for _ in range(10):
            got += [run.run_id for run in await store.claim(owner, 60, 7)]
        return got

    results = await asyncio.gather(*(claim_all(store, owner) for store, owner in claimers))
    claimed = [run_id for result in results for run_id in result]
    # Each run once, none lost. (Which claimers win is up to the scheduling: one of them taking
    # all 60 is rare but legitimate, so the spread is not asserted.)
    assert sorted(claimed) == sorted(runs)


async def test_postgres_with_durable_runs_journals_in_postgres(url: str, tmp_path: Path) -> None:
    settings = HarnessSettings(workspace_root=tmp_path, postgres_url=url, durable_runs=True)
    runs = resolve_backends(settings).runs
    assert isinstance(runs, LiveRuns)
    assert isinstance(runs.store, PostgresRunStore)
    assert runs.store.name == "postgres"
    plain = resolve_backends(HarnessSettings(workspace_root=tmp_path, postgres_url=url)).runs
    assert not plain.durable


async def test_another_replica_finds_and_reads_a_run(stores: list[PostgresRunStore]) -> None:
    a, b = stores
    assert await b.latest("/p", "conv") is None
    await a.append("old", [frame(1)], [], create=stored("old", 1.0), owner="a")
    await a.finish("old")
    assert await b.latest("/p", "conv") == (replace(stored("old", 1.0), message=""), True)
    first = StoredRun("first", "/p", "conv", None, "s-first", "hi", 2.0)
    second = StoredRun("second", "/p", "conv", None, "s-second", "hi", 3.0)
    await a.append("first", [frame(1), frame(2)], [], create=first, owner="a")
    await a.append("second", [], [], create=second, owner="a")
    # The oldest unfinished run, else the one a session id names; another endpoint sees none.
    assert await b.latest("/p", "conv") == (first, False)
    assert await b.latest("/p", "conv", session_id="s-second") == (second, False)
    assert await b.latest("/p", "conv", session_id="unknown") == (first, False)
    assert await b.latest("/other", "conv") is None

    frames, finished = await b.frames_after("first", 0, 10)
    assert ([f.seq for f in frames], finished) == ([1, 2], False)
    assert frames[0].session_id == "s-first"
    await a.append("first", [frame(3), frame(4)], [], owner="a")
    frames, _ = await b.frames_after("first", 2, 1)
    assert [f.seq for f in frames] == [3]
    await a.finish("first")
    frames, finished = await b.frames_after("first", 3, 10)
    assert ([f.seq for f in frames], finished) == ([4], True)
    assert await b.frames_after("never", 0, 10) == ([], True)
    assert await b.latest("/p", "conv") == (second, False)


def test_the_remote_reader_resolves_references_as_the_journal_writes_them() -> None:
    assert remote.REFERENCE == durable_writer.REFERENCE


async def test_a_replica_that_lost_its_run_stops_it_without_a_trace(
    stores: list[PostgresRunStore],
) -> None:
    a, b = stores
    runs = DurableRuns(a, lease_seconds=60)
    go_on = asyncio.Event()

    async def work(handle: LiveRunHandle) -> None:
        await handle.publish(Frame("text", {"text": "one"}, "s", "conv", 1))
        await go_on.wait()
        await handle.publish(Frame("text", {"text": "two"}, "s", "conv", 2))
        await asyncio.sleep(3600)  # a run that would go on here

    live = runs.start(
        work, path="/p", conversation_id="conv", user_id=None, session_id="s", message="m"
    )
    reader = live.follow(0)
    assert (await anext(reader)).data == {"text": "one"}
    # This replica stalls past its lease; another one takes the run over.
    await a.release(runs.owner)
    [taken] = await b.claim("b", 60, 10)
    go_on.set()
    moved = await asyncio.wait_for(anext(reader), 30)
    assert (moved.event, moved.data["message"]) == ("error", live_runs.MOVED)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(live.task), 30)  # type: ignore[arg-type]
    assert live.suspended  # no history write, no `complete`
    _, frames = await b.load(taken.run_id, 10)
    assert [f.seq for f in frames] == [1]  # nothing of it written into the new owner's journal
    await runs.aclose()


async def test_a_run_s_writes_notify_only_while_a_replica_follows_it(
    url: str, stores: list[PostgresRunStore]
) -> None:
    """Every `NOTIFY` wakes every replica's `LISTEN` backend in PostgreSQL (whatever its
    channels), so a run's writes (the frame feed's, alone or in a batch, and a durable run's)
    send their notice only while a replica follows the run: none before, each write's while a
    reader on another replica watches it, none once it left."""
    a, b = stores
    owner = FEED_OWNER + "a"
    heard: list[str] = []
    spy = await asyncpg.connect(url)  # hears the channels, follows nothing
    try:
        for run_id in ("feed", "durable"):
            await spy.add_listener(channel(run_id), lambda *args: heard.append(args[3]))
        await a.append("feed", [frame(1)], [], create=stored("feed"), owner=owner, lease_seconds=60)
        await a.append("feed", [frame(2)], [], owner=owner)
        assert await a.append_feeds(owner, [("feed", [frame(3)])]) == {}
        await a.append("durable", [frame(1)], [], create=stored("durable"), owner="replica-a")
        await a.append("durable", [frame(2)], [], owner="replica-a")
        await asyncio.sleep(0.3)
        assert heard == []

        woken: list[int] = []
        unwatch = [b.watch(run_id, woken.append) for run_id in ("feed", "durable")]
        async with asyncio.timeout(10):
            while b._watchers.listening != {"feed", "durable"}:
                await asyncio.sleep(0.01)
        await a.append("feed", [frame(4)], [], owner=owner)
        assert await a.append_feeds(owner, [("feed", [frame(5)])]) == {}
        await a.append("durable", [frame(3)], [], owner="replica-a")
        async with asyncio.timeout(10):
            while len(heard) < 3 or not {4, 5, 3} <= set(woken):
                await asyncio.sleep(0.01)
        assert heard == ["4 feed", "5 feed", "3 durable"]

        for leave in unwatch:
            leave()
        async with asyncio.timeout(10):
            while b._watchers.listening:
                await asyncio.sleep(0.01)
            while await spy.fetchval("SELECT max(followers) FROM atmosphere_runs"):
                await asyncio.sleep(0.01)
        await a.append("feed", [frame(6)], [], owner=owner)
        await a.append("durable", [frame(4)], [], owner="replica-a")
        await asyncio.sleep(0.3)
        assert heard == ["4 feed", "5 feed", "3 durable"]
    finally:
        await spy.close()
