"""Per-endpoint routes. Each builder returns the routes one agent serves at its path `P`.

Builders work from the agent's declaration (`AgentSpec`: its path and owner), so the router
declares every route when it is built, before the app starts: `include_router(prefix=...)`
applies to them and `app.openapi()` lists them. A handler finds the running host at request
time (`get_harness`, from the lifespan state) and its endpoint by path (`hosted_endpoint`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sse_starlette import EventSourceResponse

from .._ids import new_conversation_id
from .._registry import AgentSpec
from .agui import agui_routes
from .approvals import approval_routes
from .deps import HarnessDep, get_user_id, hosted_endpoint
from .memory import close_routes
from .planning import plan_event_routes
from .route_spec import SSE_RESPONSE, PromptRequest, RouteBuilder, RouteSpec
from .runs import run_event_routes
from .sse import stream_prompt
from .websocket import websocket_routes


def prompt_routes(spec: AgentSpec) -> list[RouteSpec]:
    async def post_prompt(
        body: PromptRequest,
        request: Request,
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
    ) -> EventSourceResponse:
        endpoint = hosted_endpoint(host, spec.path)
        conversation_id = body.conversationId or new_conversation_id()
        return stream_prompt(
            host,
            endpoint,
            message=body.message,
            conversation_id=conversation_id,
            user_id=user_id,
            headers=request.headers,
        )

    return [
        RouteSpec(
            spec.path,
            post_prompt,
            methods=("POST",),
            options={
                "summary": f"Prompt {spec.owner}",
                "response_class": EventSourceResponse,
                "responses": SSE_RESPONSE,
            },
        )
    ]


ROUTE_BUILDERS: list[RouteBuilder] = [
    prompt_routes,
    plan_event_routes,
    close_routes,
    websocket_routes,
    agui_routes,
    approval_routes,
    run_event_routes,
]
"""Every per-endpoint route builder, in declaration order."""
