"""The PostgreSQL stores one by one, on a real database, with two "replicas" where it matters.

A replica here is a second `postgres_backends(...)` bundle on the same URL: its own pool, its
own LISTEN connection and lock connection, exactly what a second process would have.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from atmosphere_harness import HarnessSettings
from atmosphere_harness._backends import StateBackends, resolve_backends
from atmosphere_harness._backends.postgres import PostgresDatabase, PostgresPlanStore, redact
from atmosphere_harness._backends.postgres.history import LOCK_NEWEST, PostgresHistory
from atmosphere_harness._backends.postgres.locks import MARK, PostgresConversationLocks
from atmosphere_harness._backends.postgres.schema import SCHEMA_VERSION
from atmosphere_harness._errors import BackendUnavailable, PlanStoreError
from atmosphere_harness._governance.approvals import Answer, AnswerStatus
from atmosphere_harness._memory.compaction import Summary
from atmosphere_harness._memory.history import ConversationKey, HistoryRead
from atmosphere_harness._planning.model import AgentPlan, PlanStatus, PlanStep
from atmosphere_harness._runtimes.base import Message, ToolCall
from tests.memory.test_memory_conversation import check_payloads_decoded_once

from .postgres_service import postgres_url, terminate_backends

__all__ = ["postgres_url"]

pytestmark = pytest.mark.services

KEY = ConversationKey("/atmosphere/agent/a", "alice", "c1")


def settings_for(url: str, workspace: Path) -> HarnessSettings:
    return HarnessSettings(workspace_root=workspace, postgres_url=url)


@contextlib.asynccontextmanager
async def replica(url: str, workspace: Path) -> AsyncIterator[StateBackends]:
    backends = resolve_backends(settings_for(url, workspace))
    opened = []
    try:
        for resource in backends.resources:
            await resource.open()
            opened.append(resource)
        yield backends
    finally:
        await backends.plan_bus.aclose()
        for resource in reversed(opened):
            await resource.aclose()


@pytest.fixture
async def pair(
    postgres_url: str, workspace: Path
) -> AsyncIterator[tuple[StateBackends, StateBackends]]:
    async with replica(postgres_url, workspace) as a, replica(postgres_url, workspace) as b:
        yield a, b


def plan(*steps: str, done: int = 0) -> AgentPlan:
    return AgentPlan(
        goal="goal",
        steps=tuple(
            PlanStep(text, PlanStatus.COMPLETED if i < done else PlanStatus.PENDING)
            for i, text in enumerate(steps)
        ),
    )


# --- resolution, schema, start-up ------------------------------------------------------------


def test_the_url_picks_postgres_for_state_and_events(workspace: Path) -> None:
    backends = resolve_backends(settings_for("postgresql://u:pw@127.0.0.1:1/x", workspace))
    assert backends.describe() == {"state": "postgres", "events": "postgres", "workspace": "files"}
    assert type(backends.long_term_memory).__name__ == "PostgresLongTermMemory"
    assert backends.resources, "the pool is opened by the host at start-up"


async def test_two_replicas_migrating_at_once_apply_the_schema_once(postgres_url: str) -> None:
    databases = [PostgresDatabase(postgres_url) for _ in range(4)]
    try:
        await asyncio.gather(*(database.open() for database in databases))
        assert len({database.epoch for database in databases}) == 1
        connection = await asyncpg.connect(postgres_url)
        try:
            versions = await connection.fetch("SELECT version FROM atmosphere_schema")
        finally:
            await connection.close()
        assert [row["version"] for row in versions] == list(range(1, SCHEMA_VERSION + 1))
    finally:
        for database in databases:
            await database.aclose()
    # And a restart finds the schema current and changes nothing.
    again = PostgresDatabase(postgres_url)
    await again.open()
    await again.aclose()


async def test_an_unreachable_url_names_the_variable_and_never_the_password() -> None:
    database = PostgresDatabase("postgresql://atmo:s3cret-pw@127.0.0.1:1/nowhere")
    with pytest.raises(BackendUnavailable) as caught:
        await database.open()
    message = str(caught.value)
    assert "ATMOSPHERE_POSTGRES_URL" in message
    assert "s3cret-pw" not in message
    assert "127.0.0.1:1" in message, "the host is named so the operator can check it"
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@db:5432/x", "postgresql://u:***@db:5432/x"),
        (
            "postgresql://u@db/x?password=pw&sslmode=require",
            "postgresql://u@db/x?password=***&sslmode=require",
        ),
        ("postgresql://db/x", "postgresql://db/x"),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert redact(url) == shown


async def test_a_wrong_database_name_fails_start_up_clearly(postgres_url: str) -> None:
    database = PostgresDatabase(postgres_url + "_missing")
    with pytest.raises(BackendUnavailable, match="ATMOSPHERE_POSTGRES_URL"):
        await database.open()


# --- history ------------------------------------------------------------------------------------


async def test_history_written_on_one_replica_is_read_on_the_other(
    pair: tuple[StateBackends, StateBackends],
) -> None:
    a, b = pair
    assert a.history is not None
    assert b.history is not None
    call = ToolCall("write_file", {"path": "x"}, "t1")
    turn = [
        Message("user", "hello"),
        Message("assistant", "", (call,)),
        Message("tool", "ok", tool_call_id="t1", name="write_file"),
    ]
    await a.history.append(KEY, turn)
    await b.history.append(KEY, [Message("user", "again"), Message("assistant", "hi")])
    assert await a.history.messages(KEY) == [
        *turn,
        Message("user", "again"),
        Message("assistant", "hi"),
    ]
    assert [m.content for m in await b.history.tail(KEY, 2)] == ["again", "hi"]
    assert await a.history.tail(ConversationKey(KEY.endpoint, "bob", "c1"), 10) == []


async def test_concurrent_appends_from_two_replicas_keep_every_turn_whole(
    pair: tuple[StateBackends, StateBackends],
) -> None:
    a, b = pair
    assert a.history is not None
    assert b.history is not None

    async def turns(history: object, name: str) -> None:
        for i in range(15):
            await history.append(  # type: ignore[attr-defined]
                KEY, [Message("user", f"{name}{i}"), Message("assistant", f"{name}{i}!")]
            )

    await asyncio.gather(turns(a.history, "a"), turns(b.history, "b"))
    messages = await b.history.messages(KEY)
    assert len(messages) == 60
    for question, answer in zip(messages[::2], messages[1::2], strict=True):
        assert answer.content == question.content + "!", "a turn is never split"


async def test_summary_extraction_marks_close_and_idle(
    pair: tuple[StateBackends, StateBackends],
) -> None:
    a, b = pair
    assert a.history is not None
    assert b.history is not None
    await a.history.append(KEY, [Message("user", str(i)) for i in range(6)])
    await a.history.save_summary(KEY, Summary("first four", 4), 4)
    await b.history.save_summary(KEY, Summary("older", 2), 2)  # never replaces a newer one
    summary, items = await b.history.since_summary(KEY, 10)
    assert summary == Summary("first four", 4)
    assert [seq for seq, _m in items] == [5, 6]
    fresh, last = await b.history.unextracted(KEY, 100)
    assert len(fresh) == 6
    assert last == 6
    await a.history.mark_extracted(KEY, 6)
    assert await b.history.unextracted(KEY, 100) == ([], 6)
    import time

    assert KEY in await b.history.idle(time.time() + 1, 10)
    assert await b.history.close(KEY) is True
    assert await a.history.close(KEY) is True, "closing twice is not an error"
    assert KEY not in await a.history.idle(time.time() + 1, 10)
    assert await a.history.close(ConversationKey("/x", None, "nope")) is False
    await a.history.clear(KEY)
    assert await b.history.messages(KEY) == []


async def test_a_conversation_closed_on_two_replicas_is_extracted_by_one(
    pair: tuple[StateBackends, StateBackends],
) -> None:
    """Both replicas close it; only one gets the messages to extract (one model call, not
    two), until it marks them extracted or its claim expires."""
    import asyncio

    from atmosphere_harness._backends.postgres import history as postgres_history

    a, b = pair
    assert a.history is not None
    assert b.history is not None
    await a.history.append(KEY, [Message("user", f"fact {i}") for i in range(3)])
    assert await a.history.close(KEY)
    assert await b.history.close(KEY)
    got = await asyncio.gather(a.history.unextracted(KEY, 100), b.history.unextracted(KEY, 100))
    assert sorted(len(messages) for messages, _last in got) == [0, 3]
    assert await a.history.unextracted(KEY, 100) == ([], 0), "still claimed"
    winner = a.history if got[0][0] else b.history
    await winner.mark_extracted(KEY, 3)
    await a.history.append(KEY, [Message("user", "later")])
    # A replica that dies mid-extraction leaves its claim to expire (here: one that already has).
    original = postgres_history.EXTRACTION_CLAIM
    postgres_history.EXTRACTION_CLAIM = -1.0
    try:
        fresh, last = await b.history.unextracted(KEY, 100)
    finally:
        postgres_history.EXTRACTION_CLAIM = original
    assert [m.content for m in fresh] == ["later"], "the claim ended with mark_extracted"
    assert last == 4
    retaken, _ = await a.history.unextracted(KEY, 100)
    assert [m.content for m in retaken] == ["later"]


async def test_a_read_decodes_only_payloads_this_process_has_not_decoded_before(
    pair: tuple[StateBackends, StateBackends], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's first read returns its conversation's newest messages, most of which the
    previous turn's read decoded already: those are decoded once per process."""
    a, b = pair
    assert a.history is not None
    assert b.history is not None
    await check_payloads_decoded_once(a.history, b.history, KEY, monkeypatch)


# --- plans --------------------------------------------------------------------------------------


async def test_plans_are_shared_per_owner_and_bounded(
    pair: tuple[StateBackends, StateBackends], workspace: Path
) -> None:
    a, b = pair
    root = workspace / "agent" / "assistant"
    store_a, store_b = a.plan_stores(root), b.plan_stores(root)
    other = b.plan_stores(workspace / "agent" / "other")
    await store_a.put("assistant", "c1", plan("one", "two", done=1))
    assert await store_b.get("assistant", "c1") == plan("one", "two", done=1)
    assert await other.get("assistant", "c1") is None, "owners do not share plans"
    with pytest.raises(PlanStoreError, match="illegal path"):
        await store_b.get("assistant", "../c1")
    with pytest.raises(PlanStoreError, match="257 steps exceeds"):
        await store_a.put("assistant", "c1", plan(*[f"s{i}" for i in range(257)]))
    assert await store_b.get("assistant", "c1") == plan("one", "two", done=1), "untouched"


async def test_the_plan_cap_never_evicts_a_plan_in_use(
    pair: tuple[StateBackends, StateBackends],
) -> None:
    a, _b = pair
    database = a.resources[0]
    assert isinstance(database, PostgresDatabase)
    busy = PostgresPlanStore(database, "owner", max_plans=3, protect_seconds=3600)
    for i in range(5):
        await busy.put("agent", f"c{i}", plan("x"))
    for i in range(5):
        assert await busy.get("agent", f"c{i}") is not None, "every plan is recent: none evicted"
    idle = PostgresPlanStore(database, "idle-owner", max_plans=3, protect_seconds=0)
    for i in range(5):
        await idle.put("agent", f"c{i}", plan("x"))
    kept = [i for i in range(5) if await idle.get("agent", f"c{i}") is not None]
    assert kept == [2, 3, 4], "idle plans beyond the cap go, oldest first"


# --- plan bus -----------------------------------------------------------------------------------


async def test_a_plan_published_on_one_replica_reaches_a_viewer_on_the_other(
    pair: tuple[StateBackends, StateBackends],
) -> None:
    a, b = pair
    async with b.plan_bus.subscribe("owner", "c1") as subscription:
        assert subscription.replay is None
        first = await a.plan_bus.publish("owner", "c1", {"n": 1})
        await a.plan_bus.publish("owner", "other", {"n": 0})
        second = await a.plan_bus.publish("owner", "c1", {"n": 2})
        seen: list[int] = []
        async with asyncio.timeout(10):
            async for batch in subscription:
                seen.extend(event.data["n"] for event in batch)
                if len(seen) >= 2:
                    break
        assert seen == [1, 2]
    # Resume on the *other* replica from the first id: exactly the update after it.
    async with a.plan_bus.subscribe("owner", "c1", last_event_id=first.id) as resumed:
        assert resumed.replay is not None
        assert [event.id for event in resumed.replay] == [second.id]
        assert resumed.cursor == second.id
    async with a.plan_bus.subscribe("owner", "c1", last_event_id="bogus-1") as unknown:
        assert unknown.replay is None


async def test_bus_history_is_bounded_and_a_pruned_id_asks_for_a_snapshot(
    postgres_url: str, workspace: Path
) -> None:
    from atmosphere_harness._backends.postgres import PostgresPlanBus

    database = PostgresDatabase(postgres_url)
    bus = PostgresPlanBus(database, history_size=3)
    await database.open()
    try:
        ids = [(await bus.publish("o", "c", {"n": n})).id for n in range(6)]
        async with bus.subscribe("o", "c", last_event_id=ids[0]) as old:
            assert old.replay is None, "its successors were pruned: snapshot, not a gap"
        async with bus.subscribe("o", "c", last_event_id=ids[2]) as recent:
            assert recent.replay is not None
            assert [e.data["n"] for e in recent.replay] == [3, 4, 5]
        connection = await asyncpg.connect(postgres_url)
        try:
            count = await connection.fetchval("SELECT count(*) FROM atmosphere_plan_events")
        finally:
            await connection.close()
        assert count == 3
    finally:
        await bus.aclose()
        await database.aclose()


async def test_expired_updates_are_swept_and_cannot_be_resumed_from(postgres_url: str) -> None:
    from atmosphere_harness._backends.postgres import PostgresPlanBus

    database = PostgresDatabase(postgres_url)
    bus = PostgresPlanBus(database, ttl=0.05)
    await database.open()
    try:
        seen = await bus.publish("o", "c", {"n": 1})
        missed = await bus.publish("o", "c", {"n": 2})
        await asyncio.sleep(0.1)
        bus._next_sweep = 0.0  # the next publish sweeps (at most once a minute otherwise)
        new = await bus.publish("o", "other", {"n": 3})
        async with bus.subscribe("o", "c", last_event_id=seen.id) as expired:
            assert expired.replay is None, "what it missed expired: a snapshot, not a silent gap"
        async with bus.subscribe("o", "c", last_event_id=missed.id) as current:
            assert current.replay == [], "it missed nothing: nothing to replay"
        async with bus.subscribe("o", "other") as fresh:
            assert fresh.cursor == new.id
    finally:
        await bus.aclose()
        await database.aclose()


async def test_viewers_catch_up_after_the_listen_connection_is_killed(
    pair: tuple[StateBackends, StateBackends], postgres_url: str
) -> None:
    a, b = pair
    async with b.plan_bus.subscribe("owner", "c9") as subscription:
        await terminate_backends(postgres_url)
        seen: list[int] = []
        async with asyncio.timeout(20):
            await a.plan_bus.publish("owner", "c9", {"n": 1})
            async for batch in subscription:
                seen.extend(event.data["n"] for event in batch)
                if seen:
                    break
        assert seen == [1]


# --- approvals ----------------------------------------------------------------------------------


async def test_an_approval_raised_on_one_replica_is_answered_on_the_other(
    pair: tuple[StateBackends, StateBackends],
) -> None:
    a, b = pair
    pending = await a.approvals.open(
        path="/p",
        conversation_id="c1",
        user_id="alice",
        tool="delete",
        tool_call_id="t1",
        arguments={"path": "x"},
        timeout=30,
    )
    assert pending is not None
    listed = await b.approvals.pending("/p", "c1", user_id="alice")
    assert [entry.to_wire() for entry in listed] == [pending.to_wire()]
    assert await b.approvals.pending("/p", "c1", user_id="bob") == []
    waiter = asyncio.create_task(a.approvals.wait(pending, 30))
    assert await b.approvals.answer("/p", pending.id, Answer(True), user_id="bob") is (
        AnswerStatus.FORBIDDEN
    )
    assert await b.approvals.answer("/q", pending.id, Answer(True), user_id="alice") is (
        AnswerStatus.UNKNOWN
    )
    answer = Answer(True, {"path": "y"})
    assert await b.approvals.answer("/p", pending.id, answer, user_id="alice") is (
        AnswerStatus.ACCEPTED
    )
    async with asyncio.timeout(1.5):  # under the poll interval: the NOTIFY woke it
        assert await waiter == answer
    assert await a.approvals.answer("/p", pending.id, Answer(False), user_id="alice") is (
        AnswerStatus.ALREADY_ANSWERED
    )
    assert await b.approvals.pending("/p", "c1", user_id="alice") == []


async def test_an_unanswered_approval_times_out_and_later_answers_are_unknown(
    pair: tuple[StateBackends, StateBackends],
) -> None:
    a, b = pair
    pending = await a.approvals.open(
        path="/p",
        conversation_id="c",
        user_id=None,
        tool="t",
        tool_call_id="1",
        arguments={},
        timeout=0.2,
    )
    assert pending is not None
    assert await a.approvals.wait(pending, 0.2) is None
    assert await b.approvals.answer("/p", pending.id, Answer(True), user_id=None) is (
        AnswerStatus.UNKNOWN
    )
    assert await b.approvals.answer("/p", "no-such-id", Answer(True), user_id=None) is (
        AnswerStatus.UNKNOWN
    )


async def test_pending_approvals_are_bounded_across_replicas(
    postgres_url: str, workspace: Path
) -> None:
    from atmosphere_harness._backends.postgres import PostgresApprovalStore

    database = PostgresDatabase(postgres_url)
    store = PostgresApprovalStore(database, max_pending=2)
    await database.open()
    try:
        opened = await asyncio.gather(
            *(
                store.open(
                    path="/p",
                    conversation_id="c",
                    user_id=None,
                    tool="t",
                    tool_call_id=str(i),
                    arguments={},
                    timeout=30,
                )
                for i in range(4)
            )
        )
        assert sum(entry is not None for entry in opened) == 2
        for entry in opened:
            if entry is not None:
                await store.discard(entry)
    finally:
        await database.aclose()


# --- locks --------------------------------------------------------------------------------------


async def test_a_conversation_lock_excludes_the_other_replica(
    pair: tuple[StateBackends, StateBackends],
) -> None:
    a, b = pair
    inside: list[str] = []
    overlaps: list[str] = []

    async def prompt(backends: StateBackends, name: str) -> None:
        for _ in range(5):
            async with backends.locks.hold("/p", "c1"):
                if inside:
                    overlaps.append(name)
                inside.append(name)
                await asyncio.sleep(0.01)
                inside.remove(name)

    async with asyncio.timeout(30):
        await asyncio.gather(prompt(a, "a1"), prompt(a, "a2"), prompt(b, "b1"), prompt(b, "b2"))
    assert overlaps == []
    # Another conversation is never blocked by this one.
    async with a.locks.hold("/p", "c1"):
        async with asyncio.timeout(5):
            async with b.locks.hold("/p", "c2"):
                pass


async def test_the_lock_connection_drops_a_silent_peer_about_a_lease_later(
    postgres_url: str, workspace: Path
) -> None:
    """The server keeps a lock connection alive with TCP keepalives scaled to the durable-runs
    lease: a replica whose host vanished without closing it loses its locks about a lease
    later (idle, then two probes, a third of the lease apart), not after the OS default."""
    settings = HarnessSettings(
        workspace_root=workspace, postgres_url=postgres_url, durable_runs_lease_seconds=6
    )
    backends = resolve_backends(settings)
    for resource in backends.resources:
        await resource.open()
    try:
        locks = backends.locks
        assert isinstance(locks, PostgresConversationLocks)
        async with locks.hold("/p", "c1"):
            shown = [
                await locks._statement(f"SHOW {name}", retry=True)
                for name in ("tcp_keepalives_idle", "tcp_keepalives_interval")
            ]
            count, _ = await locks._statement("SHOW tcp_keepalives_count", retry=True)
        assert [value for value, _session in shown] == ["2", "2"]
        assert count == "2"
    finally:
        for resource in reversed(backends.resources):
            await resource.aclose()


async def test_locks_recover_after_their_connection_is_killed(
    pair: tuple[StateBackends, StateBackends], postgres_url: str
) -> None:
    a, b = pair
    async with a.locks.hold("/p", "c1"):
        pass
    await terminate_backends(postgres_url)
    async with asyncio.timeout(20):
        async with a.locks.hold("/p", "c1"):
            pass
        async with b.locks.hold("/p", "c1"):
            pass


async def test_a_release_notifies_only_a_waiter_and_the_waiter_is_woken_by_it(
    pair: tuple[StateBackends, StateBackends],
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An uncontended release sends no `NOTIFY` (each one wakes every replica's listener); a
    waiter marks the lock, so the holder's release notifies it: it never needs its retry timer
    (an hour here)."""
    from atmosphere_harness._backends.postgres import locks

    monkeypatch.setattr(locks, "RETRY_SECONDS", 3600.0)
    a, b = pair
    heard: list[str] = []
    listener = await asyncpg.connect(postgres_url)
    try:
        await listener.add_listener(locks.CHANNEL, lambda *args: heard.append(str(args[-1])))
        async with asyncio.timeout(30):
            for _ in range(3):
                async with a.locks.hold("/p", "alone"):
                    pass
            await a.locks.aclose()  # waits for the releases
            await listener.fetchval("SELECT 1")  # a notification sent before is in by now
            assert heard == []
            async with a.locks.hold("/p", "c1"):
                waiting = asyncio.create_task(_hold_plain(b, "/p", "c1"))
                while not await _marked(listener, locks.mark_key(locks.lock_key("/p", "c1"))):
                    await asyncio.sleep(0.01)
            await waiting
            # B's release runs after its block, in the background: let it finish, or A's next
            # hold below may find the lock still B's, wait, mark it and be notified.
            await b.locks.aclose()
            await listener.fetchval("SELECT 1")
            assert heard == [str(locks.lock_key("/p", "c1"))]
            # The waiter took its mark off: the next release notifies nobody.
            while await _marked(listener, locks.mark_key(locks.lock_key("/p", "c1"))):
                await asyncio.sleep(0.01)
            async with a.locks.hold("/p", "c1"):
                pass
            await a.locks.aclose()
            await listener.fetchval("SELECT 1")
            assert len(heard) == 1
    finally:
        await listener.close()


async def _hold_plain(backends: StateBackends, path: str, conversation: str) -> None:
    async with backends.locks.hold(path, conversation):
        pass


async def _marked(connection: asyncpg.Connection, mark: tuple[int, int]) -> bool:
    """Whether a session holds the waiters' mark `mark` (a two-key advisory lock)."""
    high, low = mark
    return bool(
        await connection.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 "
            "AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND granted",
            high & 0xFFFFFFFF,
            low & 0xFFFFFFFF,
        )
    )


async def test_a_read_offered_to_the_lock_is_made_once_it_is_taken_and_sees_the_last_turn(
    pair: tuple[StateBackends, StateBackends],
) -> None:
    """The run's first history read rides on the statement that takes the lock: never made
    by a try that found the lock taken, and made after the lock is taken, so it sees the turn
    the previous holder (another replica) committed before releasing it."""
    a, b = pair
    assert a.history is not None
    assert b.history is not None
    path, conversation = KEY.endpoint, KEY.conversation_id
    await a.history.append(KEY, [Message("user", "one"), Message("assistant", "1")])
    tries: list[object] = []
    statement = b.locks._statement  # type: ignore[attr-defined]

    async def counted(*args: object, **kwargs: object) -> object:
        result = await statement(*args, **kwargs)
        tries.append(args[0])
        return result

    b.locks._statement = counted  # type: ignore[attr-defined]
    read = HistoryRead(b.history, KEY, 0, 20)
    async with asyncio.timeout(30):
        async with a.locks.hold(path, conversation):
            waiting = asyncio.create_task(_hold_with(b, read))
            while not tries:
                await asyncio.sleep(0.01)
            assert not read.delivered, "a try that found the lock taken read nothing"
            await a.history.append(KEY, [Message("user", "two"), Message("assistant", "2")])
        summary, items = await waiting
    assert summary is None
    assert [(seq, m.content) for seq, m in items] == [(1, "one"), (2, "1"), (3, "two"), (4, "2")]
    assert {str(query) for query in tries} - {MARK} == {LOCK_NEWEST}
    # Released on the way out: the other replica takes it again at once (with a plain try).
    async with asyncio.timeout(30), a.locks.hold(path, conversation):
        pass
    # A conversation nobody wrote yet: the lock is taken and the read delivers nothing.
    fresh = HistoryRead(b.history, KEY._replace(conversation_id="new"), None, 20)
    async with asyncio.timeout(30), b.locks.hold(path, "new", fresh):
        assert fresh.take() == (True, (None, []))


async def _hold_with(backends: StateBackends, read: HistoryRead) -> object:
    path, conversation = read.key.endpoint, read.key.conversation_id
    async with backends.locks.hold(path, conversation, read):
        delivered, result = read.take()
        assert delivered
        return result


async def test_a_lock_taken_by_a_read_that_then_failed_is_released(
    pair: tuple[StateBackends, StateBackends],
) -> None:
    """`LOCK_NEWEST` takes the lock, then its read fails (a negative `LIMIT`, here): the
    session-level lock outlives the failed statement, so the lock releases it itself."""
    a, b = pair
    assert a.history is not None
    broken = HistoryRead(a.history, KEY, 0, -1)
    with pytest.raises(asyncpg.PostgresError, match="LIMIT"):
        async with a.locks.hold(KEY.endpoint, KEY.conversation_id, broken):
            pass
    async with asyncio.timeout(30), b.locks.hold(KEY.endpoint, KEY.conversation_id):
        pass


async def test_a_read_of_another_database_is_left_to_its_reader(
    pair: tuple[StateBackends, StateBackends], postgres_url: str
) -> None:
    a, _b = pair
    elsewhere = PostgresDatabase(postgres_url)
    read = HistoryRead(PostgresHistory(elsewhere), KEY, 0, 20)
    async with asyncio.timeout(30), a.locks.hold(KEY.endpoint, KEY.conversation_id, read):
        assert read.take() == (False, None)


# --- outages ------------------------------------------------------------------------------------


async def test_queries_survive_terminated_connections(
    pair: tuple[StateBackends, StateBackends], postgres_url: str
) -> None:
    a, _b = pair
    assert a.history is not None
    await a.history.append(KEY, [Message("user", "before")])
    await terminate_backends(postgres_url)
    await a.history.append(KEY, [Message("user", "after")])
    assert [m.content for m in await a.history.messages(KEY)] == ["before", "after"]


async def test_statements_one_after_another_keep_their_connection_out_of_the_pool(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`PostgresDatabase.run` keeps its connection for the next statement instead of handing it
    back to asyncpg's pool (whose release and next acquire cost more client CPU than the round
    trip); a run that waits for the pool meanwhile is handed the connection, and a closed
    connection is never used again."""
    released = 0
    release = asyncpg.Pool.release

    async def counting(pool: asyncpg.Pool, connection: object, **kwargs: object) -> None:
        nonlocal released
        released += 1
        await release(pool, connection, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(asyncpg.Pool, "release", counting)

    async def backend(connection: asyncpg.Connection) -> int:
        return int(await connection.fetchval("SELECT pg_backend_pid()"))

    async def slow(connection: asyncpg.Connection) -> int:
        await connection.execute("SELECT pg_sleep(0.05)")
        return await backend(connection)

    def closed(connection: asyncpg.Connection) -> bool:
        try:
            return connection.is_closed()
        except asyncpg.InterfaceError:  # (given back to the pool as it closed)
            return True

    database = PostgresDatabase(postgres_url, pool_max=1)
    await database.open()
    try:
        released = 0
        pids = {await database.run(backend) for _ in range(10)}
        assert len(pids) == 1
        assert released == 0
        # The pool's one connection is kept: a second run waits for the pool, and the first
        # hands it over when it ends (hang guard: neither may wait for the other forever).
        async with asyncio.timeout(10):
            both = await asyncio.gather(database.run(slow), database.run(slow))
        assert set(both) == pids
        assert released == 1
        kept = database._kept[0]
        await terminate_backends(postgres_url)
        async with asyncio.timeout(10):
            while not closed(kept):  # (asyncpg reads the server's goodbye)
                await asyncio.sleep(0.01)
        assert await database.run(backend) not in pids
    finally:
        await database.aclose()
