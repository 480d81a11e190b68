"""Run routes: re-attach to a run's stream, read a run's status, cancel a run.

`GET P/conversations/{id}/events`: re-attach to a conversation's run after losing its stream.

The stream replays the frames of the run after `Last-Event-ID` (a frame's `seq`; the
`lastEventId` query parameter works too) and follows the run to its end. `sessionId` picks the
run (every frame carries it); without it, the conversation's oldest unfinished run, else its most
recent one. An id from another run (a `sessionId` that does not match) replays from the start.
404 when the conversation has no live or recently finished run (or it belongs to another user).

With durable runs, a run the server was running when it was killed is resumed at start-up with
its journalled frames, so a client re-attaches after a restart with the `Last-Event-ID` it had:
it gets the frames it missed (the resumed run's new ones continue the same seqs). A run that
finished before the restart is in the conversation's history, not here.

`GET P/runs/{runId}` answers a run's status, usage and error, and `POST P/runs/{runId}/cancel`
stops it, from any replica (`kernel.control`). A run belongs to the user who started it:
another user, or no user, gets 404, as for an id nobody knows.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Depends, Header, HTTPException, Path, Query
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from .._contracts import RUN_STATUSES, RunRecord
from .._registry import AgentSpec
from .deps import HarnessDep, get_user_id, hosted_endpoint
from .ownership import owned_conversation
from .route_spec import ERROR, SSE_RESPONSE, RouteSpec
from .sse import follow_run

SEQ_PATTERN = "^[0-9]{0,18}$"
"""A frame's seq, as `Last-Event-ID` resumes after it (empty: from the start); anything else is
a 422 like any malformed parameter."""


def run_event_routes(spec: AgentSpec) -> list[RouteSpec]:

    owned = Depends(owned_conversation(spec.path))

    async def follow(
        *,
        conversation_id: str = owned,
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
        session_id: Annotated[str | None, Query(alias="sessionId")] = None,
        last_event_id: Annotated[
            str,
            Header(
                alias="Last-Event-ID", pattern=SEQ_PATTERN, description="Resume after this seq."
            ),
        ] = "",
        resume_from: Annotated[
            str,
            Query(
                alias="lastEventId",
                pattern=SEQ_PATTERN,
                description="Resume after this seq (for clients that cannot set the header).",
            ),
        ] = "",
    ) -> EventSourceResponse:
        endpoint = hosted_endpoint(host, spec.path)
        live = await host.runs.find(endpoint.path, conversation_id, session_id=session_id)
        if live is None or (live.user_id is not None and live.user_id != user_id):
            raise HTTPException(404, f"no run to follow in conversation {conversation_id!r}")
        raw = last_event_id or resume_from
        after = int(raw) if raw else 0
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


RUN_ID_PATTERN = "^[0-9a-f]{32}$"
_RUN_ID = re.compile("[0-9a-f]{32}")
RUN_STARTED = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "runId": {"type": "string", "pattern": RUN_ID_PATTERN},
                    "conversationId": {"type": "string"},
                    "status": {"type": "string", "enum": ["queued", "running"]},
                },
                "required": ["runId", "conversationId", "status"],
            }
        }
    }
}
RUN_STATUS = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "runId": {"type": "string", "pattern": RUN_ID_PATTERN},
                    "conversationId": {"type": "string"},
                    "status": {"type": "string", "enum": list(RUN_STATUSES)},
                    "usage": {"type": "object", "additionalProperties": {"type": "integer"}},
                    "error": {
                        "type": "object",
                        "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
                    },
                },
                "required": ["runId", "conversationId", "status", "usage"],
            }
        }
    }
}


def run_wire(record: RunRecord) -> dict[str, Any]:
    """A run record as `GET P/runs/{runId}` answers it."""
    body: dict[str, Any] = {
        "runId": record.run_id,
        "conversationId": record.conversation_id,
        "status": record.status,
        "usage": dict(record.usage or {}),
    }
    if record.error:
        body["error"] = dict(record.error)
    return body


def run_control_routes(spec: AgentSpec) -> list[RouteSpec]:

    async def owned(host: HarnessDep, run_id: str, user_id: str | None) -> RunRecord:
        endpoint = hosted_endpoint(host, spec.path)
        if not _RUN_ID.fullmatch(run_id):
            raise HTTPException(400, "a run id is 32 lowercase hex digits (the runId you got)")
        record = await host.control.get(run_id)
        if record is None or record.path != endpoint.path or record.user_id != user_id:
            # Another user's run reads as unknown: its existence is not disclosed.
            raise HTTPException(404, f"unknown run {run_id!r}")
        return record

    async def status(
        run_id: Annotated[str, Path(json_schema_extra={"pattern": RUN_ID_PATTERN})],
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
    ) -> dict[str, Any]:
        return run_wire(await owned(host, run_id, user_id))

    async def cancel(
        run_id: Annotated[str, Path(json_schema_extra={"pattern": RUN_ID_PATTERN})],
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
    ) -> JSONResponse:
        record = await owned(host, run_id, user_id)
        if record.active:
            await host.control.cancel(run_id, "cancel")
        return JSONResponse(run_wire(record), status_code=202)

    return [
        RouteSpec(
            spec.path + "/runs/{run_id}",
            status,
            methods=("GET",),
            options={
                "summary": f"The status of a run of {spec.owner}",
                "responses": {
                    200: {"description": "The run's status, usage and error", **RUN_STATUS},
                    400: {"description": "Not a run id", **ERROR},
                    404: {"description": "No such run of this user", **ERROR},
                },
            },
        ),
        RouteSpec(
            spec.path + "/runs/{run_id}/cancel",
            cancel,
            methods=("POST",),
            options={
                "summary": f"Cancel a run of {spec.owner}",
                "status_code": 202,
                "response_class": JSONResponse,
                "responses": {
                    202: {"description": "Cancelling; the run ends within a second", **RUN_STATUS},
                    400: {"description": "Not a run id", **ERROR},
                    404: {"description": "No such run of this user", **ERROR},
                },
            },
        ),
    ]
