"""`Idempotency-Key` on `POST P`: a prompt resent after an ambiguous error runs once.

A client that sent a prompt and got no clear answer (its connection dropped, a proxy answered
502, the server was restarting) cannot know whether the turn was taken. Sent again with the same
`Idempotency-Key`, it gets the first request's run instead of a second turn:

- the key is scoped to the endpoint, the user and the request's `conversationId` (absent counts
  as one scope of its own, and the replay names the conversation the first request created);
- the first request records the key with the run it starts, in the shared store (PostgreSQL or
  Redis: any replica finds it; embedded: this process) for `KEY_SECONDS`, then starts that run
  at once, so the run exists even if the response never reached the client;
- a resend with the key streams that run's frames from its first one (live if it is still
  running, its end if it finished), with the header `Idempotent-Replayed: true`; once the run
  is no longer kept for re-attaching (`GET P/conversations/{id}/events` has the same window),
  it is answered 409 `{"error"}` saying so, and nothing starts: the turn is in the history;
- the same key with another message is answered 422 `{"error"}`; a key that is empty, longer
  than `MAX_KEY_CHARS` or not printable ASCII is answered 400 `{"error"}` before any work.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from typing import Any

from fastapi import HTTPException
from sse_starlette import EventSourceResponse

from .._contracts import LiveRunHandle
from .._kernel.endpoint import HostedEndpoint
from .._kernel.host import HarnessHost
from .route_spec import ERROR
from .sse import follow_run

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255
KEY_SECONDS = 24 * 3600.0
"""How long a key is remembered: a resend within this time never makes a second turn."""
STARTING_SECONDS = 5.0
"""How long a resend waits for the first request's run to appear (it may be starting on another
replica just now)."""
_POLL = 0.1
DESCRIPTION = (
    f"Makes a resent prompt run once: 1-{MAX_KEY_CHARS} printable ASCII characters, remembered "
    "for 24 hours per user and conversationId. A resend streams the first request's run."
)
KEY_SCHEMA: dict[str, Any] = {"pattern": f"^[!-~]([ -~]{{0,{MAX_KEY_CHARS - 2}}}[!-~])?$"}
"""The shape `check_key` accepts, for the OpenAPI document only (a key that HTTP would strip to
another, with spaces around it, is left out). The route checks the key itself (400)."""
RESPONSES: dict[int | str, dict[str, object]] = {
    400: {**ERROR, "description": f"{HEADER} is empty, too long or not printable ASCII"},
    409: {**ERROR, "description": f"{HEADER} already ran a prompt no longer kept to replay"},
    422: {
        **ERROR,
        "description": f"Validation Error, or {HEADER} already used with another message",
    },
}


def check_key(key: str) -> str:
    """`key` if it is 1-`MAX_KEY_CHARS` printable ASCII characters, else a 400."""
    if not 0 < len(key) <= MAX_KEY_CHARS or not all(" " <= ch <= "~" for ch in key):
        raise HTTPException(
            400,
            f"{HEADER} must be 1 to {MAX_KEY_CHARS} printable ASCII characters",
        )
    return key


def _scope(path: str, user_id: str | None, conversation_id: str | None, key: str) -> str:
    raw = json.dumps([path, user_id or "", conversation_id or "", key])
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def _digest(message: str) -> str:
    return hashlib.sha256(message.encode("utf-8", "surrogatepass")).hexdigest()


async def keyed_prompt(
    host: HarnessHost,
    endpoint: HostedEndpoint,
    key: str,
    *,
    message: str,
    requested_id: str | None,
    conversation_id: str,
    user_id: str | None,
) -> EventSourceResponse:
    """`POST P` with an `Idempotency-Key` (see the module docstring)."""
    check_key(key)
    session_id = uuid.uuid4().hex
    record = json.dumps(
        {
            "session": session_id,
            "conversation": conversation_id,
            "message": _digest(message),
            "at": time.time(),
        }
    )
    scope = _scope(endpoint.path, user_id, requested_id, key)
    found = await host.prompt_keys.claim(
        scope, record, KEY_SECONDS, path=endpoint.path, conversation_id=conversation_id
    )
    first = json.loads(found) if found is not None else None
    if first is None or first.get("session") == session_id:
        live = host.start_run(
            endpoint,
            message=message,
            conversation_id=conversation_id,
            user_id=user_id,
            session_id=session_id,
        )
        return follow_run(live, 0)
    if first.get("message") != _digest(message):
        raise HTTPException(
            422, f"this {HEADER} was already used with another message: use a new key"
        )
    replayed = await _first_run(host, endpoint, first, user_id)
    if replayed is None:
        raise HTTPException(
            409,
            f"this {HEADER} already ran a prompt in conversation {first['conversation']!r}, "
            "whose run is no longer kept to replay: its turn is in the conversation's history",
        )
    response = follow_run(replayed, 0)
    response.headers["Idempotent-Replayed"] = "true"
    return response


async def _first_run(
    host: HarnessHost, endpoint: HostedEndpoint, first: dict[str, object], user_id: str | None
) -> LiveRunHandle | None:
    """The run the first request started, waiting a little if it was started just now."""
    session = str(first.get("session"))
    conversation = str(first.get("conversation"))
    started = first.get("at")
    deadline = (
        float(started) + STARTING_SECONDS if isinstance(started, int | float) else time.time()
    )
    while True:
        live = await host.runs.find(endpoint.path, conversation, session_id=session)
        if (
            live is not None
            and live.session_id == session
            and (live.user_id is None or live.user_id == user_id)
        ):
            return live
        if time.time() >= deadline:
            return None
        await asyncio.sleep(_POLL)
