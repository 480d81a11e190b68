"""A user's conversations and a conversation's history over real HTTP (embedded SQLite):
`GET P/conversations` lists the caller's own, newest first, in pages; `GET
P/conversations/{id}/messages` pages through the stored history, oldest first, tool calls
included; both are the owner's alone. The PostgreSQL and Redis versions, on two replicas, are
in `tests/scaleout/test_conversations_replicas.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2

from atmosphere_harness import ModelRequest, ScriptedRuntime, ToolCall, agent
from tests.agents import echo
from tests.support import make_app, parse_sse, serve

PATH = "/atmosphere/agent/diary"
HEADER = "X-Forwarded-User"
ALICE = {HEADER: "alice"}
BOB = {HEADER: "bob"}

Diary = echo(agent(name="diary"), "Diary")


def diary_model(request: ModelRequest) -> str | list[ToolCall]:
    """A message starting with "note" writes it to a file first; then the answer."""
    last = request.messages[-1]
    if last.role == "user" and last.content.startswith("note"):
        return [ToolCall("write_file", {"path": "note.txt", "content": last.content}, id="c1")]
    return f"ok: {last.content}"


async def post(client: httpx2.AsyncClient, message: str, conversation: str, who: Any) -> None:
    body = {"message": message, "conversationId": conversation}
    response = await client.post(PATH, json=body, headers=who)
    assert response.status_code == 200, response.text
    assert parse_sse(response.text)[-1]["event"] == "complete"


async def pages(
    client: httpx2.AsyncClient, url: str, key: str, who: Any, limit: int
) -> list[list[Any]]:
    """Every page of a paged route, following `nextCursor` to the end."""
    found: list[list[Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        response = await client.get(url, params=params, headers=who)
        assert response.status_code == 200, response.text
        body = response.json()
        found.append(body[key])
        cursor = body["nextCursor"]
        if cursor is None:
            return found
        assert len(found) < 50, "the cursor never ends"


async def test_conversations_list_newest_first_and_history_pages_oldest_first(
    workspace: Path,
) -> None:
    app = make_app(
        [Diary],
        runtime=ScriptedRuntime(default=diary_model),
        workspace=workspace,
        user_id_header=HEADER,
    )
    long_title = "first words of a rather long prompt " * 5
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        await post(client, long_title, "trip", ALICE)
        await post(client, "hello", "groceries", ALICE)
        await post(client, "mine", "bobs", BOB)
        await post(client, "note: buy milk", "work", ALICE)
        await post(client, "again", "trip", ALICE)  # trip is the newest now

        listed = await pages(client, PATH + "/conversations", "conversations", ALICE, 2)
        flat = [row for page in listed for row in page]
        assert [len(page) for page in listed] == [2, 1]
        assert [row["conversationId"] for row in flat] == ["trip", "work", "groceries"]
        assert flat[0]["title"] == " ".join(long_title.split())[:80], "the first prompt's"
        assert flat[1]["title"] == "note: buy milk"
        times = [row["updatedAt"] for row in flat]
        assert times == sorted(times, reverse=True)
        bobs = (await client.get(PATH + "/conversations", headers=BOB)).json()
        assert [row["conversationId"] for row in bobs["conversations"]] == ["bobs"]
        assert bobs["nextCursor"] is None
        nobody = (await client.get(PATH + "/conversations")).json()
        assert nobody == {"conversations": [], "nextCursor": None}

        history = await pages(client, PATH + "/conversations/work/messages", "messages", ALICE, 2)
        assert [row for page in history for row in page] == [
            {"role": "user", "content": "note: buy milk"},
            {
                "role": "assistant",
                "content": "",
                "toolCalls": [
                    {
                        "id": "c1",
                        "name": "write_file",
                        "arguments": {"path": "note.txt", "content": "note: buy milk"},
                    }
                ],
            },
            {"role": "tool", "content": history[1][0]["content"], "toolCallId": "c1"},
            {"role": "assistant", "content": history[1][1]["content"]},
        ]
        assert "note.txt" in history[1][0]["content"]
        whole = await client.get(PATH + "/conversations/trip/messages", headers=ALICE)
        assert [m["content"] for m in whole.json()["messages"]] == [
            long_title,
            f"ok: {long_title}",
            "again",
            "ok: again",
        ]

        # Another user's conversation, or an unused id: 404; bad parameters: 400.
        for who, conversation in ((BOB, "work"), ({}, "work"), (ALICE, "never-used")):
            refused = await client.get(f"{PATH}/conversations/{conversation}/messages", headers=who)
            assert refused.status_code == 404, refused.text
            assert refused.json() == {"error": f"unknown conversation {conversation!r}"}
        for url, params in (
            ("/conversations", {"limit": "0"}),
            ("/conversations", {"limit": "101"}),
            ("/conversations", {"limit": "ten"}),
            ("/conversations", {"cursor": "not-a-cursor"}),
            ("/conversations/work/messages", {"limit": "0"}),
            ("/conversations/work/messages", {"cursor": "bm9wZQ"}),
            ("/conversations/bad..id/messages", {}),
        ):
            bad = await client.get(PATH + url, params=params, headers=ALICE)
            assert bad.status_code == 400, (url, params, bad.text)
            assert set(bad.json()) >= {"error"}
