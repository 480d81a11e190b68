"""Per-endpoint routes. Each builder returns the routes one hosted endpoint serves at its path `P`.

The router's lifespan mounts them on the app once the endpoints are resolved (their paths come
from the decorated classes, which may be declared after the router object exists).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sse_starlette import EventSourceResponse

from ..ids import check_conversation_id, new_conversation_id
from ..kernel.endpoint import HostedEndpoint
from ..kernel.host import HarnessHost
from .agui import agui_routes
from .approvals import approval_routes
from .deps import CONVERSATION_ID_SCHEMA, get_user_id
from .memory import close_routes
from .planning import plan_event_routes
from .runs import run_event_routes
from .sse import stream_prompt
from .websocket import websocket_routes

MAX_MESSAGE_CHARS = 1_000_000


@dataclass(frozen=True)
class RouteSpec:
    """One route to mount: an HTTP route (`methods`) or a WebSocket route (`websocket=True`)."""

    path: str
    endpoint: Callable[..., Any]
    methods: tuple[str, ...] = ()
    websocket: bool = False
    options: dict[str, Any] = field(default_factory=dict)


RouteBuilder = Callable[[HostedEndpoint, HarnessHost], list[RouteSpec]]


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


def prompt_routes(endpoint: HostedEndpoint, host: HarnessHost) -> list[RouteSpec]:
    async def post_prompt(
        body: PromptRequest,
        user_id: Annotated[str | None, Depends(get_user_id)],
    ) -> EventSourceResponse:
        conversation_id = body.conversationId or new_conversation_id()
        return stream_prompt(
            host, endpoint, message=body.message, conversation_id=conversation_id, user_id=user_id
        )

    return [
        RouteSpec(
            endpoint.path,
            post_prompt,
            methods=("POST",),
            options={
                "summary": f"Prompt {endpoint.owner}",
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
"""Every per-endpoint route builder, in mount order."""
