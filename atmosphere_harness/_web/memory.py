"""`POST P/conversations/{id}/close` and `get_long_term_memory` for host routes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException
from starlette.requests import HTTPConnection

from .._memory.long_term import LongTermMemory
from .._memory.primitive import LONG_TERM_MEMORY_SERVICE
from .._registry import AgentSpec
from .deps import HarnessDep, get_harness, get_user_id, hosted_endpoint
from .ownership import owned_conversation
from .route_spec import RouteSpec


def close_routes(spec: AgentSpec) -> list[RouteSpec]:
    """`POST P/conversations/{id}/close`: the conversation ends; extraction runs in background.

    404 for a conversation that is not the caller's, or that no primitive knows.
    """

    owned = Depends(owned_conversation(spec.path))

    async def close_conversation(
        *,
        conversation_id: str = owned,
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
    ) -> dict[str, Any]:
        endpoint = hosted_endpoint(host, spec.path)
        if not await host.close_conversation(endpoint.path, conversation_id, user_id):
            raise HTTPException(404, f"unknown conversation {conversation_id!r}")
        return {"conversationId": conversation_id, "closed": True}

    return [
        RouteSpec(
            spec.path + "/conversations/{conversation_id}/close",
            close_conversation,
            methods=("POST",),
            options={"summary": f"Close a conversation of {spec.owner}"},
        )
    ]


def get_long_term_memory(connection: HTTPConnection) -> LongTermMemory:
    """The app's long-term memory store (503 when the memory primitive is not running)."""
    store = get_harness(connection).services.get(LONG_TERM_MEMORY_SERVICE)
    if not isinstance(store, LongTermMemory):
        raise HTTPException(503, "long-term memory is not configured")
    return store


LongTermMemoryDep = Annotated[LongTermMemory, Depends(get_long_term_memory)]
