"""`GET P/plan/events` (the live plan of a conversation) and `get_plan_store` for host routes.

The stream, for `?conversationId=c` (optionally resuming with `Last-Event-ID`):

1. `retry: 3000` (reconnect after 3 s);
2. a resumable id the bus still knows -> only the `plan-update`s published after it;
   otherwise one `plan-snapshot` event (the stored plan, or an empty one) whose id is the
   conversation's current position;
3. every later `plan-update` as it is published; a `: ping` comment every 15 s.

Every event's `data:` is the plan in its wire shape
(`{"steps", "goal", "conversationId", "agentId"}`) and its `id:` resumes the stream.

Fan-out cost: one update reaches every viewer of a conversation, so what a viewer costs per
update is paid a thousand times for a thousand viewers. Each update's SSE event is encoded once
(`update_frame`) and the same bytes object is handed to every viewer, and a viewer's sends carry
no cancel scope of their own: `sse.EventStream` bounds them with one watchdog per viewer instead
(see `docs/planning.md`, The live plan stream).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Sequence
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Query
from sse_starlette import EventSourceResponse

from .._errors import BackendUnavailable, PlanBusFull
from .._log import get_logger
from .._planning.attach import SURFACE
from .._planning.bus import PlanEvent, PlanEventBus, encode
from .._planning.model import AgentPlan
from .._planning.store import OwnerPlanStores, PlanStore
from .._planning.tools import BUS_SERVICE, STORE_SERVICE, agent_id_for
from .._registry import AgentSpec
from .deps import HarnessDep, hosted_endpoint
from .ownership import owned_conversation
from .route_spec import BACKEND_DOWN, RouteSpec, error_responses
from .sse import PING_SECONDS, SEND_TIMEOUT, EventStream

log = get_logger(__name__)

PLAN_SNAPSHOT = "plan-snapshot"
PLAN_UPDATE = "plan-update"
RETRY_MS = 3000
_SEP = "\r\n"


def get_plan_store(host: HarnessDep) -> PlanStore:
    """Every owner's plans, for the host's own routes: `agentId` is the agent (owner) name.

    `await plans.get("assistant", conversation_id)` reads what the `assistant` agent planned
    in that conversation. Override it like any dependency:
    `app.dependency_overrides[get_plan_store] = lambda: my_store`.
    """
    return OwnerPlanStores(lambda owner: host.surface(SURFACE, owner))


PlanStoreDep = Annotated[PlanStore, Depends(get_plan_store)]


def sse_event(event: str, event_id: str | None, data: str) -> bytes:
    """One SSE event; `data` is compact JSON, which never contains a line break."""
    head = f"id: {event_id}{_SEP}" if event_id is not None else ""
    return f"{head}event: {event}{_SEP}data: {data}{_SEP}{_SEP}".encode()


@functools.lru_cache(maxsize=64)
def update_frame(event_id: str, data: str) -> bytes:
    """A `plan-update` event's bytes, built once per update and shared by all its viewers.

    Keyed by the event's id and JSON (the same `str` objects for every viewer, so a hit costs a
    dict lookup); 64 entries cover the updates any fan-out can still be writing.
    """
    return sse_event(PLAN_UPDATE, event_id, data)


def updates_chunk(batch: Sequence[PlanEvent]) -> bytes:
    """What one write to a viewer carries: one shared frame, or a backlog joined."""
    if len(batch) == 1:
        return update_frame(batch[0].id, batch[0].json)
    return b"".join(update_frame(event.id, event.json) for event in batch)


def plan_event_response(
    bus: PlanEventBus,
    store: PlanStore,
    *,
    owner: str,
    agent_id: str,
    conversation_id: str,
    last_event_id: str | None,
) -> EventSourceResponse:
    """The live plan of one owner's conversation as SSE (this module's docstring gives the order).

    Shared by `GET P/plan/events` and the admin API's `GET .../plan/events`, so both streams
    are the same bytes. `conversation_id` must already be validated.
    """

    async def stream() -> AsyncIterator[bytes]:
        yield f"retry: {RETRY_MS}{_SEP}{_SEP}".encode()
        try:
            async with bus.subscribe(
                owner, conversation_id, last_event_id=last_event_id
            ) as subscription:
                if subscription.replay is None:
                    plan = await store.get(agent_id, conversation_id) or AgentPlan()
                    data = plan.to_wire(conversation_id=conversation_id, agent_id=agent_id)
                    yield sse_event(PLAN_SNAPSHOT, subscription.cursor, encode(data))
                elif subscription.replay:
                    yield updates_chunk(subscription.replay)
                async for batch in subscription:
                    yield updates_chunk(batch)
        except (PlanBusFull, BackendUnavailable) as exc:
            # Too many viewers, or the shared backend is away: say so, the client retries.
            yield sse_event("error", None, encode({"message": str(exc)}))

    return EventStream(stream(), ping=PING_SECONDS, send_timeout=SEND_TIMEOUT)


def plan_event_routes(spec: AgentSpec) -> list[RouteSpec]:
    """`GET P/plan/events`; 404 when the endpoint has no plan surface (planning not attached)."""

    owned = Depends(owned_conversation(spec.path, source="query"))

    async def plan_events(
        *,
        host: HarnessDep,
        conversation_id: str = owned,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
        resume_from: Annotated[
            str | None,
            Query(
                alias="lastEventId",
                description="Resume after this id (for clients that cannot set the header).",
            ),
        ] = None,
    ) -> EventSourceResponse:
        endpoint = hosted_endpoint(host, spec.path)
        store: PlanStore | None = endpoint.services.get(STORE_SERVICE)
        if store is None:
            raise HTTPException(404, f"{spec.path} has no plan: planning is not attached to it")
        bus: PlanEventBus | None = endpoint.services.get(BUS_SERVICE)
        if bus is None:
            raise HTTPException(503, "the plan event bus is not running")
        return plan_event_response(
            bus,
            store,
            owner=endpoint.owner,
            agent_id=agent_id_for(endpoint),
            conversation_id=conversation_id,
            last_event_id=last_event_id or resume_from,
        )

    return [
        RouteSpec(
            f"{spec.path}/plan/events",
            plan_events,
            methods=("GET",),
            options={
                "summary": f"Live plan of {spec.owner}",
                "response_class": EventSourceResponse,
                "responses": {
                    200: {
                        "content": {"text/event-stream": {}},
                        "description": "plan-snapshot, then plan-update events",
                    },
                    **error_responses(
                        {
                            404: "Planning is not attached to this endpoint, or the "
                            "conversation is not this user's",
                            503: BACKEND_DOWN,
                        }
                    ),
                },
            },
        )
    ]
