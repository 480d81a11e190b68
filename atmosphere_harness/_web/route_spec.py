"""The shapes every route builder shares: `RouteSpec`, the prompt body, the SSE response doc.

Kept apart from `routes` (which lists the builders) so a builder imports them at the top of its
module instead of late, inside a function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .._ids import check_conversation_id
from .._registry import AgentSpec
from .deps import CONVERSATION_ID_SCHEMA
from .errors import ERROR_SCHEMA

MAX_MESSAGE_CHARS = 1_000_000

Multitask = Literal["reject", "enqueue", "interrupt", "rollback"]
"""What a prompt does when its conversation already has a run in flight (see docs/runs.md)."""
MULTITASK_MODES: tuple[str, ...] = get_args(Multitask)


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

    background: bool = Field(
        False,
        strict=True,
        description="Answer 202 with the run's id at once; the run goes on with no client "
        "connected (`GET P/runs/{runId}`, `GET P/conversations/{id}/events`).",
    )
    multitask: Multitask = Field(
        "enqueue",
        description="What this prompt does when its conversation has a run in flight: reject "
        "(409), enqueue (run after it), interrupt (cancel it, then run), rollback (cancel it, "
        "keep its turn out of the history, then run).",
    )

    @field_validator("conversationId")
    @classmethod
    def _check_id(cls, value: str | None) -> str | None:
        return None if value is None else check_conversation_id(value)


SSE_RESPONSE = {200: {"content": {"text/event-stream": {}}, "description": "A stream of frames"}}

ERROR: dict[str, Any] = {"content": {"application/json": {"schema": ERROR_SCHEMA}}}
"""An `{"error"}` JSON body, to spread into a `responses=` entry beside its description."""


def error_responses(described: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for the errors a route answers (`{status: description}`), each an
    `{"error"}` JSON body."""
    return {status: {"description": text, **ERROR} for status, text in described.items()}


BACKEND_DOWN = "The state backend (PostgreSQL or Redis) cannot be reached right now; retry later"
"""The 503 of every route that reads a conversation's owner or state from the backend."""

NOT_FOUND_RESPONSE = error_responses(
    {404: "No such conversation for this user (none, or another user's)", 503: BACKEND_DOWN}
)
