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
no cancel scope of their own: `FanOutResponse` bounds them with one watchdog per viewer instead
(see `docs/planning.md`, The live plan stream).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any

from fastapi import Depends, Header, HTTPException, Query
from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError

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
from .sse import PING_SECONDS, SEND_TIMEOUT, HarnessEventSource

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


class FanOutResponse(HarnessEventSource):
    """`HarnessEventSource` (a reader cut off is one INFO line) whose sends carry no per-send
    cancel scope.

    sse-starlette bounds each send with `anyio.move_on_after` (about 11 us a send on the
    benchmark VM): fine for one client, but paid once per viewer per update it was the largest
    pure-Python cost of a 1,000-viewer fan-out. Here a send only records when it began, and the
    response's ping task, which already wakes every `ping` seconds, also checks that record: a
    viewer whose current send has not returned after `send_timeout` seconds is disconnected
    (the ping task fails and the task group tears the response down, as a per-send timeout
    did). No task is added per viewer.

    It overrides two of sse-starlette's private methods (`_send_with_timeout`, `_ping`; written
    against 3.7); `tests/http/test_planning_http.py` holds the behaviour (pings, a stalled
    viewer cut off) so a change in the library shows up as a failing test, not a silent one.
    """

    def __init__(self, content: AsyncIterator[bytes], *, send_timeout: float, **kw: Any) -> None:
        self._sending_since: float | None = None
        super().__init__(content, send_timeout=send_timeout, **kw)

    async def _send_with_timeout(self, send: Any, message: Any) -> None:
        self._sending_since = asyncio.get_running_loop().time()
        try:
            await send(message)
        except BaseException:
            self._send_interrupted = True
            raise
        finally:
            self._sending_since = None

    async def _ping(self, send: Any) -> None:
        loop = asyncio.get_running_loop()
        limit = float(self.send_timeout or 0)
        next_ping = loop.time() + self.ping_interval
        while self.active:
            since = self._sending_since
            now = loop.time()
            if limit and since is not None and now - since >= limit:
                # The same send is still pending: the viewer stopped reading.
                self._send_interrupted = True
                raise SendTimeoutError()
            if now >= next_ping:
                next_ping = now + self.ping_interval
                if since is None:
                    await self._send_with_timeout(send, _PING)
                continue
            # Idle, wake for the ping, or after `limit` to look at a send begun meanwhile (with
            # the defaults the ping comes first: no extra wake-ups); sending, at its deadline.
            wake = (
                next_ping
                if not limit
                else min(next_ping, (now if since is None else since) + limit)
            )
            await asyncio.sleep(max(wake - now, 0.0))


_PING = {"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True}


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

    return FanOutResponse(stream(), ping=PING_SECONDS, send_timeout=SEND_TIMEOUT)


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
