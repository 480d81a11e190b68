"""Every periodic query of the PostgreSQL backend reads what it must, not what is kept.

The upkeep a replica runs on a timer (the run journal's and the frame feed's lease heartbeat,
claim, expire and abandon; the memory reaper's idle scan; the plan bus's sweep; the approvals'
expiry; the retention sweep's claim of idle conversations and each deletion's statements)
must cost the same with a thousand kept runs and conversations as with a million. The
test fills a fresh database with many kept rows (finished runs within the keep window, closed
conversations, old plan updates, answered approvals) and a few due ones, runs each periodic
call of the real stores once while recording the statements they send (asyncpg's query
logger), then plans each statement again with `EXPLAIN ANALYZE` (inside a transaction that is
rolled back) twice: as a custom plan and as the generic plan PostgreSQL may switch a prepared
statement to after five executions (asyncpg prepares every statement). It fails on a
sequential scan of a filled table, or on any scan that reads far more rows of it than the
upkeep had to touch.
"""

from __future__ import annotations

import asyncio
import json
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

from atmosphere_harness._backends.postgres import (
    PostgresApprovalStore,
    PostgresConversationOwners,
    PostgresDatabase,
    PostgresHistory,
    PostgresPlanBus,
    PostgresPlanStore,
    PostgresRunRegistry,
    PostgresRunStore,
)
from atmosphere_harness._backends.postgres import runs as postgres_runs
from atmosphere_harness._backends.postgres.approvals import REMEMBER_SECONDS
from atmosphere_harness._backends.postgres.bus import TTL_SECONDS as PLAN_TTL
from atmosphere_harness._backends.postgres.prompt_keys import PostgresPromptKeys
from atmosphere_harness._backends.postgres.runs import FOLLOW_GRACE_SECONDS
from atmosphere_harness._contracts import FEED_OWNER
from atmosphere_harness._memory.history import ConversationKey

from .postgres_service import create_database, drop_database

pytestmark = pytest.mark.services

T = TypeVar("T")

KEPT = 100_000
"""Kept rows per table: enough that a scan of them dwarfs the due work."""
DUE = 50
"""Rows each periodic call has work to do on (due runs, idle conversations, ...)."""
MOST_ROWS_READ = 2_000
"""A scan may read the due rows and the bookkeeping around them, never the kept ones."""
LEASE = 15.0
KEEP = 600.0


class Recording(PostgresDatabase):
    """A `PostgresDatabase` that keeps every statement its stores send, with the arguments."""

    def __init__(self, url: str) -> None:
        super().__init__(url, pool_max=2)
        self.statements: list[tuple[str, tuple[Any, ...]]] = []
        self.recording = False

    async def _once(self, work: Callable[[Any], Awaitable[T]]) -> T:
        async def logged(connection: Any) -> T:
            def record(query: Any) -> None:
                if self.recording:
                    self.statements.append((query.query, tuple(query.args or ())))

            connection.add_query_logger(record)
            try:
                return await work(connection)
            finally:
                connection.remove_query_logger(record)

        return await super()._once(logged)


async def fill(database: PostgresDatabase, now: float) -> None:
    """Kept rows, and `DUE` rows of work for each periodic call."""

    async def work(connection: Any) -> None:
        # Finished runs kept for `KEEP` seconds (their frames already dropped), some past it.
        await connection.execute(
            "INSERT INTO atmosphere_runs (run_id, path, conversation_id, user_key, session_id, "
            "message, started_at, owner, lease_until, finished_at) "
            "SELECT 'kept-' || g, '/p', 'c-' || g, '', 's-' || g, '', $1::float8 - $2 * g / $3, "
            "'owner-x', 0, $1::float8 - $2 * g / $3 + 1 FROM generate_series(1, $3) AS g",
            now - 60,
            KEEP - 80,
            KEPT,
        )
        await connection.execute(
            "INSERT INTO atmosphere_runs (run_id, path, conversation_id, user_key, session_id, "
            "message, started_at, owner, lease_until, finished_at) "
            "SELECT 'old-' || g, '/p', 'o-' || g, '', 's', '', $1::float8 - 1, 'owner-x', 0, "
            "$1::float8 FROM generate_series(1, $2) AS g",
            now - KEEP - 10,
            DUE,
        )
        # Runs in flight: this replica's, a live replica's, and a dead one's (lease run out),
        # durable and frame-feed ones.
        for owner, lease in (
            ("owner-a", now + LEASE),
            ("owner-b", now + LEASE),
            ("owner-dead", now - 60),
            (FEED_OWNER + "a", now + LEASE),
            (FEED_OWNER + "dead", now - 60),
        ):
            await connection.execute(
                "INSERT INTO atmosphere_runs (run_id, path, conversation_id, user_key, "
                "session_id, message, started_at, owner, lease_until) "
                "SELECT $1 || g, '/p', $1 || g, '', 's', 'hi', $2::float8, $1, $3::float8 "
                "FROM generate_series(1, $4) AS g",
                owner,
                now - 5,
                lease,
                DUE // 5,
            )
        # Conversations: kept closed ones, and `DUE` open ones idle past the timeout.
        await connection.execute(
            "INSERT INTO atmosphere_conversations (endpoint, user_key, conversation_id, "
            "updated_at, closed_at) SELECT '/p', '', 'kept-' || g, $1::float8 - g, $1::float8 "
            "FROM generate_series(1, $2) AS g",
            now,
            KEPT,
        )
        await connection.execute(
            "INSERT INTO atmosphere_conversations (endpoint, user_key, conversation_id, "
            "updated_at) SELECT '/p', '', 'open-' || g, $1::float8 - g "
            "FROM generate_series(1, $2) AS g",
            now - 3600,
            DUE,
        )
        # Plan updates: kept ones of many conversations, a few past the bus's time to live.
        await connection.execute(
            "INSERT INTO atmosphere_plan_events (owner, conversation_id, data, created_at) "
            "SELECT 'anonymous', 'c-' || (g % 5000), '{}', $1::float8 - g % $3 "
            "FROM generate_series(1, $2) AS g",
            now,
            KEPT,
            int(PLAN_TTL) - 120,
        )
        await connection.execute(
            "INSERT INTO atmosphere_plan_events (owner, conversation_id, data, created_at) "
            "SELECT 'anonymous', 'c-' || g, '{}', $1::float8 FROM generate_series(1, $2) AS g",
            now - PLAN_TTL - 10,
            DUE,
        )
        # Approvals: answered and closed ones remembered, a few past remembering.
        await connection.execute(
            "INSERT INTO atmosphere_approvals (id, path, conversation_id, tool, tool_call_id, "
            "arguments, expires_at, answer, closed) SELECT $3 || g, '/p', 'c-' || g, "
            "'write_file', 'call', '{}', $1::float8 - g % 3000, 'true', true "
            "FROM generate_series(1, $2) AS g",
            now,
            KEPT,
            "kept-",
        )
        await connection.execute(
            "INSERT INTO atmosphere_approvals (id, path, conversation_id, tool, tool_call_id, "
            "arguments, expires_at, answer, closed) SELECT 'gone-' || g, '/p', 'c-' || g, "
            "'write_file', 'call', '{}', $1::float8, 'true', true "
            "FROM generate_series(1, $2) AS g",
            now - REMEMBER_SECONDS - 10,
            DUE,
        )
        # Frames: of the runs in flight, of runs that finished within the follow grace, and of
        # runs whose grace just ran out (the frames `expire` drops).
        for name, finished in (("recent-", now - 2), ("due-", now - FOLLOW_GRACE_SECONDS - 5)):
            await connection.execute(
                "INSERT INTO atmosphere_runs (run_id, path, conversation_id, user_key, "
                "session_id, message, started_at, owner, lease_until, finished_at) "
                "SELECT $1 || g, '/p', $1 || g, '', 's', '', $2::float8 - 5, 'owner-x', 0, "
                "$2::float8 FROM generate_series(1, $3) AS g",
                name,
                finished,
                DUE,
            )
        await connection.execute(
            "INSERT INTO atmosphere_run_frames (run, seq, event, data) "
            "SELECT r.id, s, 'text', '{\"text\":\"x\"}' FROM atmosphere_runs AS r, "
            "generate_series(1, 200) AS s WHERE r.finished_at IS NULL "
            "OR r.run_id LIKE 'recent-%' OR r.run_id LIKE 'due-%'"
        )
        # Conversation owners: kept ones prompted lately, `DUE` idle past the retention time;
        # their run records, prompt keys and plans (what deleting one reads).
        await connection.execute(
            "INSERT INTO atmosphere_conversation_owners (path, conversation_id, user_key, "
            "claimed_at, updated_at) SELECT '/p', 'c-' || g, 'u-' || (g % 100), $1::float8, "
            "$1::float8 - g % 3000 FROM generate_series(1, $2) AS g",
            now,
            KEPT,
        )
        await connection.execute(
            "INSERT INTO atmosphere_conversation_owners (path, conversation_id, user_key, "
            "claimed_at, updated_at) SELECT '/p', 'idle-' || g, 'u', $1::float8, $1::float8 "
            "FROM generate_series(1, $2) AS g",
            now - 7 * 86400,
            DUE,
        )
        await connection.execute(
            "INSERT INTO atmosphere_run_control (run_id, path, conversation_id, user_key, "
            "has_user, status, owner, lease_until, started_at, updated_at) "
            "SELECT 'rc-' || g, '/p', 'c-' || g, '', false, 'completed', 'owner-x', 0, "
            "$1::float8, $1::float8 FROM generate_series(1, $2) AS g",
            now,
            KEPT,
        )
        await connection.execute(
            "INSERT INTO atmosphere_prompt_keys (scope, record, expires_at, path, "
            "conversation_id) SELECT 'pk-' || g, '{}', $1::float8 + 3600, '/p', 'c-' || g "
            "FROM generate_series(1, $2) AS g",
            now,
            KEPT,
        )
        await connection.execute(
            "INSERT INTO atmosphere_plans (owner, agent_id, conversation_id, plan, updated_at) "
            "SELECT 'agents/a', 'a', 'c-' || g, '{}', $1::float8 FROM generate_series(1, $2) AS g",
            now,
            KEPT,
        )
        await connection.execute("ANALYZE")

    await database.run(work)


@pytest.fixture
async def database() -> AsyncIterator[Recording]:
    url = await asyncio.to_thread(create_database)
    recording = Recording(url)
    try:
        await recording.open()
        yield recording
    finally:
        await recording.aclose()
        await asyncio.to_thread(drop_database, url)


async def upkeep(database: Recording, now: float) -> dict[str, list[tuple[str, tuple[Any, ...]]]]:
    """Run every periodic call once; the statements each sent."""
    runs = PostgresRunStore(database)
    history = PostgresHistory(database)
    bus = PostgresPlanBus(database)
    approvals = PostgresApprovalStore(database)
    owners = PostgresConversationOwners(database)
    control = PostgresRunRegistry(database)
    keys = PostgresPromptKeys(database)
    plans = PostgresPlanStore(database, "agents/a")
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "runs.heartbeat": lambda: runs.heartbeat("owner-a", LEASE),
        "runs.heartbeat(feed)": lambda: runs.heartbeat(FEED_OWNER + "a", LEASE),
        "runs.claim": lambda: runs.claim("owner-a", LEASE, 8),
        "runs.expire": lambda: runs.expire(now - KEEP),
        "runs.abandon": lambda: runs.abandon("the replica running it stopped", 8),
        "history.idle": lambda: history.idle(now - 1800, 256),
        "plan_bus.publish (with its sweep)": lambda: bus.publish("anonymous", "c-1", {"s": []}),
        "approvals.open (with its expiry)": lambda: approvals.open(
            path="/p",
            conversation_id="c-new",
            user_id=None,
            tool="write_file",
            tool_call_id="call-new",
            arguments={},
            timeout=60,
        ),
        # Retention: claim the idle conversations, then delete one from every table.
        "owners.expired": lambda: owners.expired(now - 86400, 64, 300),
        "owners.children": lambda: owners.children("/p", "idle-1"),
        "owners.forget (idle)": lambda: owners.forget("/p", "idle-1", idle_before=now - 86400),
        "runs.forget": lambda: runs.forget("/p", "o-1"),
        "control.forget": lambda: control.forget("/p", "c-1"),
        "prompt_keys.forget": lambda: keys.forget("/p", "c-1"),
        "approvals.forget": lambda: approvals.forget("/p", "c-2"),
        "plan_bus.forget": lambda: bus.forget("anonymous", "c-2"),
        "plans.forget": lambda: plans.forget("c-1"),
        "history.clear": lambda: history.clear(ConversationKey("/p", None, "kept-1")),
    }
    sent: dict[str, list[tuple[str, tuple[Any, ...]]]] = {}
    for name, call in calls.items():
        database.statements.clear()
        database.recording = True
        try:
            await call()
        finally:
            database.recording = False
        sent[name] = list(database.statements)
    return sent


async def left(connection: Any) -> dict[str, int]:
    """Frames of the runs whose follow grace ran out and of recent ones; runs past keeping."""
    frames = (
        "SELECT count(*) FROM atmosphere_run_frames AS f JOIN atmosphere_runs AS r "
        "ON r.id = f.run WHERE r.run_id LIKE $1"
    )
    return {
        "due": await connection.fetchval(frames, "due-%"),
        "recent": await connection.fetchval(frames, "recent-%"),
        "old": await connection.fetchval(
            "SELECT count(*) FROM atmosphere_runs WHERE run_id LIKE 'old-%'"
        ),
    }


def scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of a JSON plan that reads a table (or its index)."""
    found = [plan] if "Relation Name" in plan else []
    for child in plan.get("Plans", ()):
        found += scans(child)
    return found


async def explain(
    database: PostgresDatabase, statement: str, args: tuple[Any, ...], generic: bool
) -> dict[str, Any]:
    """The executed plan of `statement` (rolled back), custom or generic."""

    class Rollback(Exception):
        pass

    found: dict[str, Any] = {}

    async def work(connection: Any) -> None:
        try:
            async with connection.transaction():
                if generic:
                    prepared = await connection.prepare(statement)
                    types = [
                        await connection.fetchval("SELECT format_type($1::oid, NULL)", t.oid)
                        for t in prepared.get_parameters()
                    ]
                    await connection.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                    typed = f"({', '.join(types)})" if types else ""
                    await connection.execute(f"PREPARE periodic {typed} AS {statement}")
                    # EXECUTE takes no bound parameters: each value as a typed literal.
                    values = [
                        await connection.fetchval(
                            f"SELECT quote_nullable($1::{kind}::text) || '::{kind}'", value
                        )
                        for kind, value in zip(types, args, strict=True)
                    ]
                    given = f"({', '.join(values)})" if values else ""
                    rows = await connection.fetchval(
                        f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE periodic {given}"
                    )
                else:
                    await connection.execute("SET LOCAL plan_cache_mode = force_custom_plan")
                    rows = await connection.fetchval(
                        f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", *args
                    )
                found.update(json.loads(rows)[0]["Plan"])
                raise Rollback
        except Rollback:
            pass
        finally:
            # A prepared statement may outlive the transaction.
            if await connection.fetchval(
                "SELECT count(*) FROM pg_prepared_statements WHERE name = 'periodic'"
            ):
                await connection.execute("DEALLOCATE periodic")

    await database.run(work)
    return found


BIG_TABLES = {
    "atmosphere_conversation_owners",
    "atmosphere_run_control",
    "atmosphere_prompt_keys",
    "atmosphere_plans",
    "atmosphere_runs",
    "atmosphere_run_frames",
    "atmosphere_conversations",
    "atmosphere_plan_events",
    "atmosphere_approvals",
}


async def test_no_periodic_query_reads_the_kept_rows(
    database: Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    await fill(database, now)
    # The run store reads the clock the fill was stamped with, however long the fill took.
    monkeypatch.setattr(postgres_runs, "time", types.SimpleNamespace(time=lambda: now))
    sent = await upkeep(database, now)
    assert all(sent.values()), {name: len(s) for name, s in sent.items()}
    assert await database.run(left) == {"due": 0, "recent": DUE * 200, "old": 0}, (
        "expire drops the frames whose grace ran out and the runs past keeping, nothing else"
    )
    problems: list[str] = []
    checked = 0
    for name, statements in sent.items():
        for statement, args in statements:
            if "WHERE" not in statement or not any(table in statement for table in BIG_TABLES):
                continue  # reads no filled table (an `INSERT ... VALUES`, a `pg_notify`)
            for generic in (False, True):
                plan = await explain(database, statement, args, generic)
                checked += 1
                for node in scans(plan):
                    table = node["Relation Name"]
                    if table not in BIG_TABLES:
                        continue
                    read = node.get("Actual Rows", 0) * node.get("Actual Loops", 1) + node.get(
                        "Rows Removed by Filter", 0
                    ) * node.get("Actual Loops", 1)
                    kind = "generic" if generic else "custom"
                    if node["Node Type"] == "Seq Scan":
                        problems.append(f"{name} ({kind} plan): Seq Scan on {table}: {statement}")
                    elif read > MOST_ROWS_READ:
                        problems.append(
                            f"{name} ({kind} plan): {node['Node Type']} of {table} read {read} "
                            f"rows: {statement}"
                        )
    assert checked >= 30
    assert not problems, "\n".join(problems)
