"""Conversation routes: a user's conversations, a conversation's history, deleting one.

`GET P/conversations` lists the caller's conversations at the endpoint, newest first (the time
of each one's last prompt, from the ownership record: `contracts.ConversationOwners.page`);
`GET P/conversations/{id}/messages` pages through its stored history, oldest first. Both are the
owner's alone (another user's conversation answers 404, as for an id nobody used). A page
holds at most `limit` entries (1-100, default 20) and a `nextCursor` to pass back for the
next one (`null` on the last page); a cursor is opaque and only good for the route and
conversation that gave it. `DELETE P/conversations/{id}` deletes the conversation from every
store (`kernel.forget`): 204, or 409 while it has a run in flight.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Query, Response

from .._contracts import user_key
from .._memory.primitive import CONVERSATION_MEMORY_SERVICE
from .._registry import AgentSpec
from .._runtimes.base import Message
from .deps import HarnessDep, get_user_id, hosted_endpoint
from .ownership import owned_conversation
from .route_spec import ERROR, RouteSpec

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
WIRE_ROLES = ("user", "assistant", "tool")
"""The roles a history shows (a system message is the harness's own, never stored history)."""

LIMIT_PATTERN = "^(100|[1-9][0-9]?)$"
"""A `limit` as the OpenAPI document states it and `page_limit` checks it: 1 to `MAX_LIMIT`."""
LimitQuery = Annotated[
    str | None,
    Query(
        description=f"Entries per page, 1-{MAX_LIMIT} (default {DEFAULT_LIMIT}).",
        json_schema_extra={"pattern": LIMIT_PATTERN},
    ),
]
CursorQuery = Annotated[
    str | None, Query(description="The `nextCursor` of the previous page; absent for the first.")
]


def page_limit(raw: str | None) -> int:
    """The `limit` query parameter, or 400 saying what it must be."""
    if raw is None:
        return DEFAULT_LIMIT
    if re.fullmatch(LIMIT_PATTERN[1:-1], raw) is None:
        raise HTTPException(400, f"limit must be an integer from 1 to {MAX_LIMIT}")
    return int(raw)


def encode_cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def decode_cursor(raw: str | None) -> Any:
    """The value a cursor carries (`None` for the first page), or 400."""
    if raw is None:
        return None
    try:
        return json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, binascii.Error):
        raise HTTPException(400, "cursor is not a nextCursor this route gave") from None


def message_wire(message: Message) -> dict[str, Any]:
    """A stored message as `GET P/conversations/{id}/messages` answers it."""
    body: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        body["toolCalls"] = [
            {"id": call.id, "name": call.name, "arguments": dict(call.arguments)}
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        body["toolCallId"] = message.tool_call_id
    return body


def _page_schema(key: str, item: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {
                        key: {"type": "array", "items": item},
                        "nextCursor": {"type": ["string", "null"]},
                    },
                    "required": [key, "nextCursor"],
                }
            }
        }
    }


CONVERSATION_PAGE = _page_schema(
    "conversations",
    {
        "type": "object",
        "properties": {
            "conversationId": {"type": "string"},
            "updatedAt": {"type": "number", "description": "Last prompt, epoch seconds"},
            "title": {"type": "string"},
        },
        "required": ["conversationId", "updatedAt"],
    },
)
MESSAGE_PAGE = _page_schema(
    "messages",
    {
        "type": "object",
        "properties": {
            "role": {"type": "string", "enum": list(WIRE_ROLES)},
            "content": {"type": "string"},
            "toolCalls": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "name": {"type": "string"},
                        "arguments": {"type": "object"},
                    },
                    "required": ["id", "name", "arguments"],
                },
            },
            "toolCallId": {"type": "string"},
        },
        "required": ["role", "content"],
    },
)


def conversation_routes(spec: AgentSpec) -> list[RouteSpec]:

    async def list_conversations(
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
        limit: LimitQuery = None,
        cursor: CursorQuery = None,
    ) -> dict[str, Any]:
        endpoint = hosted_endpoint(host, spec.path)
        size = page_limit(limit)
        after = decode_cursor(cursor)
        if after is not None:
            if not (
                isinstance(after, list)
                and len(after) == 2
                and isinstance(after[0], int | float)
                and isinstance(after[1], str)
            ):
                raise HTTPException(400, "cursor is not a nextCursor this route gave")
            after = (float(after[0]), after[1])
        rows = await host.access.owners.page(endpoint.path, user_key(user_id), size + 1, after)
        more = len(rows) > size
        rows = rows[:size]
        listed = []
        for row in rows:
            item: dict[str, Any] = {
                "conversationId": row.conversation_id,
                "updatedAt": row.updated_at,
            }
            if row.title:
                item["title"] = row.title
            listed.append(item)
        last = rows[-1] if rows else None
        return {
            "conversations": listed,
            "nextCursor": (
                encode_cursor([last.updated_at, last.conversation_id])
                if more and last is not None
                else None
            ),
        }

    owned = Depends(owned_conversation(spec.path))

    async def messages(
        *,
        conversation_id: str = owned,
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
        limit: LimitQuery = None,
        cursor: CursorQuery = None,
    ) -> dict[str, Any]:
        endpoint = hosted_endpoint(host, spec.path)
        size = page_limit(limit)
        start = decode_cursor(cursor)
        if start is None:
            start = 0
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise HTTPException(400, "cursor is not a nextCursor this route gave")
        memory = endpoint.services.get(CONVERSATION_MEMORY_SERVICE)
        stored = [] if memory is None else await memory.messages(conversation_id, user_id)
        shown = [message for message in stored if message.role in WIRE_ROLES]
        page = shown[start : start + size]
        end = start + len(page)
        return {
            "messages": [message_wire(message) for message in page],
            "nextCursor": encode_cursor(end) if end < len(shown) else None,
        }

    async def delete(*, conversation_id: str = owned, host: HarnessDep) -> Response:
        endpoint = hosted_endpoint(host, spec.path)
        await host.forget_conversation(endpoint.path, conversation_id)
        return Response(status_code=204)

    return [
        RouteSpec(
            spec.path + "/conversations",
            list_conversations,
            methods=("GET",),
            options={
                "summary": f"The caller's conversations with {spec.owner}, newest first",
                "responses": {
                    200: {"description": "A page of conversations", **CONVERSATION_PAGE},
                    400: {"description": "A bad limit or cursor", **ERROR},
                },
            },
        ),
        RouteSpec(
            spec.path + "/conversations/{conversation_id}/messages",
            messages,
            methods=("GET",),
            options={
                "summary": f"The history of a conversation of {spec.owner}, oldest first",
                "responses": {
                    200: {"description": "A page of messages", **MESSAGE_PAGE},
                    400: {"description": "A bad conversation id, limit or cursor", **ERROR},
                    404: {"description": "No such conversation of this user", **ERROR},
                },
            },
        ),
        RouteSpec(
            spec.path + "/conversations/{conversation_id}",
            delete,
            methods=("DELETE",),
            options={
                "summary": f"Delete a conversation of {spec.owner} and everything of it",
                "status_code": 204,
                "response_class": Response,
                "responses": {
                    204: {"description": "Deleted: no store holds anything of it"},
                    400: {"description": "A bad conversation id", **ERROR},
                    404: {"description": "No such conversation of this user", **ERROR},
                    409: {"description": "The conversation has a run in flight", **ERROR},
                },
            },
        ),
    ]
