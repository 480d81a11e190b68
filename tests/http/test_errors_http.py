"""Every error a harness route answers is JSON `{"error": str}` over real HTTP, never FastAPI's
`{"detail"}`: validation (422, lone surrogates and huge inputs included), dependency errors
(400, 401), not found (404), a body over `max_request_bytes` (413), and `HarnessError`s mapped
by type in `web.errors`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import APIRouter, FastAPI

from atmosphere_harness import (
    DelegationError,
    FileNotFoundInWorkspace,
    FileSystemError,
    HarnessError,
    HarnessSettings,
    ModelError,
    PlanStoreError,
    ScriptedRuntime,
    ToolArgumentError,
    agent,
    create_harness_router,
    get_user_id,
)
from atmosphere_harness._errors import PlanBusFull
from atmosphere_harness._web.deps import user_id_from_header
from atmosphere_harness._web.errors import HarnessRoute, Problem
from tests.agents import echo
from tests.support import client_for, make_app, parse_sse

PATH = "/atmosphere/agent/error-echo"
TOKEN = "errors-admin-token"
MIB = 1024 * 1024


ErrorEcho = echo(agent(name="error-echo", harness=()), "ErrorEcho")


def echo_app(workspace: Path, **settings: Any) -> FastAPI:
    runtime = ScriptedRuntime(default=lambda request: "ok")
    return make_app([ErrorEcho], runtime=runtime, workspace=workspace, **settings)


def assert_error_body(response: httpx2.Response, status: int) -> dict[str, Any]:
    """`status`, JSON, a non-blank string `error`, and no `detail`."""
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert isinstance(body, dict), body
    assert "detail" not in body, body
    assert isinstance(body["error"], str), body
    assert body["error"].strip(), body
    return body


def raw_json(text: str) -> dict[str, Any]:
    return {"content": text.encode("ascii"), "headers": {"Content-Type": "application/json"}}


# --- 422 ----------------------------------------------------------------------------------------


async def test_validation_errors_are_error_bodies_naming_the_field(workspace: Path) -> None:
    async with client_for(echo_app(workspace)) as client:
        wrong_type = await client.post(PATH, json={"message": 5})
        missing = await client.post(PATH, json={})
        bad_id = await client.post(PATH, json={"message": "hi", "conversationId": "../etc"})
        not_json = await client.post(PATH, **raw_json('{"message": '))
        pending = await client.get(f"{PATH}/approvals")
    assert "body.message" in assert_error_body(wrong_type, 422)["error"]
    assert "body.message" in assert_error_body(missing, 422)["error"]
    assert "conversationId must be" in assert_error_body(bad_id, 422)["error"]
    assert "JSON decode error" in assert_error_body(not_json, 422)["error"]
    assert "query.conversationId" in assert_error_body(pending, 422)["error"]


async def test_a_lone_surrogate_in_a_failing_field_is_a_422_not_a_500(workspace: Path) -> None:
    async with client_for(echo_app(workspace)) as client:
        bad_id = await client.post(PATH, **raw_json('{"message": 5, "conversationId": "\\ud800"}'))
        bad_message = await client.post(PATH, **raw_json('{"message": ["\\ud800x"]}'))
        bad_key = await client.post(
            f"{PATH}/approvals/abc", **raw_json('{"approve": true, "\\udfff": 1}')
        )
    for response in (bad_id, bad_message, bad_key):
        body = assert_error_body(response, 422)
        assert "\ud800" not in body["error"]


async def test_a_huge_invalid_message_is_never_echoed(workspace: Path) -> None:
    huge = "y" * (10 * MIB)
    async with client_for(echo_app(workspace, max_request_bytes=32 * MIB)) as client:
        too_long = await client.post(PATH, json={"message": huge})
        wrong_type = await client.post(PATH, json={"message": [huge]})
    for response in (too_long, wrong_type):
        body = assert_error_body(response, 422)
        assert len(response.content) < 4096, len(response.content)
        assert "yyyyyyyyyy" not in body["error"]
    assert "at most 1000000 characters" in too_long.json()["error"]


# --- 400 / 401 / 404 / 409 from routes and dependencies -------------------------------------


async def test_dependency_and_route_errors_are_error_bodies(workspace: Path) -> None:
    app = echo_app(workspace, admin_token=TOKEN)
    app.dependency_overrides[get_user_id] = user_id_from_header
    async with client_for(app) as client:
        bad_user = await client.post(
            PATH, json={"message": "hi"}, headers={"X-User-Id": "../../etc"}
        )
        no_token = await client.get("/api/admin/agents/error-echo/plan", params={"sessionId": "c"})
        traversal = await client.get(
            "/api/admin/agents/error-echo/plan",
            params={"sessionId": "../x"},
            headers={"X-Atmosphere-Auth": TOKEN},
        )
        no_surface = await client.get(
            "/api/admin/agents/error-echo/files",
            params={"sessionId": "c"},
            headers={"X-Atmosphere-Auth": TOKEN},
        )
        unknown_approval = await client.post(f"{PATH}/approvals/nope", json={"approve": True})
        close_unknown = await client.post(f"{PATH}/conversations/never/close")
        no_asset = await client.get("/atmosphere/console/nothing.js")
    assert "X-User-Id" in assert_error_body(bad_user, 400)["error"]
    assert set(assert_error_body(no_token, 401)) == {"error", "hint"}
    assert "illegal path characters" in assert_error_body(traversal, 400)["error"]
    assert "has no filesystem" in assert_error_body(no_surface, 404)["error"]
    assert "unknown or expired approval" in assert_error_body(unknown_approval, 404)["error"]
    assert "unknown conversation" in assert_error_body(close_unknown, 404)["error"]
    assert "no console asset" in assert_error_body(no_asset, 404)["error"]


# --- 413 ----------------------------------------------------------------------------------------


async def test_a_body_over_the_limit_is_413_before_it_is_parsed(workspace: Path) -> None:
    async with client_for(echo_app(workspace, max_request_bytes=2048)) as client:
        fits = await client.post(PATH, json={"message": "x" * 1900})
        declared = await client.post(PATH, json={"message": "x" * 5000})
        approval = await client.post(f"{PATH}/approvals/a", json={"approve": True, "x": "y" * 3000})

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"message": "'
            for _ in range(10):
                yield b"z" * 1000
            yield b'"}'

        chunked = await client.post(
            PATH, content=chunks(), headers={"Content-Type": "application/json"}
        )
    assert fits.status_code == 200
    assert parse_sse(fits.text)[-1]["event"] == "complete"
    size = int(declared.request.headers["content-length"])
    assert assert_error_body(declared, 413)["error"] == (
        f"request body is {size} bytes; the limit is 2048 (ATMOSPHERE_MAX_REQUEST_BYTES)"
    )
    assert "the limit is 2048" in assert_error_body(approval, 413)["error"]
    assert chunked.request.headers.get("transfer-encoding") == "chunked"
    assert assert_error_body(chunked, 413)["error"] == (
        "request body is more than 2048 bytes; the limit is 2048 (ATMOSPHERE_MAX_REQUEST_BYTES)"
    )


async def test_the_default_limit_is_4_mib_and_the_environment_sets_it(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"message": "x" * (4 * MIB)}
    async with client_for(echo_app(workspace)) as client:
        over = await client.post(PATH, json=body)
    assert "the limit is 4194304" in assert_error_body(over, 413)["error"]

    monkeypatch.setenv("ATMOSPHERE_MAX_REQUEST_BYTES", "4096")
    monkeypatch.setenv("ATMOSPHERE_WORKSPACE_ROOT", str(workspace))
    assert HarnessSettings().max_request_bytes == 4096
    app = FastAPI()
    app.include_router(
        create_harness_router(
            None, agents=[ErrorEcho], runtime=ScriptedRuntime(default=lambda r: "ok")
        )
    )
    async with client_for(app) as client:
        over = await client.post(PATH, json={"message": "x" * 5000})
    assert "the limit is 4096" in assert_error_body(over, 413)["error"]


# --- HarnessError subclasses, mapped by type ---------------------------------------------------

RAISED: dict[str, HarnessError | Problem] = {
    "not-found": FileNotFoundInWorkspace("File not found: a.md"),
    "file": FileSystemError("path must not be blank"),
    "plan": PlanStoreError("too many steps"),
    "arguments": ToolArgumentError(["a: required"]),
    "bus": PlanBusFull("too many viewers"),
    "model": ModelError("the model is down"),
    "delegation": DelegationError("member failed"),
    "other": HarnessError("something else"),
    "problem": Problem(418, "short and stout", hint="tip me over"),
}
EXPECTED = {
    "not-found": 404,
    "file": 400,
    "plan": 400,
    "arguments": 422,
    "bus": 503,
    "model": 502,
    "delegation": 502,
    "other": 500,
    "problem": 418,
}


async def test_harness_errors_map_to_statuses_by_type() -> None:
    router = APIRouter(route_class=HarnessRoute)

    @router.get("/raise/{kind}")
    async def raise_it(kind: str) -> None:
        raise RAISED[kind]

    app = FastAPI()
    app.include_router(router)
    async with client_for(app) as client:
        for kind, status in EXPECTED.items():
            body = assert_error_body(await client.get(f"/raise/{kind}"), status)
            assert body["error"] == str(RAISED[kind]) or kind == "problem", (kind, body)
        problem = (await client.get("/raise/problem")).json()
    assert problem == {"error": "short and stout", "hint": "tip me over"}


async def test_the_openapi_document_states_the_error_body(workspace: Path) -> None:
    async with client_for(echo_app(workspace)) as client:
        document = (await client.get("/openapi.json")).json()
    post = document["paths"][PATH]["post"]
    for status in ("413", "422"):
        schema = post["responses"][status]["content"]["application/json"]["schema"]
        assert schema["required"] == ["error"], (status, schema)
    assert "HTTPValidationError" not in json.dumps(document["paths"])
