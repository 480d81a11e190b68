"""The one ownership check of the web layer: who may name a conversation in a request.

A conversation belongs to the user whose prompt first used its id (`kernel.owners`). Every route
that names a conversation goes through this module, and answers the same 404 `{"error"}` for an
id nobody owns and for another user's (never 403: a refusal does not say whether the id exists),
before it does anything else:

- a prompt route (`POST P`, `WS P/ws`, `POST P/ag-ui`) claims the id: an unused id becomes
  the caller's, an owned one must be theirs. A streamed `POST P` (multitask `enqueue`, no
  `Idempotency-Key`) claims in its entry (`HarnessHost.enter`: the claim rides on the
  conversation lock's first try) and answers `unknown_conversation` when refused; the others
  call `require_conversation(..., claim=True)`;
- a route that names the conversation in its path (`{conversation_id}`) or its `conversationId`
  query parameter declares the dependency `owned_conversation(spec.path)` (or
  `owned_conversation(spec.path, source="query")`), which validates the id (400) and checks it
  (404), and hands the handler the id. Bind it outside the signature (annotations are strings
  here, resolved in the module's globals, where `spec` does not exist):

  ```
  owned = Depends(owned_conversation(spec.path))

  async def messages(*, conversation_id: str = owned, host: HarnessDep) -> ...:
  ```

The admin API (token) reads every conversation and does not check ownership.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Path, Query

from .._ids import check_conversation_id
from .._kernel.host import HarnessHost
from .deps import CONVERSATION_ID_SCHEMA, HarnessDep, answers, get_user_id
from .route_spec import BACKEND_DOWN

OWNED_ANSWERS = {
    400: "The conversation id is not an id",
    404: "No such conversation for this user (none, or another user's)",
    503: BACKEND_DOWN,
}


def unknown_conversation(conversation_id: str) -> HTTPException:
    """The one refusal: 404, whether nobody owns the id or another user does."""
    return HTTPException(404, f"unknown conversation {conversation_id!r}")


async def require_conversation(
    host: HarnessHost,
    path: str,
    conversation_id: str,
    user_id: str | None,
    *,
    claim: bool = False,
    message: str = "",
) -> None:
    """404 (`unknown_conversation`) unless `user_id` owns the conversation of endpoint `path`.

    `claim=True` is a prompt's check: an id nobody owns becomes the user's first (atomically,
    on every replica), titled by the prompt's `message`. `conversation_id` must already be
    valid.
    """
    access = host.access
    if claim:
        allowed = await access.claim(path, conversation_id, user_id, message)
    else:
        allowed = await access.allows(path, conversation_id, user_id)
    if not allowed:
        raise unknown_conversation(conversation_id)


def valid_conversation_id(value: str, status: int = 400) -> str:
    """`value` if it is a conversation id; else an HTTP error (400 for a path or query
    parameter, 422 for a body field) saying what an id must be."""
    try:
        return check_conversation_id(value)
    except ValueError as exc:
        raise HTTPException(status, str(exc)) from None


def owned_conversation(
    path: str, *, source: Literal["path", "query"] = "path"
) -> Callable[..., Awaitable[str]]:
    """A dependency giving the conversation a route names, once it is valid and the caller's.

    `path` is the endpoint's path (`spec.path`); `source="path"` reads the route's
    `{conversation_id}` path parameter, `source="query"` its `conversationId` query parameter.
    An invalid id answers 400, an id the caller does not own 404, both before the handler runs.
    """
    if source == "path":

        @answers(OWNED_ANSWERS)
        async def from_path(
            conversation_id: Annotated[str, Path(json_schema_extra=CONVERSATION_ID_SCHEMA)],
            host: HarnessDep,
            user_id: Annotated[str | None, Depends(get_user_id)],
        ) -> str:
            checked = valid_conversation_id(conversation_id)
            await require_conversation(host, path, checked, user_id)
            return checked

        return from_path

    @answers(OWNED_ANSWERS)
    async def from_query(
        conversation_id: Annotated[
            str, Query(alias="conversationId", json_schema_extra=CONVERSATION_ID_SCHEMA)
        ],
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
    ) -> str:
        checked = valid_conversation_id(conversation_id)
        await require_conversation(host, path, checked, user_id)
        return checked

    return from_query
