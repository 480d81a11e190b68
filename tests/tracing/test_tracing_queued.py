"""A run started in the background (`"background": true`) or waiting in the `enqueue` queue
behind another run of its conversation is still traced under its own request's `traceparent`
(over real HTTP, into the SDK's in-memory exporter)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import FastAPI
from opentelemetry.sdk.trace import ReadableSpan

from atmosphere_harness import (
    HarnessSettings,
    ModelRequest,
    ModelResponse,
    agent,
    create_harness_router,
)
from atmosphere_harness._runtimes.base import AiCapability, TextSink
from tests.agents import echo
from tests.support import client_for, parse_sse
from tests.tracing.conftest import Telemetry

Queued = echo(agent(name="queued"), "Queued")
PATH = "/atmosphere/agent/queued"
FIRST = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
SECOND = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")


def traceparent(ids: tuple[str, str]) -> str:
    return f"00-{ids[0]}-{ids[1]}-01"


class Gate:
    """Answers every call once `open` is set, so a second run queues behind the first."""

    name = "scripted"
    capabilities = frozenset({AiCapability.STREAMING})

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.calls = 0

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        self.calls += 1
        await self.open.wait()
        return ModelResponse(text="done")


def app_for(workspace: Path, runtime: Gate) -> FastAPI:
    app = FastAPI(telemetry={"tracing": False})  # no server span: the header is the parent
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace), agents=[Queued], runtime=runtime
        )
    )
    return app


def agent_spans(telemetry: Telemetry) -> list[ReadableSpan]:
    return telemetry.named("invoke_agent")


def under(span: ReadableSpan, ids: tuple[str, str]) -> bool:
    return (
        f"{span.context.trace_id:032x}" == ids[0]
        and span.parent is not None
        and f"{span.parent.span_id:016x}" == ids[1]
    )


async def until(check: object, seconds: float = 20) -> None:
    assert callable(check)
    for _ in range(int(seconds / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


async def test_an_enqueued_run_is_traced_under_its_own_traceparent(
    workspace: Path, telemetry: Telemetry
) -> None:
    runtime = Gate()
    async with client_for(app_for(workspace, runtime)) as client:

        async def ask(ids: tuple[str, str]) -> str:
            response = await client.post(
                PATH,
                json={"message": "hi", "conversationId": "c", "multitask": "enqueue"},
                headers={"traceparent": traceparent(ids)},
            )
            event: str = parse_sse(response.text)[-1]["event"]
            return event

        first = asyncio.create_task(ask(FIRST))
        await until(lambda: runtime.calls == 1)
        second = asyncio.create_task(ask(SECOND))
        await asyncio.sleep(0.3)  # the second run waits behind the first
        runtime.open.set()
        assert await first == "complete"
        assert await second == "complete"
    spans = agent_spans(telemetry)
    assert len(spans) == 2
    assert sorted(under(span, FIRST) for span in spans) == [False, True]
    assert sorted(under(span, SECOND) for span in spans) == [False, True]


async def test_a_background_run_is_traced_under_the_traceparent(
    workspace: Path, telemetry: Telemetry
) -> None:
    runtime = Gate()
    runtime.open.set()
    async with client_for(app_for(workspace, runtime)) as client:
        response = await client.post(
            PATH,
            json={"message": "hi", "conversationId": "c", "background": True},
            headers={"traceparent": traceparent(FIRST)},
        )
        assert response.status_code == 202, response.text
        await until(lambda: len(agent_spans(telemetry)) == 1)
    (span,) = agent_spans(telemetry)
    assert under(span, FIRST)


async def test_a_background_run_queued_behind_another_is_traced_under_its_traceparent(
    workspace: Path, telemetry: Telemetry
) -> None:
    runtime = Gate()
    async with client_for(app_for(workspace, runtime)) as client:
        for ids in (FIRST, SECOND):
            response = await client.post(
                PATH,
                json={"message": "hi", "conversationId": "c", "background": True},
                headers={"traceparent": traceparent(ids)},
            )
            assert response.status_code == 202, response.text
        await until(lambda: runtime.calls == 1)
        await asyncio.sleep(0.3)
        runtime.open.set()
        await until(lambda: len(agent_spans(telemetry)) == 2)
    spans = agent_spans(telemetry)
    assert sorted(under(span, FIRST) for span in spans) == [False, True]
    assert sorted(under(span, SECOND) for span in spans) == [False, True]
