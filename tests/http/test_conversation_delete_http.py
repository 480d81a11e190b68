"""`DELETE P/conversations/{id}` over real HTTP on every backend (embedded SQLite and files,
PostgreSQL with its workspace rows, Redis): a conversation filled with everything a run leaves
(a history with tool pairs, a plan and its updates, a file, an answered approval, finished
durable runs with their frames, an `Idempotency-Key` prompt) is deleted, then each store is read
directly (every SQLite table, every PostgreSQL table, every Redis key and value, every file of
the workspace) and holds nothing of it, while another conversation of the same user is intact.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from atmosphere_harness import Harness, ModelRequest, ScriptedRuntime, ToolCall, agent, tool
from atmosphere_harness._memory.extraction import EXTRACTION_SYSTEM_PROMPT
from tests.agents import echo
from tests.support import make_app, parse_sse, serve

PATH = "/atmosphere/agent/keeper"
HEADER = "X-User"
ALICE = {HEADER: "alice"}
BOB = {HEADER: "bob"}


@tool(requires_approval=True)
async def transfer(amount: int, to: str) -> str:
    """Send money (needs a person's approval).

    Args:
        amount: How much.
        to: Who gets it.
    """
    return f"sent {amount} to {to}"


Keeper = echo(agent(name="keeper", harness=(Harness.ALL,)), "Keeper", tools=[transfer])


def model(request: ModelRequest) -> str | list[ToolCall]:
    """`plan`: `write_todos`; `file`: `write_file`; `pay`: the gated `transfer`; then an answer
    naming what the last user message said. An extraction request: each `remember <fact>` of
    the transcript is a fact."""
    if request.system_prompt == EXTRACTION_SYSTEM_PROMPT:
        text = "\n".join(m.content for m in request.messages)
        return json.dumps(re.findall(r"remember (\S+)", text))
    messages = list(request.messages)
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    text = messages[last_user].content
    if any(m.role == "tool" for m in messages[last_user:]):
        return f"done: {text}"
    if text.startswith("plan"):
        todos = [{"content": f"{text} step", "status": "pending"}]
        return [ToolCall("write_todos", {"todos": todos})]
    if text.startswith("file"):
        return [ToolCall("write_file", {"path": "notes.txt", "content": text})]
    if text.startswith("pay"):
        return [ToolCall("transfer", {"amount": 5, "to": "bob"})]
    return f"ok: {text}"


# --- the backends -----------------------------------------------------------------------------


class Store:
    """One backend: the app's settings, and a reader of everything it holds."""

    settings: dict[str, Any]

    async def holding(self, needle: str) -> list[str]:
        """Where the backend's own store holds `needle` (tables, keys; not the files)."""
        return []

    def close(self) -> None:
        return None


class Embedded(Store):
    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.settings = {}

    async def holding(self, needle: str) -> list[str]:
        found = []
        for database in self.workspace.rglob("*.db"):
            connection = sqlite3.connect(database)
            try:
                tables = [
                    row[0]
                    for row in connection.execute(
                        "SELECT name FROM sqlite_master WHERE type = 'table'"
                    )
                ]
                for table in tables:
                    for row in connection.execute(f'SELECT * FROM "{table}"'):
                        if needle in _text(row):
                            found.append(f"{database.name}:{table}: {row!r}"[:300])
            finally:
                connection.close()
        return found


class Postgres(Store):
    def __init__(self) -> None:
        from tests.scaleout.postgres_service import create_database

        self.url = create_database()
        self.settings = {"postgres_url": self.url, "workspace_backend": "postgres"}

    async def holding(self, needle: str) -> list[str]:
        import asyncpg

        connection = await asyncpg.connect(self.url)
        try:
            tables = await connection.fetch(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
            )
            found = []
            for table in tables:
                name = table["table_name"]
                for row in await connection.fetch(f'SELECT * FROM "{name}"'):
                    if needle in _text(tuple(row.values())):
                        found.append(f"{name}: {dict(row)!r}"[:300])
            return found
        finally:
            await connection.close()

    def close(self) -> None:
        from tests.scaleout.postgres_service import drop_database

        drop_database(self.url)


class Redis(Store):
    def __init__(self) -> None:
        from tests.scaleout.redis_service import new_prefix, require_redis, url_for

        require_redis()
        self.prefix = new_prefix()
        self.settings = {"redis_url": url_for(self.prefix)}

    async def holding(self, needle: str) -> list[str]:
        import redis

        from tests.scaleout.redis_service import HOST, PORT, TEST_DB

        client = redis.Redis(host=HOST, port=PORT, db=TEST_DB)
        found = []
        try:
            for key in client.scan_iter(match=self.prefix + "*", count=1000):
                kind = _text(client.type(key))
                value: Any
                if kind == "string":
                    value = client.get(key)
                elif kind == "hash":
                    value = client.hgetall(key)
                elif kind == "list":
                    value = client.lrange(key, 0, -1)
                elif kind == "set":
                    value = client.smembers(key)
                elif kind == "zset":
                    value = client.zrange(key, 0, -1, withscores=True)
                elif kind == "stream":
                    value = client.xrange(key)
                else:
                    value = kind
                if needle in _text((key, value)):
                    found.append(f"{key.decode()}: {value!r}"[:300])
        finally:
            client.close()
        return found

    def close(self) -> None:
        from tests.scaleout.redis_service import delete_prefix

        delete_prefix(self.prefix)


def _text(value: Any) -> str:
    """Every string and byte string in `value`, decoded and joined (a needle search)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return " ".join(_text(k) + " " + _text(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return " ".join(_text(item) for item in value)
    return str(value)


BACKENDS: dict[str, Callable[[Path], Store]] = {
    "embedded": Embedded,
    "postgres": lambda _workspace: Postgres(),
    "redis": lambda _workspace: Redis(),
}


@pytest.fixture(params=list(BACKENDS))
def store(request: pytest.FixtureRequest, workspace: Path) -> Any:
    if request.param != "embedded":
        request.applymarker(pytest.mark.services)
    made = BACKENDS[request.param](workspace)
    try:
        yield made
    finally:
        made.close()


@asynccontextmanager
async def keeper(
    workspace: Path, store: Store, **settings: Any
) -> AsyncIterator[httpx2.AsyncClient]:
    app = make_app(
        [Keeper],
        runtime=ScriptedRuntime(default=model),
        workspace=workspace,
        user_id_header=HEADER,
        durable_runs=True,
        **store.settings,
        **settings,
    )
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        yield client


# --- helpers ----------------------------------------------------------------------------------


async def post(
    client: httpx2.AsyncClient, message: str, conversation: str, who: Any, **headers: str
) -> list[dict[str, Any]]:
    body = {"message": message, "conversationId": conversation}
    response = await client.post(PATH, json=body, headers={**who, **headers})
    assert response.status_code == 200, response.text
    frames = parse_sse(response.text)
    assert frames[-1]["event"] == "complete", frames[-1]
    return frames


async def until(check: Callable[[], Any], guard: float = 30.0) -> Any:
    deadline = time.monotonic() + guard
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.05)


async def start_waiting_run(client: httpx2.AsyncClient, conversation: str, who: Any) -> str:
    """A background run whose tool waits for an approval (left unanswered: the run stays in
    flight); returns its run id."""
    started = await client.post(
        PATH,
        json={"message": "pay bob", "conversationId": conversation, "background": True},
        headers=who,
    )
    assert started.status_code == 202, started.text
    run_id: str = started.json()["runId"]
    return run_id


async def wait_for_approval(client: httpx2.AsyncClient, run_id: str, who: Any) -> None:
    async def waiting() -> bool:
        found = await client.get(f"{PATH}/runs/{run_id}", headers=who)
        return bool(found.json()["status"] == "waiting-approval")

    await until(waiting)


async def pay_and_approve(client: httpx2.AsyncClient, conversation: str, who: Any) -> str:
    """A background run whose tool waits for an approval, answered; returns its run id once
    it completed."""
    run_id = await start_waiting_run(client, conversation, who)

    async def asked() -> list[Any]:
        listed = await client.get(
            PATH + "/approvals", params={"conversationId": conversation}, headers=who
        )
        assert listed.status_code == 200, listed.text
        approvals: list[Any] = listed.json()["approvals"]
        return approvals

    approval = (await until(asked))[0]["approvalId"]
    answered = await client.post(
        f"{PATH}/approvals/{approval}", json={"approve": True}, headers=who
    )
    assert answered.status_code == 200, answered.text

    async def completed() -> bool:
        found = await client.get(f"{PATH}/runs/{run_id}", headers=who)
        return bool(found.json()["status"] == "completed")

    await until(completed)
    return run_id


async def fill(client: httpx2.AsyncClient, conversation: str, who: Any) -> str:
    """Everything a conversation can leave in the stores; returns a finished run's id."""
    await post(client, "plan the trip", conversation, who)
    await post(client, "file the notes", conversation, who)
    run_id = await pay_and_approve(client, conversation, who)
    await post(client, "hello again", conversation, who, **{"Idempotency-Key": "k-" + conversation})
    return run_id


def files_holding(workspace: Path, needle: str) -> list[str]:
    """Files of the workspace that name `needle` or hold it, but the SQLite files (read as
    tables) and the lock files a deleted conversation may leave (which hold a holder's token,
    nothing of the conversation)."""
    found = []
    for path in workspace.rglob("*"):
        if not path.is_file() or ".db" in path.name:
            continue
        data = path.read_bytes()
        named = needle in str(path)
        lock_file = path.name.startswith(".") and path.name.endswith((".lock", ".live"))
        if needle.encode() in data or (named and not lock_file):
            found.append(str(path.relative_to(workspace)))
    return found


# --- the tests --------------------------------------------------------------------------------


async def test_delete_leaves_nothing_of_the_conversation_in_any_store(
    workspace: Path, store: Store
) -> None:
    doomed = f"doomed-{uuid.uuid4().hex[:8]}"
    kept = f"kept-{uuid.uuid4().hex[:8]}"
    async with keeper(workspace, store) as client:
        run_id = await fill(client, doomed, ALICE)
        await fill(client, kept, ALICE)
        kept_messages = (
            await client.get(f"{PATH}/conversations/{kept}/messages?limit=100", headers=ALICE)
        ).json()
        assert await store.holding(doomed) or files_holding(workspace, doomed), "it was stored"

        assert (
            await client.delete(f"{PATH}/conversations/{doomed}", headers=BOB)
        ).status_code == 404
        assert (await client.delete(f"{PATH}/conversations/{doomed}")).status_code == 404
        assert (
            await client.get(f"{PATH}/conversations/{doomed}/messages", headers=ALICE)
        ).status_code == 200, "a refused delete changes nothing"

        deleted = await client.delete(f"{PATH}/conversations/{doomed}", headers=ALICE)
        assert deleted.status_code == 204, deleted.text
        assert deleted.content == b""

        assert await store.holding(doomed) == []
        assert files_holding(workspace, doomed) == []
        for route in (
            f"/conversations/{doomed}/messages",
            f"/conversations/{doomed}/events",
            f"/runs/{run_id}",
        ):
            assert (await client.get(PATH + route, headers=ALICE)).status_code == 404, route
        approvals = await client.get(
            PATH + "/approvals", params={"conversationId": doomed}, headers=ALICE
        )
        assert approvals.status_code == 404
        again = await client.delete(f"{PATH}/conversations/{doomed}", headers=ALICE)
        assert again.status_code == 404
        assert "error" in again.json()
        listed = (await client.get(PATH + "/conversations", headers=ALICE)).json()
        assert [row["conversationId"] for row in listed["conversations"]] == [kept]

        # The other conversation is whole.
        assert (
            await client.get(f"{PATH}/conversations/{kept}/messages?limit=100", headers=ALICE)
        ).json() == kept_messages
        assert await store.holding(kept) or files_holding(workspace, kept)

        # The id is unused again: anyone's prompt claims it afresh, and finds nothing.
        frames = await post(client, "hello", doomed, BOB)
        assert frames[-1]["event"] == "complete"
        fresh = (await client.get(f"{PATH}/conversations/{doomed}/messages", headers=BOB)).json()
        assert fresh["messages"] == [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "ok: hello"},
        ]


async def test_delete_answers_409_while_a_run_is_in_flight(workspace: Path, store: Store) -> None:
    conversation = f"busy-{uuid.uuid4().hex[:8]}"
    async with keeper(workspace, store) as client:
        await post(client, "hello", conversation, ALICE)
        run_id = await start_waiting_run(client, conversation, ALICE)
        await wait_for_approval(client, run_id, ALICE)
        refused = await client.delete(f"{PATH}/conversations/{conversation}", headers=ALICE)
        assert refused.status_code == 409, refused.text
        assert "in flight" in refused.json()["error"]
        history = await client.get(f"{PATH}/conversations/{conversation}/messages", headers=ALICE)
        assert history.status_code == 200
        assert history.json()["messages"][0] == {"role": "user", "content": "hello"}
        cancelled = await client.post(f"{PATH}/runs/{run_id}/cancel", headers=ALICE)
        assert cancelled.status_code == 202

        async def ended() -> bool:
            found = await client.get(f"{PATH}/runs/{run_id}", headers=ALICE)
            return bool(found.json()["status"] == "cancelled")

        await until(ended)
        deleted = await client.delete(f"{PATH}/conversations/{conversation}", headers=ALICE)
        assert deleted.status_code == 204, deleted.text
        assert await store.holding(conversation) == []


class PausedForget:
    """Every owners store's `forget` (the deletion's first step under the conversation's
    lock) made to pause: before it (`before` is set, until `go_on`), and, with `after`, once
    the owner is gone too (`after` is set, until `finish`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, pause_after: bool = False) -> None:
        from atmosphere_harness._backends import SqliteConversationOwners
        from atmosphere_harness._backends.postgres.owners import PostgresConversationOwners
        from atmosphere_harness._backends.redis.owners import RedisConversationOwners

        self.before, self.go_on = asyncio.Event(), asyncio.Event()
        self.after, self.finish = asyncio.Event(), asyncio.Event()
        paused = self
        for kind in (SqliteConversationOwners, PostgresConversationOwners, RedisConversationOwners):

            async def forget(
                self: Any,
                path: str,
                conversation_id: str,
                *,
                idle_before: float | None = None,
                original: Any = kind.forget,
            ) -> bool:
                paused.before.set()
                await paused.go_on.wait()
                dropped = bool(await original(self, path, conversation_id, idle_before=idle_before))
                if pause_after:
                    paused.after.set()
                    await paused.finish.wait()
                return dropped

            monkeypatch.setattr(kind, "forget", forget)


async def test_a_prompt_that_waited_while_its_conversation_was_deleted_claims_it_again(
    workspace: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt that arrives while `DELETE` holds the conversation (paused right before it
    forgets the owner) waits for the lock, then finds the id unused and claims it again as it
    takes the lock: it runs on the emptied conversation, which is its user's again (before,
    it ran with no owner left, and every route then answered 404 to its own user)."""
    paused = PausedForget(monkeypatch)
    conversation = f"raced-{uuid.uuid4().hex[:8]}"
    async with keeper(workspace, store) as client:
        await post(client, "hello", conversation, ALICE)
        deleting = asyncio.create_task(
            client.delete(f"{PATH}/conversations/{conversation}", headers=ALICE)
        )
        async with asyncio.timeout(30):  # (a hang guard)
            await paused.before.wait()
        body = {"message": "again", "conversationId": conversation}
        async with client.stream("POST", PATH, json=body, headers=ALICE) as response:
            assert response.status_code == 200
            paused.go_on.set()  # the deletion goes on while the prompt waits for the lock
            assert (await deleting).status_code == 204
            frames = parse_sse((await response.aread()).decode())
        assert frames[-1]["event"] == "complete", frames[-1]
        history = await client.get(f"{PATH}/conversations/{conversation}/messages", headers=ALICE)
        assert history.status_code == 200, history.text
        said = [m["content"] for m in history.json()["messages"]]
        assert said == ["again", "ok: again"]
        listed = await client.get(f"{PATH}/conversations", headers=ALICE)
        assert conversation in [c["conversationId"] for c in listed.json()["conversations"]]
        stranger = await client.post(PATH, json=body, headers=BOB)
        assert stranger.status_code == 404, stranger.text


async def test_a_waiting_prompt_whose_deleted_conversation_another_user_claimed_runs_nothing(
    workspace: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice's prompt waits while her conversation is deleted; once the owner is gone (the
    deletion paused there, still holding the lock) Bob's prompt claims the unused id. Alice's
    prompt then finds Bob's conversation as it takes the lock: its stream ends with a
    `ConversationTaken` error and it wrote nothing; Bob's prompt runs (before, Alice's prompt
    ran in Bob's conversation)."""
    paused = PausedForget(monkeypatch, pause_after=True)
    conversation = f"taken-{uuid.uuid4().hex[:8]}"
    async with keeper(workspace, store) as client:
        await post(client, "hello", conversation, ALICE)
        deleting = asyncio.create_task(
            client.delete(f"{PATH}/conversations/{conversation}", headers=ALICE)
        )
        async with asyncio.timeout(30):  # (a hang guard)
            await paused.before.wait()
        async with client.stream(
            "POST", PATH, json={"message": "mine", "conversationId": conversation}, headers=ALICE
        ) as alices:
            assert alices.status_code == 200
            paused.go_on.set()
            async with asyncio.timeout(30):
                await paused.after.wait()
            async with client.stream(
                "POST", PATH, json={"message": "ours", "conversationId": conversation}, headers=BOB
            ) as bobs:
                assert bobs.status_code == 200  # (the id was unused: Bob's prompt claimed it)
                paused.finish.set()
                assert (await deleting).status_code == 204
                refused = parse_sse((await alices.aread()).decode())
                answered = parse_sse((await bobs.aread()).decode())
        assert [f["event"] for f in refused] == ["error"], refused
        assert refused[0]["data"]["type"] == "ConversationTaken"
        assert answered[-1]["event"] == "complete", answered[-1]
        history = await client.get(f"{PATH}/conversations/{conversation}/messages", headers=BOB)
        assert [m["content"] for m in history.json()["messages"]] == ["ours", "ok: ours"]
        gone = await client.get(f"{PATH}/conversations/{conversation}/messages", headers=ALICE)
        assert gone.status_code == 404


# --- forgetting a user ------------------------------------------------------------------------

TOKEN = "forget-admin-token"
ADMIN = {"X-Atmosphere-Auth": TOKEN}


async def write_memories(workspace: Path, store: Store, user: str, text: str) -> None:
    """A file in the user's `/memories` (as Claude's memory tool leaves one)."""
    if isinstance(store, Postgres):
        import asyncpg

        connection = await asyncpg.connect(store.url)
        try:
            await connection.execute(
                "INSERT INTO atmosphere_files (store, path, content, size, updated_at) "
                "VALUES ($1, 'notes.md', $2, $3, 0)",
                f"memories:agents/keeper/{user}",
                text.encode(),
                len(text),
            )
        finally:
            await connection.close()
        return
    folder = workspace / "agents" / "keeper" / "memories" / user
    folder.mkdir(parents=True)
    (folder / "notes.md").write_text(text)


async def test_forgetting_a_user_deletes_their_conversations_facts_and_memories(
    workspace: Path, store: Store
) -> None:
    mine = [f"mine-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    theirs = f"theirs-{uuid.uuid4().hex[:8]}"
    fact = f"tea-{uuid.uuid4().hex[:8]}"
    async with keeper(workspace, store, admin_token=TOKEN) as client:
        await post(client, "plan the trip", mine[0], ALICE)
        await post(client, "file the notes", mine[0], ALICE)
        await post(client, f"remember {fact}", mine[1], ALICE)
        closed = await client.post(f"{PATH}/conversations/{mine[1]}/close", headers=ALICE)
        assert closed.status_code == 200, closed.text

        async def extracted() -> bool:
            return bool(await store.holding(fact))

        await until(extracted)
        await post(client, "remember coffee", theirs, BOB)
        await write_memories(workspace, store, "alice", f"alice's notes {fact}")

        busy = f"busy-{uuid.uuid4().hex[:8]}"
        run_id = await start_waiting_run(client, busy, ALICE)
        await wait_for_approval(client, run_id, ALICE)
        refused = await client.delete("/api/admin/users/alice", headers=ADMIN)
        assert refused.status_code == 409, refused.text
        assert busy in refused.json()["error"]
        assert (
            await client.get(f"{PATH}/conversations/{mine[0]}/messages", headers=ALICE)
        ).status_code == 200, "a refusal deletes nothing"
        await client.post(f"{PATH}/runs/{run_id}/cancel", headers=ALICE)

        async def ended() -> bool:
            found = await client.get(f"{PATH}/runs/{run_id}", headers=ALICE)
            return bool(found.json()["status"] == "cancelled")

        await until(ended)

        assert (await client.delete("/api/admin/users/alice")).status_code == 401
        wrong = await client.delete(
            "/api/admin/users/alice", headers={**ADMIN, "X-Atmosphere-Auth": "x"}
        )
        assert wrong.status_code == 401
        assert (await client.delete("/api/admin/users/%20", headers=ADMIN)).status_code == 400

        forgotten = await client.delete("/api/admin/users/alice", headers=ADMIN)
        assert forgotten.status_code == 200, forgotten.text
        assert forgotten.json() == {"userId": "alice", "conversationsDeleted": 3}

        for conversation in (*mine, busy):
            assert await store.holding(conversation) == [], conversation
            assert files_holding(workspace, conversation) == [], conversation
            messages = await client.get(
                f"{PATH}/conversations/{conversation}/messages", headers=ALICE
            )
            assert messages.status_code == 404
        assert (await client.get(PATH + "/conversations", headers=ALICE)).json()[
            "conversations"
        ] == []
        assert not (workspace / "agents" / "keeper" / "memories" / "alice").exists()
        assert await store.holding(fact) == [], "the facts and /memories are gone"
        assert files_holding(workspace, fact) == []
        bobs = await client.get(f"{PATH}/conversations/{theirs}/messages", headers=BOB)
        assert bobs.json()["messages"][0] == {"role": "user", "content": "remember coffee"}
        again = await client.delete("/api/admin/users/alice", headers=ADMIN)
        assert again.json() == {"userId": "alice", "conversationsDeleted": 0}


# --- retention --------------------------------------------------------------------------------


async def test_retention_deletes_idle_conversations_after_extracting_their_facts(
    workspace: Path, store: Store
) -> None:
    old = f"old-{uuid.uuid4().hex[:8]}"
    busy = f"busy-{uuid.uuid4().hex[:8]}"
    fact = f"jazz-{uuid.uuid4().hex[:8]}"
    async with keeper(workspace, store, conversation_ttl=1.0) as client:
        await post(client, f"remember {fact}", old, ALICE)
        await post(client, "file the notes", old, ALICE)
        run_id = await start_waiting_run(client, busy, ALICE)

        async def gone() -> bool:
            found = await client.get(f"{PATH}/conversations/{old}/messages", headers=ALICE)
            if found.status_code != 404:
                return False
            try:
                return not await store.holding(old) and not files_holding(workspace, old)
            except FileNotFoundError:  # the sweep is removing its folder right now
                return False

        await until(gone)
        # Its fact was extracted first, and stays the user's.
        assert await store.holding(fact)
        # A conversation whose run is in flight is never touched, however long it idles.
        await asyncio.sleep(2.5)
        status = (await client.get(f"{PATH}/runs/{run_id}", headers=ALICE)).json()
        assert status["status"] == "waiting-approval"
        kept = await client.get(f"{PATH}/conversations/{busy}/messages", headers=ALICE)
        assert kept.status_code == 200
        await client.post(f"{PATH}/runs/{run_id}/cancel", headers=ALICE)
