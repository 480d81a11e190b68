"""`POST P/approvals/{approvalId}` (answer a gated tool call) and `GET P/approvals` (pending ones).

The answer route works whether or not the prompt's stream is connected: approvals live in the
app's `ApprovalRegistry`, not in the connection. Answers: 200 `{"approvalId", "status"}`; 404 for
an unknown or expired id, one of another endpoint, or one whose run belongs to another user
(never 403: a refusal does not say whether the approval exists); 409 when it was already
answered. `GET P/approvals?conversationId=` answers 404 for a conversation that is not the
caller's.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from .._governance.approvals import Answer, AnswerStatus, ApprovalStore
from .._governance.primitive import APPROVALS_SERVICE
from .._kernel.host import HarnessHost
from .._registry import AgentSpec
from .deps import HarnessDep, get_user_id, hosted_endpoint
from .ownership import owned_conversation
from .route_spec import RouteSpec, error_responses


class ApprovalAnswer(BaseModel):
    """Body of `POST P/approvals/{approvalId}`."""

    model_config = ConfigDict(extra="forbid")

    approve: bool
    arguments: dict[str, Any] | None = Field(
        None, description="Run the tool with these arguments instead of the model's."
    )


def _registry(host: HarnessHost) -> ApprovalStore:
    registry = host.services.get(APPROVALS_SERVICE)
    if registry is None:
        raise HTTPException(503, "approvals are not running (no governance primitive)")
    return registry


def approval_routes(spec: AgentSpec) -> list[RouteSpec]:

    async def answer(
        approval_id: str,
        body: ApprovalAnswer,
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
    ) -> dict[str, Any]:
        endpoint = hosted_endpoint(host, spec.path)
        status = await _registry(host).answer(
            endpoint.path,
            approval_id,
            Answer(body.approve, body.arguments),
            user_id=user_id,
        )
        if status in (AnswerStatus.UNKNOWN, AnswerStatus.FORBIDDEN):
            # Another user's approval is answered as one that does not exist.
            raise HTTPException(404, f"unknown or expired approval {approval_id!r}")
        if status is AnswerStatus.ALREADY_ANSWERED:
            raise HTTPException(409, f"approval {approval_id!r} was already answered")
        return {"approvalId": approval_id, "status": "approved" if body.approve else "denied"}

    owned = Depends(owned_conversation(spec.path, source="query"))

    async def pending(
        *,
        conversation_id: str = owned,
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
    ) -> dict[str, Any]:
        endpoint = hosted_endpoint(host, spec.path)
        waiting = await _registry(host).pending(endpoint.path, conversation_id, user_id=user_id)
        return {
            "conversationId": conversation_id,
            "approvals": [entry.to_wire() for entry in waiting],
        }

    return [
        RouteSpec(
            spec.path + "/approvals/{approval_id}",
            answer,
            methods=("POST",),
            options={
                "summary": f"Answer an approval-required frame of {spec.owner}",
                "responses": error_responses(
                    {
                        404: "No such approval waiting for this user (none, expired or "
                        "another user's)",
                        409: "The approval was already answered",
                        503: "Approvals are not running (no governance primitive)",
                    }
                ),
            },
        ),
        RouteSpec(
            spec.path + "/approvals",
            pending,
            methods=("GET",),
            options={
                "summary": f"Approvals waiting in a conversation of {spec.owner}",
                "responses": error_responses(
                    {503: "Approvals are not running (no governance primitive)"}
                ),
            },
        ),
    ]
