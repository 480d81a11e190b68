"""`Idempotency-Key` on `POST P` over loopback HTTP (embedded backend): a prompt resent with its
key after an ambiguous error streams the first run again instead of making a second turn."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2

from atmosphere_harness import ModelRequest, ScriptedRuntime, agent
from tests.agents import echo
from tests.support import client_for, make_app, parse_sse

PATH = "/atmosphere/agent/keeper"
Keeper = echo(agent(name="keeper"), "Keeper")


def counting_model(calls: list[str]) -> ScriptedRuntime:
    """Answers with the user messages it was sent, and counts its calls."""

    def turn(request: ModelRequest) -> str:
        users = [m.content for m in request.messages if m.role == "user"]
        calls.append(users[-1])
        return "seen: " + " | ".join(users)

    return ScriptedRuntime((), default=turn)


async def post(
    client: httpx2.AsyncClient, body: dict[str, str], key: str | bytes | None
) -> httpx2.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    return await client.post(PATH, json=body, headers=headers)


def summary(response: httpx2.Response) -> str:
    assert response.status_code == 200, response.text
    frames = parse_sse(response.text)
    assert frames[-1]["event"] == "complete", frames[-1]
    return str(frames[-1]["data"]["summary"])


async def test_a_resend_with_the_same_key_replays_the_first_run(tmp_path: Path) -> None:
    calls: list[str] = []
    app = make_app([Keeper], runtime=counting_model(calls), workspace=tmp_path)
    async with client_for(app) as client:
        body = {"message": "first", "conversationId": "plan-1"}
        first = await post(client, body, "order-42")
        again = await post(client, body, "order-42")
        assert summary(first) == summary(again) == "seen: first"
        assert again.headers["Idempotent-Replayed"] == "true"
        assert "Idempotent-Replayed" not in first.headers
        assert parse_sse(first.text) == parse_sse(again.text)
        assert calls == ["first"], "the model was called once"

        # The conversation holds one turn: the next prompt sees "first" once.
        assert summary(await post(client, {**body, "message": "second"}, None)) == (
            "seen: first | second"
        )
        # Another key is another prompt.
        assert summary(await post(client, {**body, "message": "third"}, "order-43")) == (
            "seen: first | second | third"
        )


async def test_the_key_is_scoped_to_the_conversation_and_a_generated_one_is_replayed(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    app = make_app([Keeper], runtime=counting_model(calls), workspace=tmp_path)
    async with client_for(app) as client:
        first = await post(client, {"message": "hello"}, "k")
        again = await post(client, {"message": "hello"}, "k")
        assert again.headers["X-Conversation-Id"] == first.headers["X-Conversation-Id"]
        assert calls == ["hello"]
        other = await post(client, {"message": "hello", "conversationId": "elsewhere"}, "k")
        assert summary(other) == "seen: hello"
        assert calls == ["hello", "hello"]


async def test_bad_keys_and_a_reused_key_are_refused_before_any_work(tmp_path: Path) -> None:
    calls: list[str] = []
    app = make_app([Keeper], runtime=counting_model(calls), workspace=tmp_path)
    async with client_for(app) as client:
        body = {"message": "first", "conversationId": "plan-2"}
        for bad in ("", "x" * 256, b"caf\xe9", "a\x7fb"):
            response = await post(client, body, bad)
            assert response.status_code == 400, (bad, response.text)
            assert "Idempotency-Key" in response.json()["error"]
        assert calls == []
        assert (await post(client, body, "k" * 255)).status_code == 200
        reused = await post(client, {**body, "message": "something else"}, "k" * 255)
        assert reused.status_code == 422
        assert "another message" in reused.json()["error"]
        assert calls == ["first"]


async def test_two_requests_with_one_key_at_once_make_one_run(tmp_path: Path) -> None:
    calls: list[str] = []
    app = make_app([Keeper], runtime=counting_model(calls), workspace=tmp_path)
    async with client_for(app) as client:
        body = {"message": "at once", "conversationId": "plan-3"}
        one, two = await asyncio.gather(post(client, body, "twin"), post(client, body, "twin"))
        assert summary(one) == summary(two) == "seen: at once"
        assert parse_sse(one.text) == parse_sse(two.text)
        assert calls == ["at once"]
