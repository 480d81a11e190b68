"""Two replicas on PostgreSQL, alone and with Redis beside it for the live fan-out, over real
HTTP: every row of DESIGN 8.1 "What N replicas ... must do", any replica to any other.

Both servers are real uvicorn processes (`tests.reliability.server`, app kind `postgres`: the
personal-assistant sample on `postgres_model`), on one workspace root and one fresh database.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import asyncpg
import httpx2
import pytest

from tests.reliability.server import ServerProcess

from .postgres_service import create_database, drop_database
from .redis_service import delete_prefix, new_prefix, require_redis
from .redis_service import url_for as redis_url_for
from .replicas import ADMIN_TOKEN, PATH, USER, prompt, read_sse, summary, two_replicas

pytestmark = pytest.mark.services

ADMIN = {"X-Atmosphere-Auth": ADMIN_TOKEN}


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    url = create_database()
    try:
        yield url
    finally:
        drop_database(url)


@pytest.fixture(scope="module", params=["postgres", "postgres+redis"])
def servers(
    request: pytest.FixtureRequest, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Both replicas on one database; with `postgres+redis`, plan updates go through Redis."""
    base = tmp_path_factory.mktemp("replicas")
    workspace = base / "workspace"
    workspace.mkdir()
    env = {"ATMOSPHERE_POSTGRES_URL": database_url}
    prefix = None
    if request.param == "postgres+redis":
        require_redis()
        prefix = new_prefix()
        env["ATMOSPHERE_REDIS_URL"] = redis_url_for(prefix)
    try:
        with two_replicas("postgres", workspace, base, env) as pair:
            yield pair
    finally:
        if prefix is not None:
            delete_prefix(prefix)


def cid() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


async def test_console_info_names_the_backend_and_the_store(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    for server in servers:
        info = httpx2.get(server.url + "/api/console/info").json()
        redis = "ATMOSPHERE_REDIS_URL" in server.env
        assert info["backends"] == {
            "state": "postgres",
            "events": "redis" if redis else "postgres",
            "workspace": "files",
        }
        assert info["harness"]["long-term-memory"] == (
            "ACTIVE(atmosphere_harness._backends.postgres.PostgresLongTermMemory)"
        )


async def test_a_plan_written_on_a_streams_to_a_viewer_on_b_and_resumes_there(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    conversation = cid()
    events_url = f"{PATH}/plan/events?conversationId={conversation}"
    async with (
        httpx2.AsyncClient(base_url=b.url, timeout=30) as viewer,
        httpx2.AsyncClient(timeout=30) as writer,
    ):
        # Only a prompt starts a conversation: a viewer of an unused id would get 404.
        assert summary(await prompt(writer, a.url, "first words", conversation)) == "ok"
        started = asyncio.Event()
        watching = asyncio.create_task(
            read_sse(
                viewer,
                events_url,
                headers=USER,
                started=started,
                until=lambda seen: sum(e.event == "plan-update" for e in seen) >= 2,
            )
        )
        await asyncio.wait_for(started.wait(), 30)
        assert summary(await prompt(writer, a.url, "plan: one|two", conversation)) == "planned"
        assert summary(await prompt(writer, a.url, "plan: three", conversation)) == "planned"
        seen = await watching
        updates = [e for e in seen if e.event == "plan-update"]
        assert [[s["content"] for s in e.data["steps"]] for e in updates] == [
            ["one", "two"],
            ["three"],
        ]
        # A viewer that dropped after the first update resumes on A by Last-Event-ID: it gets
        # exactly the second update, no snapshot.
        first_id = updates[0].id
        assert first_id is not None
        async with httpx2.AsyncClient(base_url=a.url, timeout=30) as other:
            resumed = await read_sse(
                other,
                events_url,
                headers={**USER, "Last-Event-ID": first_id},
                until=lambda got: any(e.event == "plan-update" for e in got),
            )
        assert [e.event for e in resumed] == ["plan-update"]
        assert resumed[0].id == updates[1].id
        # Admin REST on B reads the plan A wrote.
        plan = httpx2.get(
            f"{b.url}/api/admin/agents/assistant/plan",
            params={"conversationId": conversation},
            headers=ADMIN,
        )
        assert plan.status_code == 200, plan.text
        assert [step["content"] for step in plan.json()["steps"]] == ["three"]


async def test_turn_two_on_b_sees_turn_one_from_a(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    conversation = cid()
    async with httpx2.AsyncClient(timeout=30) as client:
        assert summary(await prompt(client, a.url, "first words", conversation)) == "ok"
        assert summary(await prompt(client, b.url, "history?", conversation)) == (
            "seen: first words"
        )
        assert summary(await prompt(client, a.url, "history?", conversation)) == (
            "seen: first words | history?"
        )
        # Another user cannot reach it: 404 on any replica.
        other = await client.post(
            b.url + PATH,
            json={"message": "history?", "conversationId": conversation},
            headers={"X-User-Id": "eve"},
        )
        assert other.status_code == 404


async def test_an_approval_raised_on_a_is_answered_on_b_and_the_run_on_a_continues(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    conversation = cid()
    async with httpx2.AsyncClient(timeout=30) as client:
        answered: list[int] = []

        async def on_frame(frame: dict[str, object]) -> None:
            if frame["event"] != "approval-required":
                return
            data = frame["data"]
            assert isinstance(data, dict)
            listed = await client.get(
                f"{b.url}{PATH}/approvals", params={"conversationId": conversation}, headers=USER
            )
            assert listed.status_code == 200, listed.text
            assert data["approvalId"] in listed.text
            response = await client.post(
                f"{b.url}{PATH}/approvals/{data['approvalId']}",
                json={"approve": True},
                headers=USER,
            )
            answered.append(response.status_code)
            again = await client.post(
                f"{a.url}{PATH}/approvals/{data['approvalId']}",
                json={"approve": False},
                headers=USER,
            )
            answered.append(again.status_code)

        frames = await prompt(client, a.url, "approve: doc", conversation, on_frame=on_frame)
    assert answered == [200, 409]
    assert summary(frames) == "result: Wrote approved/doc.md"


async def test_facts_extracted_when_a_closes_are_recalled_on_b(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    user = {"X-User-Id": f"u-{uuid.uuid4().hex[:8]}"}
    conversation = cid()
    async with httpx2.AsyncClient(timeout=30) as client:
        await prompt(client, a.url, "remember: likes green tea", conversation, headers=user)
        closed = await client.post(
            f"{a.url}{PATH}/conversations/{conversation}/close", headers=user
        )
        assert closed.status_code == 200
        for _ in range(100):  # extraction runs in A's background
            frames = await prompt(client, b.url, "recall?", cid(), headers=user)
            if "likes green tea" in summary(frames):
                break
            await asyncio.sleep(0.1)
        assert "likes green tea" in summary(frames)


async def test_a_conversation_closed_on_both_replicas_at_once_stores_each_fact_once(
    servers: tuple[ServerProcess, ServerProcess], database_url: str
) -> None:
    a, b = servers
    user_id = f"u-{uuid.uuid4().hex[:8]}"
    user = {"X-User-Id": user_id}
    conversation = cid()
    async with httpx2.AsyncClient(timeout=30) as client:
        await prompt(client, a.url, "remember: owns a red bike", conversation, headers=user)
        await prompt(client, b.url, "remember: plays chess", conversation, headers=user)
        closes = await asyncio.gather(
            *(
                client.post(f"{server.url}{PATH}/conversations/{conversation}/close", headers=user)
                for server in (a, b, a, b)
            )
        )
        assert [response.status_code for response in closes] == [200] * 4
    connection = await asyncpg.connect(database_url)
    try:
        for _ in range(100):
            rows = await connection.fetch(
                "SELECT fact FROM atmosphere_facts WHERE user_id = $1 ORDER BY id", user_id
            )
            if len(rows) >= 2:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # let the other replica's extraction finish too
        rows = await connection.fetch(
            "SELECT fact FROM atmosphere_facts WHERE user_id = $1 ORDER BY id", user_id
        )
    finally:
        await connection.close()
    assert sorted(row["fact"] for row in rows) == ["owns a red bike", "plays chess"]


async def test_two_concurrent_first_turns_on_two_replicas_are_serialized(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    conversation = cid()
    async with httpx2.AsyncClient(timeout=30) as client:
        results = await asyncio.gather(
            prompt(client, a.url, "slow 0.5", conversation),
            prompt(client, b.url, "slow 0.5", conversation),
        )
        assert sorted(summary(frames) for frames in results) == ["before me: 0", "before me: 1"]
        history = summary(await prompt(client, a.url, "history?", conversation))
    assert history == "seen: slow 0.5 | slow 0.5"
