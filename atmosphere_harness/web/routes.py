"""Per-endpoint routes. Each builder returns the routes one agent serves at its path `P`.

Builders work from the agent's declaration (`AgentSpec`: its path and owner), so the router
declares every route when it is built, before the app starts: `include_router(prefix=...)`
applies to them and `app.openapi()` lists them. A handler finds the running host at request
time (`get_harness`, from the lifespan state) and its endpoint by path (`hosted_endpoint`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sse_starlette import EventSourceResponse

from ..ids import check_conversation_id, new_conversation_id
from ..registry import AgentSpec
from .agui import agui_routes
from .approvals import approval_routes
from .deps import CONVERSATION_ID_SCHEMA, HarnessDep, get_user_id, hosted_endpoint
from .memory import close_routes
from .planning import plan_event_routes
from .runs import run_event_routes
from .sse import stream_prompt
from .websocket import websocket_routes

MAX_MESSAGE_CHARS = 1_000_000


@dataclass(frozen=True)
class RouteSpec:
    """One route to declare: an HTTP route (`methods`) or a WebSocket route (`websocket=True`)."""

    path: str
    endpoint: Callable[..., Any]
    methods: tuple[str, ...] = ()
    websocket: bool = False
    options: dict[str, Any] = field(default_factory=dict)


RouteBuilder = Callable[[AgentSpec], list[RouteSpec]]


class PromptRequest(BaseModel):
    """Body of `POST P`."""

    model_config = ConfigDict(extra="ignore")

    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    conversationId: str | None = Field(  # noqa: N815 - the wire name is fixed
        None,
        description="Continue this conversation; a new id is generated when absent.",
        json_schema_extra=CONVERSATION_ID_SCHEMA,
    )

    @field_validator("conversationId")
    @classmethod
    def _check_id(cls, value: str | None) -> str | None:
        return None if value is None else check_conversation_id(value)


SSE_RESPONSE = {200: {"content": {"text/event-stream": {}}, "description": "A stream of frames"}}


def prompt_routes(spec: AgentSpec) -> list[RouteSpec]:
    async def post_prompt(
        body: PromptRequest,
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
    ) -> EventSourceResponse:
        endpoint = hosted_endpoint(host, spec.path)
        conversation_id = body.conversationId or new_conversation_id()
        return stream_prompt(
            host, endpoint, message=body.message, conversation_id=conversation_id, user_id=user_id
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
