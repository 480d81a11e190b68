"""Conversation ownership over real HTTP: a conversation belongs to the user whose prompt first
used its id; every other user, and a request without a user, gets 404 on every route that names
it, and nothing changes (no model call, no tool, no write).

The user comes from `ATMOSPHERE_USER_ID_HEADER` (here `X-Forwarded-User`), as an identity proxy
in front of the app would set it. The two-replica versions of these checks, on PostgreSQL and
on Redis, are in `tests/scaleout/test_tenancy_replicas.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from atmosphere_harness import ModelRequest, ScriptedRuntime, ToolCall, agent, tool
from tests.agents import echo
from tests.delegation_support import open_prompt
from tests.http.test_agui_http import run_input
from tests.http.test_websocket import receive, run_over, ws_url
from tests.support import make_app, parse_sse, serve

PATH = "/atmosphere/agent/ledger"
HEADER = "X-Forwarded-User"
ALICE = {HEADER: "alice"}
BOB = {HEADER: "bob"}
NOBODY: dict[str, str] = {}
ADMIN_TOKEN = "tenancy-admin-token"
PAID: list[str] = []


@tool(requires_approval=True)
async def pay(amount: int) -> str:
    """Pay an amount (needs a person's approval).

    Args:
        amount: How much.
    """
    PAID.append(f"pay {amount}")
    return f"paid {amount}"


Ledger = echo(agent(name="ledger"), "Ledger", tools=[pay])


def ledger_model(request: ModelRequest) -> str | list[ToolCall]:
    """A user message writes `salary.txt` with the message and plans it; "pay" also asks to
    pay (an approval); after the tools, the answer."""
    last = request.messages[-1]
    if last.role != "user":
        return "done"
    calls = [
        ToolCall("write_file", {"path": "salary.txt", "content": last.content}),
        ToolCall("write_todos", {"todos": [{"content": last.content, "status": "completed"}]}),
    ]
    if last.content.startswith("pay"):
        calls.append(ToolCall("pay", {"amount": 5}))
    return calls


def ledger_app(workspace: Path, runtime: ScriptedRuntime) -> Any:
    return make_app(
        [Ledger],
        runtime=runtime,
        workspace=workspace,
        user_id_header=HEADER,
        admin_token=ADMIN_TOKEN,
    )


def salary(workspace: Path, conversation: str) -> str:
    return (workspace / f"agents/ledger/files/{conversation}/salary.txt").read_text()


def user_messages(runtime: ScriptedRuntime) -> list[str]:
    return [
        request.messages[-1].content
        for request in runtime.requests
        if "purpose" not in request.metadata and request.messages[-1].role == "user"
    ]


async def call(client: httpx2.AsyncClient, method: str, url: str, **kw: Any) -> httpx2.Response:
    """One request whose answer is read only if it is not a stream: a route that lets a
    stranger in answers 200 with an endless stream, which must fail the test, not hang it."""
    async with client.stream(method, url, **kw) as response:
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            await response.aread()
        return response


async def refused_everywhere(
    client: httpx2.AsyncClient,
    base: str,
    conversation: str,
    headers: dict[str, str],
    path: str = PATH,
) -> None:
    """Every route of the endpoint at `path` naming `conversation` answers 404 `{"error"}` to
    `headers`' user (`client` talks to the server at `base`)."""
    body = {"message": "overwrite it", "conversationId": conversation}
    query = {"conversationId": conversation}
    answers = {
        "POST P": await call(client, "POST", path, json=body, headers=headers),
        "POST P/ag-ui": await call(
            client,
            "POST",
            path + "/ag-ui",
            json=run_input(conversation, "overwrite it"),
            headers=headers,
        ),
        "GET P/plan/events": await call(
            client, "GET", path + "/plan/events", params=query, headers=headers
        ),
        "GET P/conversations/{id}/events": await call(
            client, "GET", f"{path}/conversations/{conversation}/events", headers=headers
        ),
        "GET P/conversations/{id}/messages": await call(
            client, "GET", f"{path}/conversations/{conversation}/messages", headers=headers
        ),
        "GET P/approvals": await call(
            client, "GET", path + "/approvals", params=query, headers=headers
        ),
        "POST P/conversations/{id}/close": await call(
            client, "POST", f"{path}/conversations/{conversation}/close", headers=headers
        ),
    }
    for route, response in answers.items():
        assert response.status_code == 404, (route, response.status_code)
        assert response.json() == {"error": f"unknown conversation {conversation!r}"}, route
    with pytest.raises(InvalidStatus) as handshake:
        async with connect(
            ws_url(base, path, conversationId=conversation), additional_headers=headers
        ):
            pass
    assert handshake.value.response.status_code == 404
    assert json.loads(handshake.value.response.body) == {
        "error": f"unknown conversation {conversation!r}"
    }
    # A socket of its own, then a prompt naming the conversation: refused, the socket lives on.
    async with connect(ws_url(base, path), additional_headers=headers) as socket:
        await socket.send(json.dumps(body))
        notice = await receive(socket)
        assert notice == {
            "event": "error",
            "data": {"message": f"unknown conversation {conversation!r}", "type": "not_found"},
        }


async def test_another_user_cannot_reach_a_conversation_on_any_route(workspace: Path) -> None:
    PAID.clear()
    runtime = ScriptedRuntime(default=ledger_model)
    app = ledger_app(workspace, runtime)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        async with open_prompt(
            client, PATH, "pay alice: 100", "project-plan", headers=ALICE
        ) as reader:
            asked = await reader.until("approval-required")
            approval = f"{PATH}/approvals/{asked['data']['approvalId']}"
            for stranger in (BOB, NOBODY):
                # (A prompt let through would wait for alice's run: the guard turns that into a
                # failure instead of a hang.)
                async with asyncio.timeout(20):
                    await refused_everywhere(client, base, "project-plan", stranger)
                answer = await client.post(approval, json={"approve": True}, headers=stranger)
                assert answer.status_code == 404, answer.text
                assert "unknown or expired approval" in answer.json()["error"]
            assert PAID == [], "nobody but alice can approve her payment"
            listed = await client.get(
                PATH + "/approvals", params={"conversationId": "project-plan"}, headers=ALICE
            )
            assert [a["approvalId"] for a in listed.json()["approvals"]] == [
                asked["data"]["approvalId"]
            ]
            mine = await client.post(approval, json={"approve": True}, headers=ALICE)
            assert mine.status_code == 200, mine.text
            rest = await reader.rest()
        assert rest[-1]["event"] == "complete"
        # The owner still reaches every route.
        replay = await client.get(f"{PATH}/conversations/project-plan/events", headers=ALICE)
        closed = await client.post(f"{PATH}/conversations/project-plan/close", headers=ALICE)
        admin = await client.get(
            "/api/admin/agents/ledger/files/content",
            params={"conversationId": "project-plan", "path": "salary.txt"},
            headers={"X-Atmosphere-Auth": ADMIN_TOKEN},
        )
    assert PAID == ["pay 5"]
    assert salary(workspace, "project-plan") == "pay alice: 100", "alice's file is intact"
    assert user_messages(runtime) == ["pay alice: 100"], "no model call for anyone else"
    assert replay.status_code == 200
    assert parse_sse(replay.text)[-1]["event"] == "complete"
    assert closed.status_code == 200
    assert admin.status_code == 200, "the operator's token still reads every conversation"
    assert admin.json()["content"] == "pay alice: 100"


async def test_a_second_user_posting_to_the_same_id_gets_404_and_changes_nothing(
    workspace: Path,
) -> None:
    runtime = ScriptedRuntime(default=ledger_model)
    async with (
        serve(ledger_app(workspace, runtime)) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
    ):
        first = await client.post(
            PATH, json={"message": "alice: 100", "conversationId": "project-plan"}, headers=ALICE
        )
        assert parse_sse(first.text)[-1]["event"] == "complete"
        second = await client.post(
            PATH, json={"message": "bob: 1", "conversationId": "project-plan"}, headers=BOB
        )
        anonymous = await client.post(
            PATH, json={"message": "anon", "conversationId": "project-plan"}
        )
        again = await client.post(
            PATH, json={"message": "alice: 200", "conversationId": "project-plan"}, headers=ALICE
        )
    assert second.status_code == 404
    assert second.json() == {"error": "unknown conversation 'project-plan'"}
    assert "x-conversation-id" not in second.headers
    assert anonymous.status_code == 404
    assert parse_sse(again.text)[-1]["event"] == "complete", "the owner carries on"
    assert salary(workspace, "project-plan") == "alice: 200"
    assert user_messages(runtime) == ["alice: 100", "alice: 200"]


async def test_routes_other_than_a_prompt_never_claim_an_id(workspace: Path) -> None:
    """An id no prompt used is owned by nobody: 404 everywhere but a prompt, for everyone, and
    the first prompt (from anyone) then owns it."""
    runtime = ScriptedRuntime(default=ledger_model)
    async with (
        serve(ledger_app(workspace, runtime)) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
    ):
        for someone in (ALICE, NOBODY):
            for url, params in (
                (PATH + "/plan/events", {"conversationId": "fresh"}),
                (PATH + "/approvals", {"conversationId": "fresh"}),
                (PATH + "/conversations/fresh/events", {}),
            ):
                response = await call(client, "GET", url, params=params, headers=someone)
                assert response.status_code == 404, url
            closed = await client.post(PATH + "/conversations/fresh/close", headers=someone)
            assert closed.status_code == 404
        claimed = await client.post(
            PATH, json={"message": "bob: 1", "conversationId": "fresh"}, headers=BOB
        )
        assert parse_sse(claimed.text)[-1]["event"] == "complete"
        theirs = await client.get(
            PATH + "/approvals", params={"conversationId": "fresh"}, headers=BOB
        )
        not_alices = await client.get(
            PATH + "/approvals", params={"conversationId": "fresh"}, headers=ALICE
        )
    assert theirs.json() == {"conversationId": "fresh", "approvals": []}
    assert not_alices.status_code == 404


async def test_anonymous_conversations_are_reached_by_their_id_which_is_unguessable(
    workspace: Path,
) -> None:
    """Without an identity every request is the same anonymous user: the conversation id is the
    capability, so a generated one is a random UUID (122 random bits)."""
    runtime = ScriptedRuntime(default=ledger_model)
    app = make_app([Ledger], runtime=runtime, workspace=workspace)
    async with (
        serve(app) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
    ):
        ids = []
        for _ in range(3):
            response = await client.post(PATH, json={"message": "hello"})
            ids.append(response.headers["x-conversation-id"])
        known = await client.get(PATH + "/approvals", params={"conversationId": ids[0]})
        guessed = await call(
            client, "GET", PATH + "/plan/events", params={"conversationId": str(uuid.uuid4())}
        )
    assert known.status_code == 200
    assert guessed.status_code == 404, "an id no prompt used leads nowhere"
    for generated in ids:
        parsed = uuid.UUID(generated)
        assert parsed.version == 4
        assert str(parsed) == generated
    assert len(set(ids)) == 3


BAD_IDS = ["abc\n", "", "..", "a..b", "-start", "a/b", "x" * 129, "abc\r\n", "ab c"]


async def test_an_invalid_conversation_id_is_refused_on_every_route_before_any_work(
    workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One validator (a full match): 422 for a body field, 400 for a path or query parameter,
    including the newline that `$` lets through; no traceback, no model call."""
    runtime = ScriptedRuntime(default=ledger_model)
    admin = {"X-Atmosphere-Auth": ADMIN_TOKEN}
    caplog.set_level(logging.INFO)
    async with (
        serve(ledger_app(workspace, runtime)) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
    ):
        for bad in BAD_IDS:
            body = {"message": "hi", "conversationId": bad}
            answers = {
                "POST P": (await client.post(PATH, json=body, headers=ALICE), 422),
                "POST P/ag-ui": (
                    await client.post(PATH + "/ag-ui", json=run_input(bad, "hi"), headers=ALICE),
                    422,
                ),
                "plan events": (
                    await client.get(PATH + "/plan/events", params={"conversationId": bad}),
                    400,
                ),
                "approvals": (
                    await client.get(PATH + "/approvals", params={"conversationId": bad}),
                    400,
                ),
                "admin plan": (
                    await client.get(
                        "/api/admin/agents/ledger/plan",
                        params={"conversationId": bad},
                        headers=admin,
                    ),
                    400,
                ),
                "admin files": (
                    await client.get(
                        "/api/admin/agents/ledger/files",
                        params={"conversationId": bad},
                        headers=admin,
                    ),
                    400,
                ),
            }
            if bad not in ("", "..") and "/" not in bad:  # else no route matches the path
                quoted = f"{PATH}/conversations/{quote(bad, safe='')}/events"
                answers["events"] = (await client.get(quoted), 400)
                closing = quoted.removesuffix("/events") + "/close"
                answers["close"] = (await client.post(closing), 400)
            for route, (response, status) in answers.items():
                assert response.status_code == status, (bad, route, response.text)
                assert "error" in response.json(), (bad, route)
                assert "x-conversation-id" not in response.headers
            if bad:
                with pytest.raises(InvalidStatus) as handshake:
                    async with connect(ws_url(base, PATH, conversationId=quote(bad, safe=""))):
                        pass
                assert handshake.value.response.status_code == 400, bad
            async with connect(ws_url(base, PATH)) as socket:
                frames = await run_over(socket, {"message": "hi", "conversationId": bad})
                assert frames[-1]["event"] == "error"
                assert frames[-1]["data"]["type"] == "invalid_request"
        newline = await client.get(
            "/api/admin/agents/ledger/plan?conversationId=abc%0A", headers=admin
        )
    assert newline.status_code == 400
    assert user_messages(runtime) == []
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_an_anonymous_conversation_is_not_a_signed_in_users(workspace: Path) -> None:
    """`GET P/conversations/{id}/events` of an anonymous run is the anonymous user's: a signed-in
    user cannot follow it either (ownership compares users, anonymous included)."""
    runtime = ScriptedRuntime(default=ledger_model)
    async with (
        serve(ledger_app(workspace, runtime)) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
    ):
        first = await client.post(PATH, json={"message": "anon", "conversationId": "open-one"})
        assert parse_sse(first.text)[-1]["event"] == "complete"
        anonymous = await client.get(f"{PATH}/conversations/open-one/events")
        signed_in = await client.get(f"{PATH}/conversations/open-one/events", headers=ALICE)
    assert anonymous.status_code == 200
    assert signed_in.status_code == 404
