"""Faults with two replicas on PostgreSQL: a bad URL, a replica SIGKILLed mid-load, and every
PostgreSQL connection terminated mid-load.

The load is the reliability suite's (`tests.reliability.workload`: three turns per conversation
that plan, write, read, grep and list, and probe every bound), split between replicas A and B
on one workspace root and one database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx2
import pytest

from atmosphere_harness._memory import codec
from tests.reliability import workload
from tests.reliability.apps import PATH
from tests.reliability.driver import (
    Conversation,
    StreamBroken,
    conversations,
    http_client,
    run_load,
)
from tests.reliability.server import ServerProcess
from tests.reliability.test_load import server_env
from tests.reliability.verify import read_back

from .postgres_service import create_database, drop_database, terminate_backends
from .replicas import USER, prompt, summary, two_replicas

pytestmark = pytest.mark.services

CONVERSATIONS = 100
CONCURRENCY = 50
"""Per replica."""
ACKS_PER_CONVERSATION = 4 * workload.TURNS + 1


@pytest.fixture
def database_url() -> Iterator[str]:
    url = create_database()
    try:
        yield url
    finally:
        drop_database(url)


def test_a_set_but_unreachable_url_fails_start_up_naming_the_variable(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    log = tmp_path / "server.log"
    server = ServerProcess(
        "postgres",
        workspace,
        log,
        {"ATMOSPHERE_POSTGRES_URL": "postgresql://atmo:hunter2-secret@127.0.0.1:1/db"},
    )
    with pytest.raises(RuntimeError, match=r"never became ready|did not start"):
        server.start()
    text = log.read_text(encoding="utf-8")
    assert "ATMOSPHERE_POSTGRES_URL is set but PostgreSQL at" in text
    assert "postgresql://atmo:***@127.0.0.1:1/db" in text
    assert "hunter2-secret" not in text


async def stored_user_turns(url: str, conversation: Conversation) -> list[str]:
    """The user messages of one conversation's history, in stored order."""
    connection = await asyncpg.connect(url)
    try:
        rows = await connection.fetch(
            "SELECT m.payload FROM atmosphere_messages AS m JOIN atmosphere_conversations AS c "
            "ON c.id = m.conversation WHERE c.endpoint = $1 AND c.user_key = $2 "
            "AND c.conversation_id = $3 ORDER BY m.seq",
            PATH,
            conversation.user,
            conversation.cid,
        )
    finally:
        await connection.close()
    messages = [codec.decode(codec.PLAIN, bytes(row["payload"])) for row in rows]
    return [message.content for message in messages if message.role == "user"]


def deduplicated(turns: list[str]) -> list[str]:
    """A turn stored just before a kill but never confirmed is sent again: once, in a row."""
    return [text for index, text in enumerate(turns) if index == 0 or turns[index - 1] != text]


async def stored_facts(url: str) -> dict[str, list[str]]:
    connection = await asyncpg.connect(url)
    try:
        rows = await connection.fetch("SELECT user_id, fact FROM atmosphere_facts ORDER BY id")
    finally:
        await connection.close()
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row["user_id"], []).append(row["fact"])
    return found


async def check_final_state(
    base_url: str,
    database_url: str,
    convs: list[Conversation],
    earlier: list[Conversation] = (),  # type: ignore[assignment]
) -> None:
    """Every conversation finished: plans, files and histories exactly as an unbroken run;
    every user's facts are unique and come from its own conversations (`earlier` included)."""
    async with http_client(base_url, 16) as client:
        seen = await read_back(client, [conv.cid for conv in convs])
    for conv in convs:
        plan, files = seen[conv.cid]
        steps, goal = workload.todos(conv.cid, workload.TURNS, done=True)
        assert plan is not None, conv.cid
        assert (plan["goal"], plan["steps"]) == (goal, steps)
        assert files == workload.expected_files(conv.cid), conv.cid
        history = deduplicated(await stored_user_turns(database_url, conv))
        assert history == [workload.message(turn) for turn in range(1, workload.TURNS + 1)]
    by_user: dict[str, set[str]] = {}
    for conv in [*convs, *earlier]:
        by_user.setdefault(conv.user, set()).add(workload.fact(conv.cid))
    for user, learned in (await stored_facts(database_url)).items():
        assert len(learned) == len(set(learned)), f"{user} has a fact twice"
        assert set(learned) <= by_user[user], f"{user} learned {set(learned) - by_user[user]}"


@pytest.mark.heavy
async def test_sigkill_of_one_replica_mid_load_loses_nothing_acknowledged(
    tmp_path: Path, database_url: str
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {**server_env(0), "ATMOSPHERE_POSTGRES_URL": database_url}
    convs = conversations(CONVERSATIONS, "kill")
    on_a, on_b = convs[::2], convs[1::2]
    with two_replicas("load", workspace, tmp_path, env) as (a, b):
        acks = 0
        kill_after = len(on_a) * ACKS_PER_CONVERSATION // 3

        def on_ack() -> None:
            nonlocal acks
            acks += 1
            if acks == kill_after:
                a.kill()

        failures_a, failures_b = await asyncio.gather(
            run_load(a.url, on_a, concurrency=CONCURRENCY, on_ack=on_ack),
            run_load(b.url, on_b, concurrency=CONCURRENCY),
        )
        # B kept serving: every one of its conversations finished, untouched by A's death.
        assert not failures_b, f"{failures_b[:3]}\n{b.log_tail()}"
        problems = [problem for conv in convs for problem in conv.problems]
        assert not problems, "\n".join(problems[:20])
        assert failures_a, "the kill cut no stream"
        assert all(isinstance(failure, StreamBroken) for failure in failures_a), failures_a[:3]
        interrupted = [conv for conv in on_a if conv.completed < conv.turns]
        assert interrupted
        # Nothing acknowledged is lost: every completed turn is stored, in order.
        for conv in on_a:
            stored = deduplicated(await stored_user_turns(database_url, conv))
            done = [workload.message(turn) for turn in range(1, conv.completed + 1)]
            assert stored[: len(done)] == done, f"{conv.cid}: {stored} lost a completed turn"
            assert len(stored) <= conv.sent, f"{conv.cid}: {stored} holds unsent turns"
        # The conversations cut off on A carry on on B, to exactly an unbroken run's state.
        failures = await run_load(b.url, interrupted, concurrency=CONCURRENCY)
        assert not failures, f"{failures[:3]}\n{b.log_tail()}"
        problems = [problem for conv in interrupted for problem in conv.problems]
        assert not problems, "\n".join(problems[:20])
        await check_final_state(b.url, database_url, convs)


@pytest.mark.heavy
async def test_postgres_connections_terminated_mid_load_end_runs_cleanly(
    tmp_path: Path, database_url: str
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {**server_env(0), "ATMOSPHERE_POSTGRES_URL": database_url}
    convs = conversations(CONVERSATIONS, "outage")
    on_a, on_b = convs[::2], convs[1::2]
    with two_replicas("load", workspace, tmp_path, env) as (a, b):
        acks = 0
        terminations: list[asyncio.Task[int]] = []
        marks = {CONVERSATIONS * ACKS_PER_CONVERSATION * share // 4 for share in (1, 2)}

        def on_ack() -> None:
            nonlocal acks
            acks += 1
            if acks in marks:
                terminations.append(asyncio.create_task(terminate_backends(database_url)))

        failures = await asyncio.gather(
            run_load(a.url, on_a, concurrency=CONCURRENCY, on_ack=on_ack),
            run_load(b.url, on_b, concurrency=CONCURRENCY, on_ack=on_ack),
        )
        killed = [await task for task in terminations]
        assert len(killed) == 2
        assert all(count > 0 for count in killed), "the outage hit live connections"
        # The servers stayed up: no stream was cut; a run either finished or ended with an
        # `error` frame naming the cause.
        assert failures == [[], []], f"{failures}\n{a.log_tail()}\n{b.log_tail()}"
        for conv in convs:
            for problem in conv.problems:
                assert "error frame" in problem or "ended with" in problem, problem
        # And afterwards everything works again, on both replicas.
        after = conversations(20, "after")
        failures = await asyncio.gather(
            run_load(a.url, after[::2], concurrency=10),
            run_load(b.url, after[1::2], concurrency=10),
        )
        assert failures == [[], []]
        problems = [problem for conv in after for problem in conv.problems]
        assert not problems, "\n".join(problems[:20])
        for server in (a, b):
            assert httpx2.get(server.url + "/api/console/info").status_code == 200
        await check_final_state(a.url, database_url, after, convs)


async def set_allow_connections(url: str, allowed: bool) -> None:
    name = url.rsplit("/", 1)[1]
    connection = await asyncpg.connect(url.rsplit("/", 1)[0] + "/test")
    try:
        await connection.execute(
            f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}'
        )
    finally:
        await connection.close()


async def test_an_outage_refuses_the_prompt_with_503_and_the_server_recovers(
    tmp_path: Path, database_url: str
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    server = ServerProcess(
        "postgres", workspace, tmp_path / "server.log", {"ATMOSPHERE_POSTGRES_URL": database_url}
    ).start()
    try:
        async with httpx2.AsyncClient(timeout=30) as client:
            assert summary(await prompt(client, server.url, "first", "c1")) == "ok"
            # PostgreSQL goes away for this database: open connections are cut, new ones refused.
            await set_allow_connections(database_url, False)
            await terminate_backends(database_url)
            # The conversation's owner is read before the stream starts: the prompt is refused
            # with 503 and nothing runs.
            refused = await client.post(
                server.url + PATH, json={"message": "during", "conversationId": "c1"}, headers=USER
            )
            assert refused.status_code == 503, refused.text
            message = refused.json()["error"]
            assert "PostgreSQL is unavailable" in message
            assert "ATMOSPHERE_POSTGRES_URL" in message
            info = await client.get(server.url + "/api/console/info")
            assert info.status_code == 200, "the server stays up"
            # It comes back: the next prompt works, on the history stored before the outage.
            await set_allow_connections(database_url, True)
            for _ in range(50):
                frames = await prompt(client, server.url, "history?", "c1")
                if frames[-1]["event"] == "complete":
                    break
                await asyncio.sleep(0.2)
            assert summary(frames) == "seen: first"
    finally:
        await set_allow_connections(database_url, True)
        server.kill()
