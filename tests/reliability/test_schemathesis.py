"""Schemathesis against the OpenAPI document of a running app with every primitive on.

The server (a subprocess: the personal-assistant sample's coordinator, its fleet and the
opted-in `ai_endpoint`, on the scripted demo model, admin token set, users named by
`X-User-Id`) is fuzzed operation by operation with generated valid and invalid requests, as a
user and with the admin token, so the admin routes are reached past their gate. Every answer
must be below 500, every error (4xx) must be JSON `{"error": message}` (never FastAPI's
`detail`), and the document must tell the truth (`CHECKS`): every status and content type a
route answers is declared, bodies match their schemas, a request the schema allows is accepted
and one it forbids is refused. Streams are bounded: a prompt's stream is read to its terminal
frame (the demo model always ends in a few rounds); an endless plan stream is read up to its
first event, then closed.

The WebSocket route is not in the OpenAPI document; generated junk messages are sent to it
below, and each must get an `error` notice while the socket stays usable.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import schemathesis
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup

from atmosphere_harness._ids import CONVERSATION_ID_PATTERN

from .apps import OWNER, PATH
from .server import ServerProcess, running
from .verify import ADMIN_TOKEN, AUTH

USER = {"X-User-Id": "fuzzer"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    positive_data_acceptance,
]
"""Schemathesis' checks, each on every generated request (`except_for` lists the one gap)."""

READ_GUARD = 30.0
"""Hang guard for one response (the demo model answers in milliseconds)."""

EXAMPLES = 12
HEAVY_EXAMPLES = 25
"""Examples per operation and generation mode (valid, invalid)."""
FLEET_MEMBER = "/atmosphere/agent/writer"
SEED = "fuzz-seed"


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "workspace").mkdir()
    env = {"ATMOSPHERE_ADMIN_TOKEN": ADMIN_TOKEN}
    with running("fuzz", root / "workspace", root / "server.log", env) as server:
        # A conversation with a plan and a file, for the seeded requests to aim at.
        body = {
            "message": "plan a short task and save the result to a file",
            "conversationId": SEED,
        }
        seed = httpx2.post(server.url + PATH, json=body, headers=USER, timeout=READ_GUARD)
        assert '"event":"complete"' in seed.text, seed.text[-500:]
        yield server


@pytest.fixture(scope="module")
def api(fuzz_server: ServerProcess) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")


ROUTING_ERRORS = {404: "Not Found", 405: "Method Not Allowed"}
"""The app's own answers before any harness route is found (e.g. a path parameter holding `/`)."""


def error_message(body: Any, status: int | None = None) -> str | None:
    """The message of a harness error body, `{"error": str}` (never FastAPI's `detail`); only
    the app's routing errors (`ROUTING_ERRORS`) keep FastAPI's `{"detail": ...}`."""
    if not isinstance(body, dict):
        return None
    if status in ROUTING_ERRORS and body == {"detail": ROUTING_ERRORS[status]}:
        return body["detail"]
    value = body.get("error")
    if "detail" in body or not isinstance(value, str) or not value.strip():
        return None
    return value


def sse_data(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:].strip()) for line in text.splitlines() if line.startswith("data:")]


def send(case: schemathesis.Case, client: httpx2.Client) -> tuple[httpx2.Response, str]:
    """Send `case` and read its body, bounded: `(response, text read)`."""
    kwargs = case.as_transport_kwargs(
        base_url=str(client.base_url).rstrip("/"), headers={**USER, **AUTH}
    )
    request: dict[str, Any] = {
        "method": kwargs["method"],
        "url": kwargs["url"],
        "headers": kwargs.get("headers") or {},
        "params": kwargs.get("params") or {},
        "cookies": kwargs.get("cookies") or {},
    }
    if "json" in kwargs:
        request["json"] = kwargs["json"]
    elif kwargs.get("data") is not None:
        request["content"] = kwargs["data"]
    with client.stream(**request) as response:
        streaming = response.headers.get("content-type", "").startswith("text/event-stream")
        if not streaming:
            return response, response.read().decode("utf-8")
        if case.method.upper() == "GET":
            # A plan stream never ends: its first event (the snapshot) is enough.
            lines: list[str] = []
            for line in response.iter_lines():
                lines.append(line)
                if line.startswith("data:"):
                    break
            return response, "\n".join(lines)
        return response, response.read().decode("utf-8")


def except_for(case: schemathesis.Case) -> list[Any]:
    """The checks a request is exempt from, each for a reason the document cannot state.

    AG-UI's run input is the protocol's own schema (`ag_ui.core`), whose messages and content
    parts leave the `role` / `type` discriminator optional although the union needs it: a
    generated "valid" run input may lack it. `test_ag_ui_runs_end_with_a_finish_or_an_error`
    generates valid run inputs and requires each to be accepted instead.
    """
    if case.path.endswith("/ag-ui"):
        return [positive_data_acceptance]
    return []


def honest(case: schemathesis.Case) -> schemathesis.Case:
    """A valid request made to follow the rules that span two parameters, which OpenAPI
    cannot express and the document states in words (so `positive_data_acceptance` holds it
    to them):

    - `Idempotency-Key` names one request (a reused key with another message is 422) and
      applies to a streamed prompt with `multitask: enqueue` only (400 otherwise);
    - an admin read names its conversation by `conversationId` or by its older name
      `sessionId`, one of the two, equal when both are sent (400 otherwise);
    - a directory listing's `path` follows the workspace's path rules (docs/filesystem.md),
      too many to state as a pattern: a generated one is replaced by a plain path;
    - a page `cursor` is one a previous page gave (`nextCursor`), never made up: dropped.
    """
    headers = case.headers
    if headers and "Idempotency-Key" in headers:
        body = case.body if isinstance(case.body, dict) else {}
        if body.get("background", False) is False and body.get("multitask", "enqueue") == "enqueue":
            headers["Idempotency-Key"] = uuid.uuid4().hex
        else:
            del headers["Idempotency-Key"]
    query = case.query
    if query is not None:
        query.pop("cursor", None)
    if case.path.startswith("/api/admin/agents/") and query is not None:
        given = query.get("conversationId", query.get("sessionId", SEED))
        query["conversationId"] = given
        query.pop("sessionId", None)
        if case.path.endswith("/files") and "path" in query:
            query["path"] = "notes"
    return case


def check(case: schemathesis.Case, client: httpx2.Client) -> None:
    """One generated request: schemathesis' `CHECKS`; an error is JSON with a message; a
    stream is whole."""
    if case.meta is not None and case.meta.generation.mode is GenerationMode.POSITIVE:
        case = honest(case)
    response, text = send(case, client)
    where = f"{case.method} {case.formatted_path} -> {response.status_code}: {text[:300]!r}"
    read = httpx2.Response(
        response.status_code,
        headers=response.headers,
        content=text.encode("utf-8"),
        request=response.request,
    )
    read.elapsed = datetime.timedelta(0)  # a stream's time is the run's, not the API's
    case.validate_response(
        read, checks=CHECKS, excluded_checks=except_for(case), headers={**USER, **AUTH}
    )
    assert response.status_code < 500, where
    if response.status_code >= 400:
        assert response.headers.get("content-type", "").startswith("application/json"), where
        assert error_message(json.loads(text), response.status_code) is not None, where
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        frames = sse_data(text)
        assert frames, where
        if case.method.upper() == "POST" and "event" in frames[-1]:
            # A prompt's stream ends with exactly one terminal frame.
            assert frames[-1]["event"] in ("complete", "error"), where
            if frames[-1]["event"] == "error":
                assert str(frames[-1]["data"].get("message", "")).strip(), where


def seeded(operation: schemathesis.APIOperation) -> dict[str, Any]:
    """Overrides that point an operation at the seeded conversation (see `fuzz_server`), so the
    generated requests get past "unknown agent/conversation" into the code behind it: the
    admin API's `path`, a finished run's events, the approvals of a real conversation."""
    names = {parameter.name for parameter in operation.iter_parameters()}
    path: dict[str, Any] = {}
    query: dict[str, Any] = {}
    if "name" in names:
        path["name"] = OWNER
    if "conversation_id" in names:
        path["conversation_id"] = SEED
    for name in ("sessionId", "conversationId"):
        if name in names and operation.path.startswith(("/api/admin/", PATH)):
            query[name] = SEED
    return {"path_parameters": path, "query": query} if path or query else {}


def fuzz(api: schemathesis.BaseSchema, base_url: str, examples: int, *, every: bool) -> None:
    """Valid and invalid requests for each operation, free and aimed at the seeded
    conversation; all failing operations are reported at once.

    Without `every`, the fleet member's routes are left out: they are the coordinator's, built
    by the same code (the heavy run fuzzes them too). Schemathesis' own pytest integration
    (`from_fixture`) does not run on pytest 9, so each operation's strategy is driven by
    Hypothesis directly.
    """
    failures: list[str] = []
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 27, [operation.label for operation in operations]
    if not every:
        operations = [op for op in operations if not op.path.startswith(FLEET_MEMBER)]
    client = httpx2.Client(base_url=base_url, timeout=READ_GUARD)
    for operation in operations:
        variants = [("free", {})]
        if seeded(operation):
            variants.append(("seeded", seeded(operation)))
        for (label, overrides), mode in itertools.product(
            variants, (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ):

            @settings(
                max_examples=examples,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
                derandomize=True,
            )
            @given(case=operation.as_strategy(mode, **overrides))
            def one(case: schemathesis.Case) -> None:
                check(case, client)

            try:
                one()
            except Unsatisfiable:
                pass  # nothing of this operation can be sent invalid (no parameter, no body)
            except (Exception, FailureGroup) as exc:  # FailureGroup: schemathesis' checks
                failures.append(f"{operation.label} ({label}, {mode.value}): {exc}")
    client.close()
    assert not failures, "\n\n".join(failures)


def test_no_server_error_and_every_error_is_json_with_a_message(
    api: schemathesis.BaseSchema, fuzz_server: ServerProcess
) -> None:
    fuzz(api, fuzz_server.url, EXAMPLES, every=False)


@pytest.mark.heavy
def test_more_examples_still_no_server_error(
    api: schemathesis.BaseSchema, fuzz_server: ServerProcess
) -> None:
    fuzz(api, fuzz_server.url, HEAVY_EXAMPLES, every=True)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)

RUN_INPUTS = st.fixed_dictionaries(
    {
        "threadId": st.from_regex(CONVERSATION_ID_PATTERN, fullmatch=True),
        "runId": st.text(max_size=40),
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.text(max_size=20),
                    "role": st.sampled_from(["user", "assistant", "system"]),
                    "content": st.text(max_size=200),
                }
            ),
            max_size=4,
        ),
    },
    optional={
        "state": JSONISH,
        "forwardedProps": JSONISH,
        "context": st.lists(
            st.fixed_dictionaries({"description": st.text(), "value": st.text()}), max_size=2
        ),
        "tools": st.just([]),
    },
)


def test_ag_ui_runs_end_with_a_finish_or_an_error(fuzz_server: ServerProcess) -> None:
    """AG-UI's own body schema is too loose to generate valid runs from (its message union),
    so valid-shaped run inputs are generated here: each answers 200 and ends with
    RUN_FINISHED, or 422 JSON when it has no user text."""

    @settings(max_examples=40, deadline=None, database=None, derandomize=True)
    @given(body=RUN_INPUTS)
    def one(body: dict[str, Any]) -> None:
        url = f"{fuzz_server.url}/atmosphere/ai-chat/ag-ui"
        response = httpx2.post(url, json=body, timeout=READ_GUARD)
        where = f"{body!r} -> {response.status_code}: {response.text[:300]!r}"
        assert response.status_code in (200, 422), where
        if response.status_code == 422:
            assert error_message(response.json()) is not None, where
            return
        events = [
            json.loads(line[5:].strip())
            for line in response.text.splitlines()
            if line.startswith("data:")
        ]
        assert events[0]["type"] == "RUN_STARTED", where
        assert events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR"), where

    one()


JUNK = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200),
    JSONISH.map(json.dumps),
    st.fixed_dictionaries(
        {"message": st.one_of(st.just(""), st.integers(), st.none(), st.text(max_size=5))},
        optional={"conversationId": st.text(max_size=20)},
    ).map(json.dumps),
)


def test_websocket_answers_junk_with_notices(fuzz_server: ServerProcess) -> None:
    url = fuzz_server.url.replace("http://", "ws://") + "/atmosphere/ai-chat/ws"

    @settings(max_examples=60, deadline=None, database=None)
    @given(messages=st.lists(JUNK, min_size=1, max_size=5))
    def exchange(messages: list[str | bytes]) -> None:
        asyncio.run(_exchange(url, messages))

    exchange()


async def _exchange(url: str, messages: list[str | bytes]) -> None:
    """Each junk message gets one `error` notice; then a real prompt still completes."""
    async with websockets.connect(url, open_timeout=READ_GUARD) as socket:
        for message in messages:
            if isinstance(message, str):
                with contextlib.suppress(ValueError):
                    body = json.loads(message)
                    if (
                        isinstance(body, dict)
                        and isinstance(body.get("message"), str)
                        and (body["message"])
                    ):
                        continue  # a valid prompt, not junk (a prompt is tested below)
            await socket.send(message)
            notice = json.loads(await asyncio.wait_for(socket.recv(), READ_GUARD))
            assert notice["event"] == "error", notice
            assert notice["data"]["message"].strip(), notice
        await socket.send(json.dumps({"message": "hello"}))
        while True:
            frame = json.loads(await asyncio.wait_for(socket.recv(), READ_GUARD))
            if frame["event"] in ("complete", "error"):
                break
        assert frame["event"] == "complete", frame
