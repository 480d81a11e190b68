"""Conversations derived from a deleted one go with it, over real HTTP on every backend
(embedded SQLite and files, PostgreSQL, Redis): a coordinator conversation that delegated to a
fleet member (itself a coordinator that delegated further, each member writing its history, a
plan and a file) and spawned a `task` sub-agent (which wrote a plan and a file) is deleted;
then every store is read directly (as `test_conversation_delete_http` reads it) for the
members' conversation ids, the sub-agent's id and the words each was given: nothing remains,
while another conversation's members are whole. Forgetting a user and retention do the same,
and retention never deletes a member's conversation on its own while its coordinator's lives.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest
from fastapi import Request

from atmosphere_harness import (
    Harness,
    ModelRequest,
    ScriptedRuntime,
    ToolCall,
    agent,
    coordinator,
)
from atmosphere_harness._delegation.fleet import member_conversation
from atmosphere_harness._delegation.subagent import SYSTEM_PROMPT as SUBAGENT_PROMPT
from atmosphere_harness._kernel.host import HarnessHost
from atmosphere_harness._kernel.retention import sweep
from atmosphere_harness._memory.extraction import EXTRACTION_SYSTEM_PROMPT
from atmosphere_harness._registry import spec_of
from atmosphere_harness._web.deps import STATE_KEY
from tests.agents import echo
from tests.http.test_conversation_delete_http import BACKENDS, Store, files_holding
from tests.support import make_app, parse_sse, serve

HEADER = "X-User"
ALICE = {HEADER: "alice"}
BOB = {HEADER: "bob"}
TOKEN = "derived-admin-token"

Scribe = echo(
    agent(name="scribe", system_prompt="You are the scribe.", harness=(Harness.ALL,)), "Scribe"
)
Editor = echo(
    coordinator(
        "editor", fleet=[Scribe], system_prompt="You are the editor.", harness=(Harness.ALL,)
    ),
    "Editor",
)
Chief = echo(
    coordinator(
        "chief", fleet=[Editor], system_prompt="You are the chief.", harness=(Harness.ALL,)
    ),
    "Chief",
)
CHIEF = spec_of(Chief).path
EDITOR = spec_of(Editor).path
SCRIBE = spec_of(Scribe).path


def model(request: ModelRequest) -> str | list[ToolCall]:
    """The chief hands `delegate ...` to the editor and `spawn ...` to a `task` sub-agent; the
    editor hands what it gets to the scribe; the scribe and the sub-agent write a plan, then
    a file, then answer (each step after the tool result of the one before)."""
    system = request.system_prompt or ""
    if system == EXTRACTION_SYSTEM_PROMPT:
        return "[]"
    messages = list(request.messages)
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    text = messages[last_user].content
    step = sum(1 for m in messages[last_user:] if m.role == "tool")
    if system.startswith(SUBAGENT_PROMPT) or "You are the scribe." in system:
        if step == 0:
            return [ToolCall("write_todos", {"todos": [{"content": text, "status": "pending"}]})]
        if step == 1:
            return [ToolCall("write_file", {"path": "notes.txt", "content": text})]
        return f"wrote: {text}"
    if step:
        return f"done: {text}"
    if "You are the editor." in system:
        return [ToolCall("delegate_task", {"agent": "scribe", "message": text})]
    if text.startswith("delegate"):
        return [ToolCall("delegate_task", {"agent": "editor", "message": text})]
    if text.startswith("spawn"):
        return [ToolCall("task", {"description": text})]
    return f"ok: {text}"


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
async def served(
    workspace: Path, store: Store, **settings: Any
) -> AsyncIterator[tuple[httpx2.AsyncClient, HarnessHost]]:
    """The app over uvicorn, and its host (read by a route of the test's own)."""
    app = make_app(
        [Chief, Editor, Scribe],
        runtime=ScriptedRuntime(default=model),
        workspace=workspace,
        user_id_header=HEADER,
        durable_runs=True,
        admin_token=TOKEN,
        **store.settings,
        **settings,
    )
    hosts: list[HarnessHost] = []

    @app.get("/test-host")
    async def grab(request: Request) -> dict[str, str]:
        hosts.append(getattr(request.state, STATE_KEY))
        return {}

    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=60) as client:
        assert (await client.get("/test-host")).status_code == 200
        yield client, hosts[0]


async def post(
    client: httpx2.AsyncClient, message: str, conversation: str, who: Any, path: str = CHIEF
) -> list[dict[str, Any]]:
    body = {"message": message, "conversationId": conversation}
    response = await client.post(path, json=body, headers=who)
    assert response.status_code == 200, response.text
    frames = parse_sse(response.text)
    assert frames[-1]["event"] == "complete", frames[-1]
    return frames


def member(path: str, conversation: str, name: str) -> str:
    """The conversation fleet member `name` keeps for `conversation` of the coordinator at
    `path` (as `delegate_task` names it)."""
    run: Any = SimpleNamespace(endpoint=SimpleNamespace(path=path), conversation_id=conversation)
    return member_conversation(run, name)


def members(conversation: str) -> tuple[str, str]:
    """The editor's conversation for the chief's `conversation`, and the scribe's for that."""
    editor = member(CHIEF, conversation, "editor")
    return editor, member(EDITOR, editor, "scribe")


async def messages(client: httpx2.AsyncClient, path: str, conversation: str, who: Any) -> Any:
    response = await client.get(f"{path}/conversations/{conversation}/messages", headers=who)
    return response.status_code, response.json()


async def nothing_of(store: Store, workspace: Path, needles: list[str]) -> None:
    for needle in needles:
        assert await store.holding(needle) == [], needle
        assert files_holding(workspace, needle) == [], needle


async def test_deleting_a_coordinator_conversation_deletes_its_members_and_sub_agents(
    workspace: Path, store: Store
) -> None:
    doomed, kept = f"doomed-{uuid.uuid4().hex[:8]}", f"kept-{uuid.uuid4().hex[:8]}"
    told, spawned, other = (f"{word}-{uuid.uuid4().hex[:8]}" for word in ("told", "sub", "other"))
    async with served(workspace, store) as (client, _host):
        await post(client, f"delegate {told}", doomed, ALICE)
        frames = await post(client, f"spawn {spawned}", doomed, ALICE)
        await post(client, f"delegate {other}", kept, ALICE)
        subagent = next(f for f in frames if f["event"] == "subagent-start")["data"]["subagentId"]
        assert next(f for f in frames if f["event"] == "subagent-end")["data"]["status"] == (
            "completed"
        )
        editor, scribe = members(doomed)
        kept_editor, kept_scribe = members(kept)
        status, history = await messages(client, SCRIBE, scribe, ALICE)
        assert status == 200
        assert history["messages"][0] == {"role": "user", "content": f"delegate {told}"}
        for needle in (editor, scribe, told, spawned):
            assert await store.holding(needle) or files_holding(workspace, needle), needle

        deleted = await client.delete(f"{CHIEF}/conversations/{doomed}", headers=ALICE)
        assert deleted.status_code == 204, deleted.text

        await nothing_of(store, workspace, [doomed, editor, scribe, subagent, told, spawned])
        assert (await messages(client, EDITOR, editor, ALICE))[0] == 404
        assert (await messages(client, SCRIBE, scribe, ALICE))[0] == 404
        listed = await client.get(f"{SCRIBE}/conversations", headers=ALICE)
        assert [row["conversationId"] for row in listed.json()["conversations"]] == [kept_scribe]

        # The other conversation's members are whole.
        status, history = await messages(client, SCRIBE, kept_scribe, ALICE)
        assert status == 200
        assert history["messages"][0] == {"role": "user", "content": f"delegate {other}"}
        assert (await messages(client, EDITOR, kept_editor, ALICE))[0] == 200
        assert files_holding(workspace, kept_scribe) or await store.holding(kept_scribe)
        assert files_holding(workspace, other) or await store.holding(other)

        # The id is unused again: another user's delegation there starts afresh.
        await post(client, "delegate again", doomed, BOB)
        status, history = await messages(client, SCRIBE, scribe, BOB)
        assert status == 200
        assert [m["content"] for m in history["messages"] if m["role"] == "user"] == [
            "delegate again"
        ]


async def test_forgetting_a_user_deletes_the_conversations_of_their_fleets(
    workspace: Path, store: Store
) -> None:
    mine, theirs = f"mine-{uuid.uuid4().hex[:8]}", f"theirs-{uuid.uuid4().hex[:8]}"
    told, spawned = f"told-{uuid.uuid4().hex[:8]}", f"sub-{uuid.uuid4().hex[:8]}"
    async with served(workspace, store) as (client, _host):
        await post(client, f"delegate {told}", mine, ALICE)
        frames = await post(client, f"spawn {spawned}", mine, ALICE)
        subagent = next(f for f in frames if f["event"] == "subagent-start")["data"]["subagentId"]
        await post(client, "delegate hello", theirs, BOB)
        forgotten = await client.delete(
            "/api/admin/users/alice", headers={"X-Atmosphere-Auth": TOKEN}
        )
        assert forgotten.status_code == 200, forgotten.text
        # The chief's, the editor's and the scribe's conversation.
        assert forgotten.json() == {"userId": "alice", "conversationsDeleted": 3}
        editor, scribe = members(mine)
        await nothing_of(store, workspace, [mine, editor, scribe, subagent, told, spawned])
        _bob_editor, bob_scribe = members(theirs)
        status, history = await messages(client, SCRIBE, bob_scribe, BOB)
        assert status == 200
        assert history["messages"][0] == {"role": "user", "content": "delegate hello"}


async def test_retention_deletes_members_with_their_coordinator_never_before(
    workspace: Path, store: Store
) -> None:
    idle = f"idle-{uuid.uuid4().hex[:8]}"
    told = f"told-{uuid.uuid4().hex[:8]}"
    async with served(workspace, store) as (client, host):
        await post(client, f"delegate {told}", idle, ALICE)
        editor, scribe = members(idle)
        # The owner may prompt a member's conversation over HTTP too: it stays derived.
        await post(client, "hello", scribe, ALICE, path=SCRIBE)
        between = time.time()
        await asyncio.sleep(0.01)  # (a later prompt's time is strictly after `between`)
        await post(client, "hello", idle, ALICE)  # the chief's goes on, without the members

        # Idle since before `between`: the members' conversations, not the chief's.
        assert await sweep(host, 0.0, now=between) == 0
        status, history = await messages(client, SCRIBE, scribe, ALICE)
        assert status == 200, "a member's conversation is not deleted while its parent lives"
        assert history["messages"][0] == {"role": "user", "content": f"delegate {told}"}
        assert (await messages(client, EDITOR, editor, ALICE))[0] == 200

        # Once the chief's is idle too, all three go together.
        assert await sweep(host, 0.0, now=time.time() + 1) == 1
        await nothing_of(store, workspace, [idle, editor, scribe, told])
        assert (await messages(client, SCRIBE, scribe, ALICE))[0] == 404
