"""A lost acknowledgement on PostgreSQL: the write committed, the connection died before its
answer came back, and the backend's retry-once must not apply it again.

A real TCP proxy (`tcp_proxy.LossyProxy`) sits between the pool and the loopback server and
drops the server's reply to the write (its `CommandComplete`), closing the connection; the
retry then runs on a fresh connection through the same proxy.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from atmosphere_harness import ModelRequest, ScriptedRuntime, ToolCall, agent
from atmosphere_harness._backends.postgres import PostgresDatabase
from atmosphere_harness._backends.postgres.history import APPEND, PostgresHistory
from atmosphere_harness._backends.postgres.workspace import PostgresAgentFileSystem
from atmosphere_harness._memory import codec
from atmosphere_harness._memory.history import RECENT_WRITES, ConversationKey
from atmosphere_harness._runtimes.base import Message
from tests.agents import echo
from tests.support import client_for, make_app, prompt

from .postgres_service import HOST, PORT, postgres_url
from .tcp_proxy import LossyProxy

__all__ = ["postgres_url"]

pytestmark = pytest.mark.services

COMMIT = b"COMMIT\x00"
"""The `CommandComplete` tag of a transaction's end: the reply to lose for the workspace."""
INSERT = b"INSERT 0 "
"""The `CommandComplete` tag of the history's one-statement append."""
KEY = ConversationKey("/agent", "user-1", "conv-1")


@pytest.fixture
async def proxied(postgres_url: str) -> AsyncIterator[tuple[LossyProxy, PostgresDatabase]]:
    proxy = await LossyProxy(HOST, PORT).start()
    database = PostgresDatabase(proxy.url(postgres_url))
    await database.open()
    try:
        yield proxy, database
    finally:
        await database.aclose()
        await proxy.aclose()


async def test_a_turn_whose_acknowledgement_is_lost_is_stored_once(
    proxied: tuple[LossyProxy, PostgresDatabase],
) -> None:
    proxy, database = proxied
    history = PostgresHistory(database)
    await history.append(KEY, [Message("user", "first")])
    proxy.lose_reply_containing(INSERT)
    await history.append(KEY, [Message("user", "second")])
    assert proxy.cuts == 1
    await history.append(KEY, [Message("user", "third")])
    stored = [message.content for message in await history.messages(KEY)]
    assert stored == ["first", "second", "third"]


async def test_a_new_conversation_whose_first_turn_lost_its_acknowledgement(
    proxied: tuple[LossyProxy, PostgresDatabase],
) -> None:
    proxy, database = proxied
    history = PostgresHistory(database)
    proxy.lose_reply_containing(INSERT)
    await history.append(KEY, [Message("user", "hello"), Message("assistant", "hi")])
    assert proxy.cuts == 1
    assert [m.content for m in await history.messages(KEY)] == ["hello", "hi"]


async def test_a_turn_sent_again_after_later_turns_is_stored_once(
    proxied: tuple[LossyProxy, PostgresDatabase],
) -> None:
    """A turn whose acknowledgement was lost, sent again with its key after other turns of the
    conversation were stored (another replica took the conversation meanwhile: the lock went
    with a lost connection), is still stored once: the row keeps the keys of the latest
    `RECENT_WRITES` turns, and no more."""
    _proxy, database = proxied
    history = PostgresHistory(database)

    async def send(text: str, write: str) -> None:
        turn = [codec.encode_ascii(Message("user", text))]
        args = (KEY.endpoint, KEY.user_key, KEY.conversation_id, time.time(), turn, write)
        await database.run(lambda connection: connection.execute(APPEND, *args))

    lost = uuid.uuid4().hex
    await send("first", lost)
    for i in range(1, RECENT_WRITES):
        await history.append(KEY, [Message("user", f"later {i}")])
    await send("first", lost)
    stored = [message.content for message in await history.messages(KEY)]
    assert stored == ["first", *(f"later {i}" for i in range(1, RECENT_WRITES))]
    for i in range(RECENT_WRITES, 3 * RECENT_WRITES):
        await history.append(KEY, [Message("user", f"later {i}")])
    writes = await database.run(
        lambda connection: connection.fetchval(
            "SELECT last_write FROM atmosphere_conversations WHERE conversation_id = $1",
            KEY.conversation_id,
        )
    )
    assert len(writes.split(" ")) == RECENT_WRITES


async def workspace(database: PostgresDatabase) -> PostgresAgentFileSystem:
    store = PostgresAgentFileSystem(database, "user-1/conv-1")
    await store.write("notes.md", "alpha beta alpha")
    await store.write("old.md", "keep me")
    return store


async def test_an_edit_whose_acknowledgement_is_lost_reports_that_it_applied(
    proxied: tuple[LossyProxy, PostgresDatabase],
) -> None:
    proxy, database = proxied
    store = await workspace(database)
    proxy.lose_reply_containing(COMMIT)
    assert await store.edit("notes.md", "alpha", "gamma", replace_all=True) == 2
    assert proxy.cuts == 1
    assert await store.read("notes.md") == "gamma beta gamma"

    # The file tool's answer comes from this count ("Edited notes.md"), never an error.
    proxy.lose_reply_containing(COMMIT)
    assert await store.edit("notes.md", "beta", "delta") == 1
    assert proxy.cuts == 2
    assert await store.read("notes.md") == "gamma delta gamma"


async def test_a_rename_and_a_delete_whose_acknowledgements_are_lost_succeed(
    proxied: tuple[LossyProxy, PostgresDatabase],
) -> None:
    proxy, database = proxied
    store = await workspace(database)
    proxy.lose_reply_containing(COMMIT)
    await store.rename("old.md", "archive/old.md")
    assert proxy.cuts == 1
    assert await store.read("archive/old.md") == "keep me"
    proxy.lose_reply_containing(COMMIT)
    await store.delete("archive")
    assert proxy.cuts == 2
    assert await store.glob("**") == ["notes.md"]
    proxy.lose_reply_containing(COMMIT)
    await store.write("new.md", "written once")
    assert proxy.cuts == 3
    assert await store.read("new.md") == "written once"


async def test_an_extraction_claim_whose_acknowledgement_is_lost_still_extracts(
    proxied: tuple[LossyProxy, PostgresDatabase],
) -> None:
    proxy, database = proxied
    history = PostgresHistory(database)
    await history.append(KEY, [Message("user", "remember: tea"), Message("assistant", "noted")])
    proxy.lose_reply_containing(COMMIT)
    messages, last = await history.unextracted(KEY, 10)
    assert proxy.cuts == 1
    assert [m.content for m in messages] == ["remember: tea", "noted"]
    assert last == 2


async def test_an_approval_opened_and_answered_with_lost_acknowledgements(
    postgres_url: str,
) -> None:
    from atmosphere_harness._backends.postgres import PostgresApprovalStore
    from atmosphere_harness._governance.approvals import Answer, AnswerStatus

    proxy = await LossyProxy(HOST, PORT).start()
    database = PostgresDatabase(proxy.url(postgres_url))
    store = PostgresApprovalStore(database, max_pending=1)
    await database.open()
    try:
        proxy.lose_reply_containing(COMMIT)
        pending = await store.open(
            path="/p",
            conversation_id="c",
            user_id=None,
            tool="t",
            tool_call_id="call-1",
            arguments={},
            timeout=30,
        )
        assert proxy.cuts == 1
        assert pending is not None, "opened once, not refused as over the bound by itself"
        proxy.lose_reply_containing(COMMIT)
        status = await store.answer("/p", pending.id, Answer(True), user_id=None)
        assert proxy.cuts == 2
        assert status is AnswerStatus.ACCEPTED
        assert await store.answer("/p", pending.id, Answer(False), user_id=None) is (
            AnswerStatus.ALREADY_ANSWERED
        )
        await store.discard(pending)
    finally:
        await database.aclose()
        await proxy.aclose()


async def test_over_http_the_next_turn_sees_a_turn_whose_acknowledgement_was_lost_once(
    postgres_url: str, tmp_path: Path
) -> None:
    proxy = await LossyProxy(HOST, PORT).start()
    marker = f"second-{uuid.uuid4().hex[:8]}"
    sent: list[str] = []

    def turn(request: ModelRequest) -> str:
        users = [m.content for m in request.messages if m.role == "user"]
        sent.append(" | ".join(users))
        if users[-1] == marker:
            # The turn's append is the next statement that carries this text.
            proxy.lose_reply_to(marker.encode())
        return "ok"

    app = make_app(
        [echo(agent(name="keeper"), "Keeper")],
        runtime=ScriptedRuntime((), default=turn),
        workspace=tmp_path,
        postgres_url=proxy.url(postgres_url),
    )
    try:
        async with client_for(app) as client:
            for message in ("first", marker, "third"):
                frames = await prompt(client, "/atmosphere/agent/keeper", message, "conv-1")
                assert frames[-1]["event"] == "complete", frames[-1]
    finally:
        await proxy.aclose()
    assert proxy.cuts == 1
    assert sent[-1] == f"first | {marker} | third"


def bound(value: str) -> bytes:
    """`value` as a statement's parameter goes over the wire (its length, then its bytes): the
    run's frames, shared through the same database, carry the same text inside JSON, never
    behind a length, so only the workspace statement matches."""
    data = value.encode()
    return len(data).to_bytes(4, "big") + data


async def test_over_http_the_model_is_told_that_changes_whose_acknowledgement_was_lost_applied(
    postgres_url: str, tmp_path: Path
) -> None:
    proxy = await LossyProxy(HOST, PORT).start()
    tag = uuid.uuid4().hex[:8]
    steps = [
        (b"", ToolCall("write_file", {"path": "notes.md", "content": "alpha beta"})),
        (
            bound(f"gamma-{tag} beta"),
            ToolCall(
                "edit_file", {"path": "notes.md", "old_text": "alpha", "new_text": f"gamma-{tag}"}
            ),
        ),
        (
            bound(f"moved-{tag}.md"),
            ToolCall("rename", {"old_path": "notes.md", "new_path": f"moved-{tag}.md"}),
        ),
        (bound(f"moved-{tag}.md"), ToolCall("delete", {"path": f"moved-{tag}.md"})),
    ]

    def turn(request: ModelRequest) -> str | list[ToolCall]:
        done = sum(1 for m in request.messages if m.role == "tool")
        if done == len(steps):
            return "done"
        request_bytes, call = steps[done]
        if request_bytes:
            # The change's statement carries this text; lose the answer to its COMMIT.
            proxy.lose_reply_to(request_bytes, COMMIT)
        return [call]

    app = make_app(
        [echo(agent(name="keeper"), "Keeper")],
        runtime=ScriptedRuntime((), default=turn),
        workspace=tmp_path,
        postgres_url=proxy.url(postgres_url),
        workspace_backend="postgres",
    )
    try:
        async with client_for(app) as client:
            frames = await prompt(client, "/atmosphere/agent/keeper", "edit my notes", "conv-1")
    finally:
        await proxy.aclose()
    assert proxy.cuts == 3
    results = [f["data"]["result"] for f in frames if f["event"] == "tool-result"]
    assert results == [
        "Wrote notes.md",
        "Edited notes.md",
        f"Renamed notes.md to moved-{tag}.md",
        f"Deleted moved-{tag}.md",
    ]
