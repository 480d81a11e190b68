"""Two real uvicorn processes on one Redis (and one workspace root): every row of DESIGN 8.1 that
the Redis backend carries, over real HTTP, from one replica to the other; a SIGKILL of one
replica in the middle of a load; a Redis restart in the middle of a load; and a start-up with an
unreachable URL. The app is `tests.scaleout.redis_app` (kind `redis` of the reliability
server)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis

from atmosphere_harness._backends.redis.connection import digest
from tests.reliability.driver import StreamBroken, stream_frames
from tests.reliability.server import ServerProcess
from tests.scaleout.redis_app import OWNER, PATH
from tests.scaleout.redis_service import (
    HOST,
    PORT,
    TEST_DB,
    PrivateRedis,
    delete_prefix,
    new_prefix,
    require_redis,
    url_for,
)

pytestmark = pytest.mark.services

ADMIN_TOKEN = "scaleout-admin-token"
WAIT = 60.0
"""Hang guard for anything that must happen (never a speed expectation)."""


@dataclass
class Pair:
    a: ServerProcess
    b: ServerProcess
    prefix: str

    @property
    def both(self) -> list[ServerProcess]:
        return [self.a, self.b]


def _start_pair(workspace: Path, logs: Path, url: str, prefix: str) -> Pair:
    env = {
        "ATMOSPHERE_REDIS_URL": url,
        "ATMOSPHERE_AI_HARNESS_ENABLED": "true",
        "ATMOSPHERE_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    a = ServerProcess("redis", workspace, logs / "a.log", env).start()
    try:
        b = ServerProcess("redis", workspace, logs / "b.log", env).start()
    except BaseException:
        a.kill()
        raise
    return Pair(a, b, prefix)


def _stop(pair: Pair) -> None:
    for server in pair.both:
        if server.process is not None and server.process.poll() is None:
            server.stop()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two replicas for the whole module, under one key prefix (deleted at the end)."""
    require_redis()
    prefix = new_prefix()
    root = tmp_path_factory.mktemp("redis-replicas")
    started = _start_pair(root / "workspace", root, url_for(prefix), prefix)
    try:
        yield started
    finally:
        _stop(started)
        delete_prefix(prefix)


@contextlib.asynccontextmanager
async def clients(pair: Pair) -> AsyncIterator[tuple[httpx2.AsyncClient, httpx2.AsyncClient]]:
    async with (
        httpx2.AsyncClient(base_url=pair.a.url, timeout=WAIT) as a,
        httpx2.AsyncClient(base_url=pair.b.url, timeout=WAIT) as b,
    ):
        yield a, b


def user(name: str) -> dict[str, str]:
    return {"X-User-Id": name}


async def say(
    client: httpx2.AsyncClient, message: str, conversation: str, who: str = "u"
) -> list[dict[str, Any]]:
    return await stream_frames(client, PATH, message, conversation, headers=user(who))


def answer(frames: list[dict[str, Any]]) -> str:
    assert frames[-1]["event"] == "complete", frames[-1]
    return str(frames[-1]["data"]["summary"])


class SseReader:
    """The events of one SSE response, as `(event, id, data)`, read as they arrive."""

    def __init__(self, response: httpx2.Response) -> None:
        self._lines = response.aiter_lines()

    async def next(self) -> tuple[str, str | None, dict[str, Any]]:
        fields: dict[str, str] = {}
        while True:
            line = await asyncio.wait_for(anext(self._lines), WAIT)
            if line == "":
                if "data" in fields:
                    return fields.get("event", ""), fields.get("id"), json.loads(fields["data"])
                fields.clear()
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


@contextlib.asynccontextmanager
async def plan_viewer(
    client: httpx2.AsyncClient, conversation: str, last_event_id: str | None = None
) -> AsyncIterator[SseReader]:
    headers = {"X-User-Id": "u"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    async with client.stream(
        "GET", f"{PATH}/plan/events", params={"conversationId": conversation}, headers=headers
    ) as response:
        assert response.status_code == 200
        yield SseReader(response)


# --- the rows of DESIGN 8.1 -------------------------------------------------------------------


async def test_both_replicas_report_redis(pair: Pair) -> None:
    async with clients(pair) as (a, b):
        for client in (a, b):
            info = (await client.get("/api/console/info")).json()
            assert info["backends"] == {"state": "redis", "events": "redis", "workspace": "files"}
            assert "ACTIVE(atmosphere_harness._backends.redis.long_term.RedisLongTermMemory)" in (
                json.dumps(info)
            )


async def test_a_plan_written_through_a_streams_to_b_and_resumes_there(pair: Pair) -> None:
    async with clients(pair) as (a, b):
        # Only a prompt starts a conversation: a viewer of an unused id would get 404.
        assert answer(await say(a, "hello", "plan-1")) == "seen: hello"
        async with plan_viewer(b, "plan-1") as viewer:
            event, _snapshot_id, data = await viewer.next()
            assert event == "plan-snapshot"
            assert data["steps"] == []
            assert answer(await say(a, "plan alpha", "plan-1")) == "planned alpha"
            event, alpha_id, data = await viewer.next()
            assert (event, data["goal"]) == ("plan-update", "alpha")
        assert answer(await say(a, "plan beta", "plan-1")) == "planned beta"
        for client in (b, a):  # the id from B resumes on either replica
            async with plan_viewer(client, "plan-1", last_event_id=alpha_id) as resumed:
                event, beta_id, data = await resumed.next()
                assert (event, data["goal"]) == ("plan-update", "beta")
                assert beta_id != alpha_id
        admin = await b.get(
            f"/api/admin/agents/{OWNER}/plan",
            params={"conversationId": "plan-1"},
            headers={"X-Atmosphere-Auth": ADMIN_TOKEN},
        )
        assert admin.status_code == 200, admin.text
        assert admin.json()["goal"] == "beta", "admin REST on B reads the plan A wrote"


async def test_turn_two_on_b_sees_turn_one_from_a(pair: Pair) -> None:
    async with clients(pair) as (a, b):
        assert answer(await say(a, "hello", "history-1")) == "seen: hello"
        assert answer(await say(b, "again", "history-1")) == "seen: hello | again"
        assert answer(await say(a, "third", "history-1")) == "seen: hello | again | third"
        other = await b.post(
            PATH, json={"message": "other user", "conversationId": "history-1"}, headers=user("v")
        )
        assert other.status_code == 404, "the conversation is u's"


async def test_an_approval_raised_on_a_is_answered_on_b_and_the_run_on_a_continues(
    pair: Pair,
) -> None:
    async with clients(pair) as (a, b):
        asked: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        def on_frame(frame: dict[str, Any]) -> None:
            if frame["event"] == "approval-required" and not asked.done():
                asked.set_result(frame["data"])

        run = asyncio.create_task(
            stream_frames(a, PATH, "transfer 5", "approve-1", user("u"), on_frame)
        )
        data = await asyncio.wait_for(asked, WAIT)
        listed = await b.get(
            f"{PATH}/approvals", params={"conversationId": "approve-1"}, headers=user("u")
        )
        assert [x["approvalId"] for x in listed.json()["approvals"]] == [data["approvalId"]]
        wrong = await b.post(
            f"{PATH}/approvals/{data['approvalId']}", json={"approve": True}, headers=user("x")
        )
        assert wrong.status_code == 404, "another user's approval is not disclosed"
        answered = await b.post(
            f"{PATH}/approvals/{data['approvalId']}",
            json={"approve": True, "arguments": {"amount": 7, "to": "carol"}},
            headers=user("u"),
        )
        assert answered.status_code == 200, answered.text
        assert answer(await asyncio.wait_for(run, WAIT)) == "sent 7 to carol"
        again = await a.post(
            f"{PATH}/approvals/{data['approvalId']}", json={"approve": False}, headers=user("u")
        )
        assert again.status_code == 409


async def _facts(client: httpx2.AsyncClient, who: str, expected: int) -> list[str]:
    """The facts a new conversation of `who` recalls, once extraction stored `expected`."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        conversation = f"recall-{random.randrange(10**9)}"
        text = answer(await say(client, "facts", conversation, who=who))
        facts = [f for f in text.removeprefix("facts:").split(" | ") if f.strip()]
        if len(facts) >= expected or asyncio.get_running_loop().time() > deadline:
            return [f.strip() for f in facts]
        await asyncio.sleep(0.2)


async def test_facts_extracted_when_a_closes_are_recalled_on_b(pair: Pair) -> None:
    async with clients(pair) as (a, b):
        await say(a, "remember plays the cello", "facts-1", who="fact-user")
        closed = await a.post(f"{PATH}/conversations/facts-1/close", headers=user("fact-user"))
        assert closed.status_code == 200, closed.text
        assert await _facts(b, "fact-user", 1) == ["plays the cello"]


async def test_one_conversation_closed_on_both_replicas_stores_each_fact_once(pair: Pair) -> None:
    who = "double-close"
    async with clients(pair) as (a, b):
        await say(a, "remember drinks tea", "close-1", who=who)
        await say(b, "remember likes rain", "close-1", who=who)
        closes = await asyncio.gather(
            a.post(f"{PATH}/conversations/close-1/close", headers=user(who)),
            b.post(f"{PATH}/conversations/close-1/close", headers=user(who)),
        )
        assert [r.status_code for r in closes] == [200, 200]
        facts = await _facts(a, who, 2)
        assert sorted(facts) == ["drinks tea", "likes rain"]
        await asyncio.sleep(1.0)  # a second extraction, if any, would land meanwhile
    assert _stored_facts(pair.prefix, who) == 2, "each fact stored once"


def _stored_facts(prefix: str, who: str) -> int:
    """The facts Redis holds for user `who` (`RedisLongTermMemory`'s keys)."""
    client = redis.Redis(host=HOST, port=PORT, db=TEST_DB, decode_responses=True)
    try:
        return int(client.hlen(f"{prefix}ltm:{digest(who)}:text"))
    finally:
        client.close()


async def test_two_first_turns_of_one_conversation_on_two_replicas_take_turns(
    pair: Pair,
) -> None:
    async with clients(pair) as (a, b):
        first, second = await asyncio.gather(
            say(a, "slow 300 from a", "lock-1"), say(b, "slow 300 from b", "lock-1")
        )
    answers = sorted([answer(first), answer(second)], key=len)
    assert answers[0] in ("seen: slow 300 from a", "seen: slow 300 from b")
    assert answers[1] in (
        "seen: slow 300 from a | slow 300 from b",
        "seen: slow 300 from b | slow 300 from a",
    ), "the second turn ran after the first, on the other replica"


# --- failures -------------------------------------------------------------------------------------


@dataclass
class Ledger:
    """What each conversation of a load saw acknowledged (a `complete` frame)."""

    acked: dict[str, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    broken: int = 0
    statuses: list[int] = field(default_factory=list)


async def _converse(
    clients_: list[httpx2.AsyncClient], cid: str, turns: int, ledger: Ledger
) -> None:
    for number in range(1, turns + 1):
        message = f"{cid} turn {number}"
        for attempt in range(len(clients_) * 2):
            client = clients_[(number + attempt) % len(clients_)]
            try:
                frames = await stream_frames(client, PATH, message, cid, headers=user("load"))
            except (StreamBroken, httpx2.TransportError):
                ledger.broken += 1
                continue
            except AssertionError as exc:  # a non-200 answer
                ledger.statuses.append(int(str(exc).split(":")[0]))
                continue
            if frames[-1]["event"] == "complete":
                ledger.acked.setdefault(cid, []).append(message)
                break
            ledger.errors.append(str(frames[-1]["data"].get("message")))


async def _check_histories(client: httpx2.AsyncClient, ledger: Ledger) -> None:
    """Every acknowledged turn is in its conversation's history, in order (a turn that ran but
    whose answer never arrived may be there too)."""
    for cid, acked in ledger.acked.items():
        text = answer(await say(client, "check", cid, who="load"))
        seen = text.removeprefix("seen: ").split(" | ")
        assert seen[-1] == "check"
        stored = [m for m in seen[:-1] if m != "check"]
        positions = [stored.index(m) for m in acked]
        assert positions == sorted(positions), f"{cid}: out of order: {stored}"
        numbers = [int(m.rsplit(" ", 1)[1]) for m in stored]
        assert numbers == sorted(numbers), f"{cid}: out of order: {stored}"


async def test_a_sigkilled_replica_loses_nothing_acknowledged(tmp_path: Path) -> None:
    require_redis()
    prefix = new_prefix()
    servers = _start_pair(tmp_path / "workspace", tmp_path, url_for(prefix), prefix)
    ledger = Ledger()
    try:
        async with clients(servers) as (a, b):
            load = asyncio.gather(*(_converse([a, b], f"kill-{n}", 3, ledger) for n in range(100)))
            while sum(len(turns) for turns in ledger.acked.values()) < 60:
                await asyncio.sleep(0.02)
            servers.a.kill()
            await asyncio.wait_for(load, 300)
            assert ledger.statuses == [] or set(ledger.statuses) <= {503}, ledger.statuses
            assert sum(len(t) for t in ledger.acked.values()) == 300, "B served every turn"
            await _check_histories(b, ledger)
            info = await b.get("/api/console/info")
            assert info.status_code == 200
    finally:
        _stop(servers)
        delete_prefix(prefix)


async def test_a_redis_restart_mid_load_ends_runs_cleanly_and_the_replicas_recover(
    tmp_path: Path,
) -> None:
    redis_server = PrivateRedis(tmp_path).start()
    servers = _start_pair(tmp_path / "workspace", tmp_path, redis_server.url("r:"), "r:")
    ledger = Ledger()
    try:
        async with clients(servers) as (a, b):
            load = asyncio.gather(*(_converse([a, b], f"outage-{n}", 4, ledger) for n in range(60)))
            while sum(len(turns) for turns in ledger.acked.values()) < 40:
                await asyncio.sleep(0.02)
            redis_server.stop()
            await asyncio.sleep(1.0)
            redis_server.start()
            await asyncio.wait_for(load, 300)
            # The outage was felt: runs ended with an error frame, or prompts were refused with
            # 503 before their stream (the conversation's owner is read from Redis first).
            assert ledger.errors or ledger.statuses, "the outage was felt"
            assert ledger.broken == 0, "every stream ended with a frame, none was cut"
            assert all("Redis" in error for error in ledger.errors), ledger.errors
            assert set(ledger.statuses) <= {503}, ledger.statuses
            # After the outage: every replica serves every route again, no 5xx.
            for client in (a, b):
                assert answer(await say(client, "after", "after-outage", who="load")).startswith(
                    "seen:"
                )
                assert (await client.get("/api/console/info")).status_code == 200
            await _check_histories(a, ledger)
    finally:
        _stop(servers)
        redis_server.stop()


def test_an_unreachable_url_fails_start_up_naming_the_variable_not_the_password(
    tmp_path: Path,
) -> None:
    env = {"ATMOSPHERE_REDIS_URL": "redis://admin:pa55-w0rd-x@127.0.0.1:1/0"}
    server = ServerProcess("redis", tmp_path / "workspace", tmp_path / "bad.log", env)
    with pytest.raises(RuntimeError) as caught:
        server.start()
    log = (tmp_path / "bad.log").read_text()
    assert "ATMOSPHERE_REDIS_URL" in log
    assert "pa55-w0rd-x" not in log
    assert "pa55-w0rd-x" not in str(caught.value)
