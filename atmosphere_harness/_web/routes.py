"""Per-endpoint routes. Each builder returns the routes one agent serves at its path `P`.

Builders work from the agent's declaration (`AgentSpec`: its path and owner), so the router
declares every route when it is built, before the app starts: `include_router(prefix=...)`
applies to them and `app.openapi()` lists them. A handler finds the running host at request
time (`get_harness`, from the lifespan state) and its endpoint by path (`hosted_endpoint`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from .._ids import new_conversation_id
from .._registry import AgentSpec
from .._tracing import incoming
from . import idempotency
from .agui import agui_routes
from .approvals import approval_routes
from .conversations import conversation_routes
from .deps import HarnessDep, get_user_id, hosted_endpoint
from .memory import close_routes
from .ownership import require_conversation, unknown_conversation
from .planning import plan_event_routes
from .route_spec import (
    ERROR,
    NOT_FOUND_RESPONSE,
    SSE_RESPONSE,
    PromptRequest,
    RouteBuilder,
    RouteSpec,
)
from .runs import RUN_STARTED, run_control_routes, run_event_routes
from .sse import admit, stream_prompt
from .websocket import websocket_routes


def prompt_routes(spec: AgentSpec) -> list[RouteSpec]:
    async def post_prompt(
        body: PromptRequest,
        request: Request,
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
        idempotency_key: Annotated[
            str | None,
            Header(
                alias=idempotency.HEADER,
                description=idempotency.DESCRIPTION,
                json_schema_extra=idempotency.KEY_SCHEMA,
            ),
        ] = None,
    ) -> Response:
        endpoint = hosted_endpoint(host, spec.path)
        conversation_id = body.conversationId or new_conversation_id()
        if idempotency_key is None and not body.background and body.multitask == "enqueue":
            # The common prompt: its claim rides on its lock's first try (`kernel.entry`).
            entry = await host.enter(
                endpoint,
                message=body.message,
                conversation_id=conversation_id,
                user_id=user_id,
                ticket=host.control.ticket(
                    path=endpoint.path, conversation_id=conversation_id, user_id=user_id
                ),
            )
            if entry is None:
                raise unknown_conversation(conversation_id)
            return stream_prompt(
                host,
                endpoint,
                message=body.message,
                conversation_id=conversation_id,
                user_id=user_id,
                headers=request.headers,
                entry=entry,
            )
        await require_conversation(
            host, spec.path, conversation_id, user_id, claim=True, message=body.message
        )
        # A `traceparent` is the parent span of the run this request starts.
        traced = incoming(request.headers, enabled=host.settings.groups.tracing.enabled)
        if idempotency_key is not None:
            if body.background or body.multitask != "enqueue":
                raise HTTPException(
                    400,
                    f"{idempotency.HEADER} applies to a streamed prompt with multitask "
                    "'enqueue'; send background or another multitask without it",
                )
            with traced:
                return await idempotency.keyed_prompt(
                    host,
                    endpoint,
                    idempotency_key,
                    message=body.message,
                    requested_id=body.conversationId,
                    conversation_id=conversation_id,
                    user_id=user_id,
                )
        if body.background:
            with traced:
                ticket = await host.submit(
                    endpoint,
                    message=body.message,
                    conversation_id=conversation_id,
                    user_id=user_id,
                    multitask=body.multitask,
                    background=True,
                )
            return JSONResponse(
                {
                    "runId": ticket.run_id,
                    "conversationId": conversation_id,
                    "status": ticket.status,
                },
                status_code=202,
                headers={"X-Run-Id": ticket.run_id, "X-Conversation-Id": conversation_id},
            )
        held = await admit(
            host,
            endpoint,
            message=body.message,
            conversation_id=conversation_id,
            user_id=user_id,
            multitask=body.multitask,
        )
        return stream_prompt(
            host,
            endpoint,
            message=body.message,
            conversation_id=conversation_id,
            user_id=user_id,
            ticket=held,
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
                "responses": {
                    **SSE_RESPONSE,
                    **NOT_FOUND_RESPONSE,
                    **idempotency.RESPONSES,
                    202: {"description": "A background run was started", **RUN_STARTED},
                    400: {
                        "description": f"{idempotency.HEADER} is empty, too long or not "
                        "printable ASCII, or sent with background or a multitask other than "
                        "enqueue",
                        **ERROR,
                    },
                    409: {
                        "description": "multitask: reject, and a run is in flight; or "
                        f"{idempotency.HEADER} already ran a prompt no longer kept to replay",
                        **ERROR,
                    },
                },
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
    run_control_routes,
    conversation_routes,
]
"""Every per-endpoint route builder, in declaration order."""
