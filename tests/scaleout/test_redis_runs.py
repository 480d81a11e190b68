"""`RedisRunStore` on a real Redis: the `RunStore` / `RunFeed` contract the PostgreSQL store
keeps (its tests, run here on two connections = two replicas), and what only Redis needs:
bounded keys, a resumed run's approval reopened on another replica."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest

from atmosphere_harness import HarnessSettings
from atmosphere_harness._backends import resolve_backends
from atmosphere_harness._backends.redis import (
    RedisApprovalStore,
    RedisConnection,
    RedisRunStore,
)
from atmosphere_harness._backends.redis import runs as redis_runs
from atmosphere_harness._contracts import LiveRunHandle, StoredRun
from atmosphere_harness._durable.journal import DurableRuns
from atmosphere_harness._governance.approvals import Answer, AnswerStatus, PendingApproval

# The contract tests of the PostgreSQL store, run on Redis through the `stores` fixture below.
from tests.scaleout.test_postgres_runs import (  # noqa: F401
    checkpoint,
    frame,
    stored,
    test_a_live_lease_is_not_taken_an_expired_or_released_one_is,
    test_a_replica_that_lost_its_run_stops_it_without_a_trace,
    test_another_replica_finds_and_reads_a_run,
    test_heartbeat_keeps_the_lease_release_gives_it_up,
    test_two_replicas_claiming_at_once_never_get_one_run,
    test_what_is_appended_is_loaded_back_on_another_replica,
)

from .redis_service import keys_under, url_for

pytestmark = pytest.mark.services


@pytest.fixture
def stores(connection: RedisConnection, other_connection: RedisConnection) -> list[RedisRunStore]:
    """Replica A's store and replica B's, each on its own connection pool."""
    return [RedisRunStore(connection), RedisRunStore(other_connection)]


def run_keys(prefix: str) -> set[str]:
    return {key[len(prefix) :] for key in keys_under(prefix)}


async def test_finish_marks_the_run_and_expire_drops_it(
    stores: list[RedisRunStore], redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = stores
    await a.append("r", [frame(1), frame(2)], [checkpoint("k", 1)], create=stored("r"), owner="a")
    await a.append("kept", [frame(1)], [], create=stored("kept"), owner="a")
    await a.finish("r")
    # Frames and checkpoints stay a little, for readers on other replicas.
    assert {"run:r:frames", "run:r:checkpoints"} <= run_keys(redis_prefix)
    frames, finished = await a.frames_after("r", 0, 10)
    assert ([f.seq for f in frames], finished) == ([1, 2], True)
    assert [run.run_id for run in await a.claim("b", 60, 10)] == ["kept"]  # never "r"
    assert await a.expire(0.0) == 0
    assert {"run:r", "run:r:frames", "run:r:checkpoints"} <= run_keys(redis_prefix)
    # Past the grace period the frames go; the record stays until `expire` reaches it.
    monkeypatch.setattr(redis_runs, "FOLLOW_GRACE_SECONDS", -1.0)
    assert await a.expire(0.0) == 0
    keys = run_keys(redis_prefix)
    assert "run:r" in keys
    assert not {"run:r:frames", "run:r:checkpoints"} & keys
    assert await a.latest("/p", "conv") == (stored("kept"), False)
    assert await a.expire(1e12) == 1
    keys = run_keys(redis_prefix)
    assert not any(key.startswith("run:r") for key in keys)
    assert {"run:kept", "run:kept:frames"} <= keys
    assert await a.load("r", 10) == ({}, [])


async def test_every_run_key_has_a_ttl(stores: list[RedisRunStore], redis_prefix: str) -> None:
    a, b = stores
    await a.append("r", [frame(1)], [checkpoint("k", 1)], create=stored("r"), owner="a")
    await a.append("f", [frame(1)], [checkpoint("k", 1)], create=stored("f"), owner="a")
    await a.heartbeat("a", 60)
    await a.release("a")
    await b.claim("b", 60, 10)
    await b.finish("f")
    client = a.connection.client
    for key in keys_under(redis_prefix):
        if key.endswith(("runs:leases", "runs:compact", "runs:finished")):
            continue  # app-wide indexes, bounded by `expire` and `claim`
        assert await client.ttl(key) > 0, key
    assert 0 < await client.ttl(redis_prefix + "run:f:frames") <= 4 * 30


async def test_redis_with_durable_runs_journals_in_redis(redis_prefix: str, tmp_path: Path) -> None:
    url = url_for(redis_prefix)
    settings = HarnessSettings(workspace_root=tmp_path, redis_url=url, durable_runs=True)
    runs = resolve_backends(settings).runs
    assert isinstance(runs, DurableRuns)
    assert isinstance(runs.store, RedisRunStore)
    assert runs.store.name == "redis"
    plain = resolve_backends(HarnessSettings(workspace_root=tmp_path, redis_url=url)).runs
    assert not plain.durable


async def ask(
    store: RedisApprovalStore, resumed: PendingApproval | None = None
) -> PendingApproval | None:
    """Open the test's approval on `store`; with `resumed`, reopen that one (a resumed run)."""
    return await store.open(
        path="/p",
        conversation_id="conv",
        user_id="ann",
        tool="rm",
        tool_call_id="c1",
        arguments={"x": 1},
        timeout=60,
        approval_id=resumed.id if resumed is not None else None,
        expires_at=resumed.expires_at if resumed is not None else None,
    )


async def test_a_resumed_run_reopens_its_approval_on_another_replica(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    dead, alive = RedisApprovalStore(connection), RedisApprovalStore(other_connection)
    first = await ask(dead)
    assert first is not None
    # Replica A dies while the run waits; the run resumes on B under the same id.
    resumed = await ask(alive, first)
    assert resumed is not None
    assert resumed.id == first.id
    assert resumed.expires_at == first.expires_at
    [listed] = await alive.pending("/p", "conv", user_id="ann")
    assert listed.id == first.id
    answer = Answer(True, None)
    assert await dead.answer("/p", first.id, answer, user_id="ann") is AnswerStatus.ACCEPTED
    assert await asyncio.wait_for(alive.wait(resumed, 30), 30) == answer

    # An answer given while no replica waited resolves the reopened wait at once.
    second = await ask(dead)
    assert second is not None
    assert await alive.answer("/p", second.id, Answer(False, None), user_id="ann") is (
        AnswerStatus.ACCEPTED
    )
    again = await ask(alive, second)
    assert again is not None
    assert again.future.done()
    assert await alive.wait(again, 30) == Answer(False, None)
    assert json.loads(json.dumps(again.arguments)) == {"x": 1}
    await dead.aclose()
    await alive.aclose()


class SwallowingRunStore(RedisRunStore):
    """A `RedisRunStore` whose first heartbeat returns, once cancelled, as a command does when
    the driver swallowed the cancellation (Python 3.11's `asyncio.wait_for` returns the result
    of a write that completed just as the cancellation came): nothing is raised."""

    def __init__(self, connection: RedisConnection) -> None:
        super().__init__(connection)
        self.beating = asyncio.Event()

    async def heartbeat(self, owner: str, lease_seconds: float) -> None:
        await super().heartbeat(owner, lease_seconds)
        if not self.beating.is_set():
            self.beating.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)  # (the reply being read when the shutdown comes)


async def test_a_shutdown_ends_the_upkeep_though_the_driver_swallowed_its_cancellation(
    connection: RedisConnection,
) -> None:
    """The journal's upkeep loop is cancelled at shutdown while a store call is in flight, and
    the call swallows the cancellation: the loop still ends, so the shutdown does not wait for
    it forever (a replica that would never exit)."""
    store = SwallowingRunStore(connection)
    runs = DurableRuns(store, lease_seconds=0.9)

    async def resume(_handle: LiveRunHandle, _stored: StoredRun) -> None:
        return None

    await runs.open(resume)
    keeper = runs._keeper
    assert keeper is not None
    await asyncio.wait_for(store.beating.wait(), 30)
    closing = asyncio.create_task(runs.aclose())
    try:
        done, _ = await asyncio.wait([closing], timeout=30)
        assert done, "the shutdown waits for an upkeep loop that went on"
    finally:
        closing.cancel()
        keeper.cancel()
