"""The OpenAPI document states the shape of every conversation id the routes accept.

Without it, a client (or an API fuzzer: the reliability suite's schemathesis run found this)
can only guess: every generated "valid" request to the plan stream, the approvals list, a
conversation's events or an AG-UI run was refused with 4xx, so nothing behind the id check was
ever reached.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from atmosphere_harness._ids import CONVERSATION_ID_PATTERN, check_conversation_id
from samples.personal_assistant.app import Assistant
from tests.support import client_for, make_app

ID_NAMES = {"conversationId", "conversation_id", "sessionId", "threadId"}


def parameters_named(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path, operations in document["paths"].items():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                # A run follower's `sessionId` is a run's id, not a conversation id.
                follower = path.startswith("/atmosphere/") and path.endswith("/events")
                if parameter["name"] in ID_NAMES and not (
                    follower and parameter["name"] == "sessionId"
                ):
                    found.append((f"{path} {parameter['name']}", parameter["schema"]))
    for name, component in document["components"]["schemas"].items():
        for field, schema in component.get("properties", {}).items():
            if field in ID_NAMES:
                found.append((f"{name}.{field}", schema))
    return found


async def test_every_conversation_id_is_documented_with_its_pattern(workspace: Path) -> None:
    async with client_for(make_app([Assistant], workspace=workspace)) as client:
        document = (await client.get("/openapi.json")).json()
    found = dict(parameters_named(document))
    assert len(found) >= 8, sorted(found)
    assert {where: schema.get("pattern") for where, schema in found.items()} == dict.fromkeys(
        found, CONVERSATION_ID_PATTERN
    )


@given(st.text(max_size=140) | st.from_regex(CONVERSATION_ID_PATTERN, fullmatch=True))
def test_the_documented_pattern_is_exactly_the_check(value: str) -> None:
    try:
        check_conversation_id(value)
        accepted = True
    except ValueError:
        accepted = False
    assert bool(re.search(CONVERSATION_ID_PATTERN, value)) == accepted


async def test_every_route_of_a_conversation_documents_its_refusals(workspace: Path) -> None:
    """A route that names a conversation reads its owner from the state backend: it may answer
    404 (not this user's) and 503 (the backend is down), each with an `{"error"}` body."""
    async with client_for(make_app([Assistant], workspace=workspace)) as client:
        document = (await client.get("/openapi.json")).json()
    undocumented = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            names = {parameter["name"] for parameter in operation.get("parameters", [])}
            if not names & {"conversationId", "conversation_id"} or path.startswith("/api/admin"):
                continue
            for status in ("404", "503"):
                answer = operation["responses"].get(status, {})
                if "application/json" not in answer.get("content", {}):
                    undocumented.append(f"{method.upper()} {path} {status}")
    assert not undocumented, undocumented
