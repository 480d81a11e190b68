"""Who the user is, over real HTTP: the trusted-header setting, overrides, and the truth.

`user_id_header` (`ATMOSPHERE_USER_ID_HEADER`) makes the default `get_user_id` read the user from
a header an auth proxy sets; an app's own `get_user_id` override wins; `GET /api/console/info`
says on each endpoint where the user comes from (`identity`), so an app whose long-term memory
can never keep a fact (every request anonymous) says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI
from starlette.requests import HTTPConnection
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from atmosphere_harness import InMemoryLongTermMemory, ModelRequest, ScriptedRuntime, get_user_id
from atmosphere_harness._preset import LONG_TERM_MEMORY
from tests.http.test_agui_http import run_agui, run_input
from tests.http.test_memory_http import KEEPER, Keeper, app_for, eventually, model, say
from tests.http.test_websocket import run_over, ws_url
from tests.support import client_for, serve

HEADER = "X-Forwarded-User"
SEED_KEYS = {
    "conversation-memory",
    "long-term-memory",
    "prompt-cache-default",
    "compaction",
    "delegation",
    "planning",
    "filesystem",
    "skills",
    "durable-runs",
    "tracing",
}
"""Atmosphere's Java harness's Runtime Truth table, and `tracing` (docs/runtime-truth.md): the
app-wide block has exactly these keys."""


def header_app(workspace: Path, runtime: ScriptedRuntime, **settings: Any) -> FastAPI:
    """The keeper agent, no `get_user_id` override, facts in memory readable at `/facts`."""
    return app_for(
        [Keeper],
        workspace,
        runtime,
        trust_header=False,
        long_term_memory=InMemoryLongTermMemory(),
        **settings,
    )


async def truth(client: httpx2.AsyncClient) -> dict[str, Any]:
    response = await client.get("/api/console/info")
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def keeper_truth(data: dict[str, Any]) -> dict[str, str]:
    (endpoint,) = [e for e in data["endpoints"] if e["path"] == KEEPER]
    state: dict[str, str] = endpoint["harness"]
    return state


async def facts_of(client: httpx2.AsyncClient, user: str) -> list[str]:
    response = await client.get("/facts", params={"user": user})
    assert response.status_code == 200
    facts: list[str] = response.json()
    return facts


async def remembered(client: httpx2.AsyncClient, user: str, conversation: str) -> None:
    """Say one fact as `user` (by the header), close the conversation, wait for extraction."""
    headers = {HEADER: user}
    body = {"message": "remember that I sail", "conversationId": conversation}
    response = await client.post(KEEPER, json=body, headers=headers)
    assert response.status_code == 200, response.text
    closed = await client.post(f"{KEEPER}/conversations/{conversation}/close", headers=headers)
    assert closed.status_code == 200, closed.text


# --- out of the box: nobody is known, and the truth says so --------------------------------


async def test_by_default_no_identity_source_and_no_fact_is_kept(workspace: Path) -> None:
    runtime = model()
    store = InMemoryLongTermMemory()
    app = app_for([Keeper], workspace, runtime, trust_header=False, long_term_memory=store)
    async with client_for(app) as client:
        data = await truth(client)
        await remembered(client, "alice", "c1")  # the header means nothing without the setting
    # the app has stopped, and stopping waits for pending extractions: none was even asked
    assert not [r for r in runtime.requests if r.metadata.get("purpose") == "memory-extraction"]
    assert await store.fact_count("alice") == 0
    assert set(data["harness"]) == SEED_KEYS, "the app-wide block keeps its documented shape"
    endpoint = keeper_truth(data)
    assert endpoint[LONG_TERM_MEMORY].startswith("ACTIVE(")
    assert endpoint["identity"] == "NONE"


async def test_the_start_up_log_says_long_term_memory_keeps_nothing(
    workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="atmosphere_harness"):
        async with client_for(header_app(workspace, model())):
            pass
        anonymous = [r for r in caplog.records if "every request is anonymous" in r.getMessage()]
        assert len(anonymous) == 1
        assert "ATMOSPHERE_USER_ID_HEADER" in anonymous[0].getMessage()
        caplog.clear()
        async with client_for(header_app(workspace, model(), user_id_header=HEADER)):
            pass
        assert not [r for r in caplog.records if "every request is anonymous" in r.getMessage()]


# --- the trusted header ----------------------------------------------------------------------


async def test_the_header_names_the_user_and_memory_works(workspace: Path) -> None:
    runtime = model()
    async with client_for(header_app(workspace, runtime, user_id_header=HEADER)) as client:
        assert keeper_truth(await truth(client))["identity"] == f"HEADER({HEADER})"
        await remembered(client, "alice", "c1")
        await eventually(lambda: _has(client, "alice", ["I sail"]))
        await say(client, "what do I like?", "c2")  # no header: anonymous, no recall
        lowercase = {HEADER.lower(): "alice"}  # header names are case-insensitive
        response = await client.post(
            KEEPER, json={"message": "and now?", "conversationId": "c3"}, headers=lowercase
        )
        assert response.status_code == 200
        assert await facts_of(client, "bob") == []
    chats = [r for r in runtime.requests if "purpose" not in r.metadata]
    assert chats[-2].context == ()
    assert chats[-1].context == ("Known facts about this user:\n- I sail",)


async def _has(client: httpx2.AsyncClient, user: str, expected: list[str]) -> bool:
    return await facts_of(client, user) == expected


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ([(HEADER, "../../etc")], "must be 1-128 letters"),
        ([(HEADER, "a" * 129)], "must be 1-128 letters"),
        ([(HEADER, "alice, mallory")], "must be 1-128 letters"),
        ([(HEADER, "mallory"), (HEADER, "alice")], "must be sent once"),
    ],
)
async def test_a_malformed_or_repeated_header_is_a_400(
    workspace: Path, headers: list[tuple[str, str]], problem: str
) -> None:
    runtime = model()
    async with client_for(header_app(workspace, runtime, user_id_header=HEADER)) as client:
        response = await client.post(
            KEEPER, json={"message": "hi"}, headers=httpx2.Headers(headers)
        )
        closing = await client.post(
            f"{KEEPER}/conversations/c1/close", headers=httpx2.Headers(headers)
        )
    for answer in (response, closing):
        assert answer.status_code == 400
        body = answer.json()
        assert set(body) == {"error"}
        assert HEADER in body["error"]
        assert problem in body["error"]
    assert not runtime.requests, "nothing ran"


async def test_a_blank_header_is_anonymous(workspace: Path) -> None:
    runtime = model()
    store = InMemoryLongTermMemory()
    app = app_for(
        [Keeper],
        workspace,
        runtime,
        trust_header=False,
        long_term_memory=store,
        user_id_header=HEADER,
    )
    async with client_for(app) as client:
        blank = {HEADER: ""}
        body = {"message": "remember that I sail", "conversationId": "c1"}
        response = await client.post(KEEPER, json=body, headers=blank)
        closed = await client.post(f"{KEEPER}/conversations/c1/close", headers=blank)
    assert (response.status_code, closed.status_code) == (200, 200)
    assert not [r for r in runtime.requests if r.metadata.get("purpose") == "memory-extraction"]


async def test_the_environment_sets_the_header(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_USER_ID_HEADER", "X-Auth-Request-User")
    async with client_for(header_app(workspace, model())) as client:
        assert keeper_truth(await truth(client))["identity"] == "HEADER(X-Auth-Request-User)"


# --- an override wins --------------------------------------------------------------------------


async def fixed_user(connection: HTTPConnection) -> str | None:
    return "override-user"


async def test_an_override_wins_over_the_header_and_reads_custom(workspace: Path) -> None:
    runtime = model()
    app = header_app(workspace, runtime, user_id_header=HEADER)
    app.dependency_overrides[get_user_id] = fixed_user
    async with client_for(app) as client:
        data = await truth(client)
        await remembered(client, "alice", "c1")
        await eventually(lambda: _has(client, "override-user", ["I sail"]))
        assert await facts_of(client, "alice") == []
        # a malformed header is not even read: the override decides
        response = await client.post(KEEPER, json={"message": "x"}, headers={HEADER: "../x"})
        assert response.status_code == 200
    assert keeper_truth(data)["identity"] == "CUSTOM"
    assert set(data["harness"]) == SEED_KEYS


async def test_an_override_installed_after_start_up_is_reported(workspace: Path) -> None:
    app = header_app(workspace, model())
    async with client_for(app) as client:
        assert keeper_truth(await truth(client))["identity"] == "NONE"
        app.dependency_overrides[get_user_id] = fixed_user
        assert keeper_truth(await truth(client))["identity"] == "CUSTOM"
        del app.dependency_overrides[get_user_id]
        assert keeper_truth(await truth(client))["identity"] == "NONE"


def who(connection: HTTPConnection) -> str | None:
    """An app's own authentication, as a plain function (here it trusts a test header)."""
    return connection.headers.get("X-Who")


async def who_async(connection: HTTPConnection) -> str | None:
    return connection.headers.get("X-Who")


@pytest.mark.parametrize("source", [who, who_async], ids=["plain", "async"])
async def test_a_router_user_id_function_names_the_user_without_any_override(
    workspace: Path, source: Any
) -> None:
    """`create_harness_router(user_id=...)`: the app keeps no `dependency_overrides` (whose
    presence makes FastAPI rebuild every dependency graph per request), the function wins over
    the header, ownership and long-term memory follow its user, the WebSocket asks it too."""
    app = app_for(
        [Keeper],
        workspace,
        model(),
        trust_header=False,
        long_term_memory=InMemoryLongTermMemory(),
        user_id=source,
        user_id_header=HEADER,
    )
    assert app.dependency_overrides == {}
    async with serve(app) as base, client_for(app) as client:
        assert keeper_truth(await truth(client))["identity"] == "CUSTOM"
        alice = {"X-Who": "alice", HEADER: "mallory"}
        body = {"message": "remember that I sail", "conversationId": "c1"}
        assert (await client.post(KEEPER, json=body, headers=alice)).status_code == 200
        closed = await client.post(f"{KEEPER}/conversations/c1/close", headers=alice)
        assert closed.status_code == 200, closed.text
        await eventually(lambda: _has(client, "alice", ["I sail"]))
        assert await facts_of(client, "mallory") == []
        theirs = await client.get(f"{KEEPER}/conversations/c1/events", headers={"X-Who": "bob"})
        assert theirs.status_code == 404
        url = ws_url(base, KEEPER, conversationId="ws-1")
        async with connect(url, additional_headers={"X-Who": "carol"}) as socket:
            await run_over(socket, {"message": "remember that I cook"})
        await eventually(lambda: _has(client, "carol", ["I cook"]))
        app.dependency_overrides[get_user_id] = fixed_user  # an override still wins
        body = {"message": "remember that I row", "conversationId": "c2"}
        assert (await client.post(KEEPER, json=body, headers=alice)).status_code == 200
        closed = await client.post(f"{KEEPER}/conversations/c2/close", headers=alice)
        assert closed.status_code == 200, closed.text
        await eventually(lambda: _has(client, "override-user", ["I row"]))


# --- the WebSocket and AG-UI routes resolve the user the same way ------------------------------


async def test_the_websocket_takes_the_user_from_the_header(workspace: Path) -> None:
    runtime = model()
    app = header_app(workspace, runtime, user_id_header=HEADER)
    async with serve(app) as base, client_for(app) as client:
        url = ws_url(base, KEEPER, conversationId="ws-1")
        async with connect(url, additional_headers={HEADER: "alice"}) as socket:
            await run_over(socket, {"message": "remember that I cook"})
        await eventually(lambda: _has(client, "alice", ["I cook"]))
        with pytest.raises(InvalidStatus) as refused:
            async with connect(url, additional_headers={HEADER: "../etc"}):
                pass
        assert refused.value.response.status_code == 403
        with pytest.raises(InvalidStatus):
            async with connect(url, additional_headers=[(HEADER, "a"), (HEADER, "b")]):
                pass


async def test_ag_ui_takes_the_user_from_the_header(workspace: Path) -> None:
    store = InMemoryLongTermMemory()
    await store.save_fact("alice", "Prefers tea")
    seen: list[ModelRequest] = []

    def answer(request: ModelRequest) -> str:
        seen.append(request)
        return "ok"

    app = app_for(
        [Keeper],
        workspace,
        ScriptedRuntime((), default=answer),
        trust_header=False,
        long_term_memory=store,
        user_id_header=HEADER,
    )
    async with client_for(app) as client:
        client.headers[HEADER] = "alice"
        events = await run_agui(client, KEEPER, run_input("t-1", "what do I drink?"))
        bad = await client.post(
            f"{KEEPER}/ag-ui", json=run_input("t-2", "hi"), headers={HEADER: "a b"}
        )
    assert events[-1]["type"] == "RUN_FINISHED"
    assert seen[0].context == ("Known facts about this user:\n- Prefers tea",)
    assert bad.status_code == 400
    assert HEADER in bad.json()["error"]
