"""How many round trips a turn makes to its state backend, counted on the wire.

A real uvicorn server (`tests.reliability.server`) talks to PostgreSQL or Redis through a
`WireCounter` proxy; the client sends turns one after another on one conversation and the proxy
counts every round trip the server made, with its purpose. The list is the one
`docs/scale-out-postgres.md` and `docs/scale-out-redis.md` publish: a change that adds a round
trip to a turn fails here. The owner's claim, the lock, the run's status and the history's
first read are one round trip (`owner+lock+status+history.load`: the claim comes first, the
status says `running` and the read is made once the lock is taken, inside that statement or
script). The turn's history append and the run's end are one more, before the last frame: on
Redis with the unlock (`history.append+unlock+run.status`, one script), on PostgreSQL in one
statement on a pooled connection (`history.append+run.status`), the unlock following on the
lock connection without the run waiting for it (`unlock`). The run frame feed (durable runs off)
writes nothing: no other replica asked for these runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Mapping
from pathlib import Path

import httpx2
import pytest

from tests.reliability.server import ServerProcess

from .postgres_service import create_database, drop_database
from .redis_service import delete_prefix, new_prefix, require_redis
from .redis_service import url_for as redis_url_for
from .replicas import prompt, summary
from .wire import Burst, WireCounter, script_names

pytestmark = pytest.mark.services

TURNS = 4
WARM_UP = 3
BACKGROUND = ("SELECT 1", "PING")
"""The `LISTEN` connection's health probe, a pub/sub keep-alive: not the turn's."""

STATUS_WRITES_PER_TURN = 0
"""The run's status record (`GET P/runs/{runId}`) costs a turn no round trip of its own:
`running` rides on the lock's round trip, its end on the lock's release (with the turn's
append, stored before the last frame is sent); `queued` is stored only for a run that waits."""
ASIDE = ("feed", "upkeep", "run.status")
"""Not the turn's own round trips: the frame feed's background writes, the lease upkeep, the run
status writes (counted apart)."""

POSTGRES_PURPOSES = {
    "status AS (INSERT INTO atmosphere_run_control": "history.append+run.status",
    "atmosphere_claim_lock_run": "owner+lock+status+history.load",
    "atmosphere_lock_run": "lock+status+history.load",
    "atmosphere_conversation_owners": "owner.claim",
    "atmosphere_run_control": "run.status",
    "INSERT INTO atmosphere_run": "feed",
    "atmosphere_run": "upkeep",
    "atmosphere_lock_newest": "lock+history.load",
    "pg_try_advisory_lock": "lock",
    "pg_advisory_unlock": "unlock",
    "LEFT JOIN LATERAL": "history.load",
    "INSERT INTO atmosphere_messages": "history.append",
    "FROM atmosphere_facts": "facts.newest",
}
REDIS_PURPOSES = {
    "locks._APPEND_RELEASE_RUN": "history.append+unlock+run.status",
    "locks._RELEASE_RUN": "unlock+run.status",
    "history._CLAIM_LOCK_READ_RUN": "owner+lock+status+history.load",
    "owners._CLAIM": "owner.claim",
    "control.": "run.status",
    "MULTI ; HSET ; EXPIRE ; SADD ; EXPIRE ; SADD ; EXPIRE ; EXEC": "run.status",
    "runs._APPEND": "feed",
    "runs._FINISH": "feed",
    "runs.": "upkeep",
    "Lock.LUA_RELEASE_SCRIPT": "unlock",
    "history._LOCK_READ_RUN": "lock+status+history.load",
    "history._LOCK_READ": "lock+history.load",
    "history._READ": "history.load",
    "history._APPEND": "history.append",
    "long_term._NEWEST": "facts.newest",
    "SET": "lock",
}


def purpose(burst: Burst, names: Mapping[str, str]) -> str:
    for text, name in names.items():
        if text in burst.label:
            return name
    return burst.label


def redis_scripts() -> dict[str, str]:
    from redis.asyncio.lock import Lock

    from atmosphere_harness._backends.redis import control, history, locks, long_term, owners, runs

    found = {
        **script_names(history),
        **script_names(long_term),
        **script_names(runs),
        **script_names(owners),
        **script_names(control),
        **script_names(locks),
    }
    for name in ("LUA_RELEASE_SCRIPT", "LUA_REACQUIRE_SCRIPT", "LUA_EXTEND_SCRIPT"):
        script = getattr(Lock, name)
        found[hashlib.sha1(script.encode()).hexdigest()] = f"Lock.{name}"
    return found


async def turns_on_the_wire(
    proxy: WireCounter, server: ServerProcess, path: str, user: str | None, expected: int
) -> list[Burst]:
    """The round trips of `TURNS` turns (after a warm-up), in the order they were sent."""
    conversation = f"c-{uuid.uuid4().hex[:10]}"
    headers = {"X-User-Id": user} if user else {}
    async with httpx2.AsyncClient(timeout=30) as client:

        async def turn(n: int) -> None:
            frames = await prompt(
                client, server.url, f"history? {n}", conversation, headers=headers, path=path
            )
            summary(frames)

        for n in range(WARM_UP):
            await turn(n)
        await settle(proxy)
        proxy.reset()
        for n in range(TURNS):
            await turn(n)
    # The last release runs after the `complete` frame: wait for it (hang guard), then a moment
    # more, so a round trip too many would be seen too.
    async with asyncio.timeout(10):
        while len(counted(proxy)) < (expected + STATUS_WRITES_PER_TURN) * TURNS:
            await asyncio.sleep(0.01)
    await settle(proxy)
    return counted(proxy)


def counted(proxy: WireCounter) -> list[Burst]:
    found = [b for b in proxy.bursts() if not any(text == b.label for text in BACKGROUND)]
    return sorted(found, key=lambda burst: burst.sent)


async def settle(proxy: WireCounter) -> None:
    """Until no new round trip shows for a quarter second."""
    seen = -1
    while seen != len(proxy.bursts(include_setup=True)):
        seen = len(proxy.bursts(include_setup=True))
        await asyncio.sleep(0.25)


def own(bursts: list[Burst], names: Mapping[str, str]) -> list[Burst]:
    """The turns' own round trips: without the feed's writes and the lease upkeep."""
    return [burst for burst in bursts if purpose(burst, names) not in ASIDE]


def feed_writes(bursts: list[Burst], names: Mapping[str, str]) -> int:
    return sum(purpose(burst, names) == "feed" for burst in bursts)


def per_turn(
    bursts: list[Burst], names: Mapping[str, str], size: int, ordered: int
) -> list[list[str]]:
    """Each turn's purposes in order; the reads in flight together (the lock with the history
    load, the user's facts: all but the last `ordered`) sorted."""
    purposes = [purpose(burst, names) for burst in bursts]
    turns = [purposes[i : i + size] for i in range(0, len(purposes), size)]
    return [[*sorted(turn[:-ordered]), *turn[-ordered:]] for turn in turns]


def assert_turns(
    bursts: list[Burst], names: Mapping[str, str], expected: list[str], ordered: int = 2
) -> None:
    """Every round trip has a known purpose, the feed wrote nothing, and each turn made
    exactly `expected`, in that order (its last `ordered` ones after the reads)."""
    assert [b.label for b in bursts if purpose(b, names) == b.label] == []
    assert feed_writes(bursts, names) == 0, [b.label for b in bursts]
    statuses = sum(purpose(burst, names) == "run.status" for burst in bursts)
    assert statuses == STATUS_WRITES_PER_TURN * TURNS, [b.label for b in bursts]
    turns = own(bursts, names)
    assert len(turns) == len(expected) * TURNS, [b.label for b in turns]
    assert per_turn(turns, names, len(expected), ordered) == [expected] * TURNS


async def start(kind: str, workspace: Path, env: dict[str, str]) -> ServerProcess:
    workspace.mkdir()
    server = ServerProcess(kind, workspace, workspace.parent / f"{kind}.log", env)
    return await asyncio.to_thread(server.start)


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        (None, ["owner+lock+status+history.load", "history.append+run.status", "unlock"]),
        (
            "alice",
            [
                "facts.newest",
                "owner+lock+status+history.load",
                "history.append+run.status",
                "unlock",
            ],
        ),
    ],
)
async def test_a_postgres_turn_makes_one_round_trip_per_step(
    tmp_path: Path, user: str | None, expected: list[str]
) -> None:
    url = await asyncio.to_thread(create_database)
    try:
        async with WireCounter("127.0.0.1", 5432) as proxy:
            through = url.replace(":5432/", f":{proxy.port}/")
            env = {"ATMOSPHERE_POSTGRES_URL": through, "ATMOSPHERE_DURABLE_RUNS_ENABLED": "false"}
            server = await start("postgres", tmp_path / "workspace", env)
            try:
                bursts = await turns_on_the_wire(
                    proxy, server, "/atmosphere/agent/assistant", user, len(expected)
                )
            finally:
                server.kill()
    finally:
        await asyncio.to_thread(drop_database, url)
    assert_turns(bursts, POSTGRES_PURPOSES, expected)


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        (None, ["owner+lock+status+history.load", "history.append+unlock+run.status"]),
        (
            "alice",
            [
                "facts.newest",
                "owner+lock+status+history.load",
                "history.append+unlock+run.status",
            ],
        ),
    ],
)
async def test_a_redis_turn_makes_one_round_trip_per_step(
    tmp_path: Path, user: str | None, expected: list[str]
) -> None:
    require_redis()
    prefix = new_prefix()
    try:
        async with WireCounter("127.0.0.1", 6379, redis_scripts=redis_scripts()) as proxy:
            through = redis_url_for(prefix, port=proxy.port)
            env = {
                "ATMOSPHERE_REDIS_URL": through,
                "ATMOSPHERE_DURABLE_RUNS_ENABLED": "false",
                "ATMOSPHERE_AI_HARNESS_ENABLED": "true",
            }
            server = await start("redis", tmp_path / "workspace", env)
            try:
                bursts = await turns_on_the_wire(
                    proxy, server, "/atmosphere/agent/scribe", user, len(expected)
                )
            finally:
                server.kill()
    finally:
        await asyncio.to_thread(delete_prefix, prefix)
    # The turn rides on the lock's release with the run's end: one script, after the reads.
    assert_turns(bursts, REDIS_PURPOSES, expected, ordered=1)


async def test_a_new_postgres_connection_never_asks_the_server_about_types() -> None:
    """asyncpg asks the server about a parameter type it has no built-in codec for (an
    `integer[]` or `bytea[]`) once per connection, in three extra round trips: each new pool
    connection paid them on its first history append or frame-feed write, inside a turn. The
    hot statements send `text[]` instead; here every one of them runs on fresh connections."""
    from atmosphere_harness._backends.postgres import PostgresDatabase, PostgresRunStore
    from atmosphere_harness._backends.postgres.history import PostgresHistory
    from atmosphere_harness._contracts import FEED_OWNER, StoredRun
    from atmosphere_harness._memory.history import ConversationKey
    from atmosphere_harness._runtimes.base import Message

    url = await asyncio.to_thread(create_database)
    key = ConversationKey("/p", "ann", "c1")
    said = [Message("user", "naïve café ✓"), Message("assistant", "lone \udc00 surrogate")]
    frames = [(1, "text", '{"text":"a"}'), (2, "text", '{"text":"b"}')]
    try:
        async with WireCounter("127.0.0.1", 5432) as proxy:
            database = PostgresDatabase(url.replace(":5432/", f":{proxy.port}/"), pool_max=1)
            await database.open()
            try:
                history, runs = PostgresHistory(database), PostgresRunStore(database)
                await history.append(key, said)
                loaded = await history.messages(key)
                durable = StoredRun("run-d", "/p", "c1", "ann", "s", "hi", 1.0)
                await runs.append("run-d", frames, [("k", "1")], create=durable, owner="me")
                await runs.append("run-d", [(3, "complete", "{}")], [], owner="me")
                fed = StoredRun("run-f", "/p", "c1", "ann", "s", "hi", 1.0)
                feed = f"{FEED_OWNER}me"
                await runs.append("run-f", frames, [], create=fed, owner=feed, lease_seconds=15)
                await runs.append("run-f", [(3, "complete", "{}")], [], owner=feed)
                replayed, _ = await runs.frames_after("run-f", 0, 10)
            finally:
                await database.aclose()
    finally:
        await asyncio.to_thread(drop_database, url)
    asked = [b.label for b in proxy.bursts(include_setup=True) if "typeinfo" in b.label]
    assert asked == []
    assert [(m.role, m.content) for m in loaded] == [(m.role, m.content) for m in said]
    assert [(f.seq, f.event) for f in replayed] == [(1, "text"), (2, "text"), (3, "complete")]


async def test_history_payloads_keep_any_character_in_a_database_of_any_encoding() -> None:
    """History payloads travel as text (see the test above) and PostgreSQL stores them as
    UTF-8 bytes with `convert_to`: they are ASCII JSON, so a LATIN1 database (which has no
    emoji, no CJK) stores and returns them exactly, as the `bytea[]` payloads did."""
    from atmosphere_harness._backends.postgres import PostgresDatabase
    from atmosphere_harness._backends.postgres.history import PostgresHistory
    from atmosphere_harness._memory.history import ConversationKey
    from atmosphere_harness._runtimes.base import Message

    url = await asyncio.to_thread(
        create_database, "ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    )
    key = ConversationKey("/p", "ann", "c1")
    said = [Message("user", "emoji 🙂, 漢字, naïve"), Message("assistant", "lone \udc00 surrogate")]
    try:
        database = PostgresDatabase(url)
        await database.open()
        try:
            history = PostgresHistory(database)
            await history.append(key, said)
            loaded = await history.messages(key)
        finally:
            await database.aclose()
    finally:
        await asyncio.to_thread(drop_database, url)
    assert [(m.role, m.content) for m in loaded] == [(m.role, m.content) for m in said]
