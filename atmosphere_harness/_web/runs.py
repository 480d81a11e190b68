"""`GET P/conversations/{id}/events`: re-attach to a conversation's run after losing its stream.

The stream replays the frames of the run after `Last-Event-ID` (a frame's `seq`; the
`lastEventId` query parameter works too) and follows the run to its end. `sessionId` picks the
run (every frame carries it); without it, the conversation's oldest unfinished run, else its most
recent one. An id from another run (a `sessionId` that does not match) replays from the start.
404 when the conversation has no live or recently finished run (or it belongs to another user).

With durable runs, a run the server was running when it was killed is resumed at start-up with
its journalled frames, so a client re-attaches after a restart with the `Last-Event-ID` it had:
it gets the frames it missed (the resumed run's new ones continue the same seqs). A run that
finished before the restart is in the conversation's history, not here.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Query
from sse_starlette import EventSourceResponse

from .._registry import AgentSpec
from .deps import HarnessDep, get_user_id, hosted_endpoint
from .ownership import owned_conversation
from .route_spec import SSE_RESPONSE, RouteSpec
from .sse import follow_run


def run_event_routes(spec: AgentSpec) -> list[RouteSpec]:

    owned = Depends(owned_conversation(spec.path))

    async def follow(
        *,
        conversation_id: str = owned,
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
        session_id: Annotated[str | None, Query(alias="sessionId")] = None,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
        resume_from: Annotated[
            str | None,
            Query(
                alias="lastEventId",
                description="Resume after this seq (for clients that cannot set the header).",
            ),
        ] = None,
    ) -> EventSourceResponse:
        endpoint = hosted_endpoint(host, spec.path)
        live = await host.runs.find(endpoint.path, conversation_id, session_id=session_id)
        if live is None or (live.user_id is not None and live.user_id != user_id):
            raise HTTPException(404, f"no run to follow in conversation {conversation_id!r}")
        raw = last_event_id if last_event_id is not None else resume_from
        try:
            after = max(0, int(raw)) if raw is not None and raw.strip() else 0
        except ValueError:
            raise HTTPException(400, "Last-Event-ID must be a frame seq (an integer)") from None
        if session_id is not None and live.session_id != session_id:
            after = 0
        return follow_run(live, after)

    return [
        RouteSpec(
            spec.path + "/conversations/{conversation_id}/events",
            follow,
            methods=("GET",),
            options={
                "summary": f"Follow the current run of a conversation of {spec.owner}",
                "response_class": EventSourceResponse,
                "responses": SSE_RESPONSE,
            },
        )
    ]
