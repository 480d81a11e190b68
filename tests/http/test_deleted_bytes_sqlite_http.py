"""A deleted conversation leaves no byte in the embedded SQLite files, over real HTTP: a unique
word written into a conversation's history (a long message too), plan, approved tool call
arguments and run frames is found in the raw bytes of `atmosphere.db` and its WAL before
`DELETE P/conversations/{id}`, and in none of them (nor in any other file of the workspace)
once it answered 204, while the word of another conversation still is.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx2

from atmosphere_harness import Harness, ModelRequest, ScriptedRuntime, ToolCall, agent, tool
from atmosphere_harness._memory.extraction import EXTRACTION_SYSTEM_PROMPT
from tests.agents import echo
from tests.http.test_conversation_delete_http import files_holding, until
from tests.support import make_app, parse_sse, serve

PATH = "/atmosphere/agent/vault"


@tool(requires_approval=True)
async def transfer(to: str) -> str:
    """Send money (needs a person's approval).

    Args:
        to: Who gets it.
    """
    return f"sent to {to}"


Vault = echo(agent(name="vault", harness=(Harness.ALL,)), "Vault", tools=[transfer])


def model(request: ModelRequest) -> str | list[ToolCall]:
    """`plan <word>`: a plan naming it; `pay <word>`: the gated `transfer` to it; then an
    answer repeating the last user message."""
    if request.system_prompt == EXTRACTION_SYSTEM_PROMPT:
        return "[]"
    messages = list(request.messages)
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    text = messages[last_user].content
    if any(m.role == "tool" for m in messages[last_user:]):
        return f"done: {text}"
    verb, _, word = text.partition(" ")
    if verb == "plan":
        return [ToolCall("write_todos", {"todos": [{"content": word, "status": "pending"}]})]
    if verb == "pay":
        return [ToolCall("transfer", {"to": word})]
    return f"ok: {text}"


def sqlite_bytes(workspace: Path) -> dict[str, bytes]:
    """Every SQLite file of the workspace (the database, its WAL and shared memory), raw."""
    return {
        path.name: path.read_bytes()
        for path in workspace.rglob("*")
        if path.is_file() and ".db" in path.name and not path.name.endswith(".log")
    }


def holding(workspace: Path, word: str) -> list[str]:
    """The SQLite files with `word` in any byte (as UTF-8, or as the JSON escapes of it)."""
    return [name for name, data in sqlite_bytes(workspace).items() if word.encode() in data]


async def post(client: httpx2.AsyncClient, message: str, conversation: str) -> None:
    body = {"message": message, "conversationId": conversation}
    response = await client.post(PATH, json=body)
    assert response.status_code == 200, response.text
    assert parse_sse(response.text)[-1]["event"] == "complete"


async def pay(client: httpx2.AsyncClient, word: str, conversation: str) -> None:
    """A background run whose `transfer` to `word` a person approves, until it completed."""
    body = {"message": f"pay {word}", "conversationId": conversation, "background": True}
    started = await client.post(PATH, json=body)
    assert started.status_code == 202, started.text
    run_id = started.json()["runId"]

    async def asked() -> list[Any]:
        listed = await client.get(PATH + "/approvals", params={"conversationId": conversation})
        approvals: list[Any] = listed.json()["approvals"]
        return approvals

    approval = (await until(asked))[0]["approvalId"]
    answered = await client.post(f"{PATH}/approvals/{approval}", json={"approve": True})
    assert answered.status_code == 200, answered.text

    async def completed() -> bool:
        found = await client.get(f"{PATH}/runs/{run_id}")
        return bool(found.json()["status"] == "completed")

    await until(completed)


async def test_a_deleted_conversation_leaves_no_byte_in_the_sqlite_files(
    workspace: Path,
) -> None:
    secret, other = f"secret{uuid.uuid4().hex}", f"other{uuid.uuid4().hex}"
    doomed, kept = f"doomed-{uuid.uuid4().hex[:8]}", f"kept-{uuid.uuid4().hex[:8]}"
    app = make_app(
        [Vault], runtime=ScriptedRuntime(default=model), workspace=workspace, durable_runs=True
    )
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        await post(client, f"plan {secret}", doomed)
        await pay(client, secret, doomed)
        await post(client, f"hello {secret}", doomed)
        # A message longer than a page: its tail is on overflow pages, freed by the deletion.
        await post(client, f"long {uuid.uuid4().hex * 100} {secret}", doomed)
        await post(client, f"plan {other}", kept)
        await pay(client, other, kept)
        assert holding(workspace, secret), "the word was written to the SQLite files"

        deleted = await client.delete(f"{PATH}/conversations/{doomed}")
        assert deleted.status_code == 204, deleted.text

        assert holding(workspace, secret) == []
        assert holding(workspace, doomed) == []
        assert files_holding(workspace, secret) == []
        assert holding(workspace, other), "another conversation is still there"
        history = await client.get(f"{PATH}/conversations/{kept}/messages")
        assert history.json()["messages"][0] == {"role": "user", "content": f"plan {other}"}
