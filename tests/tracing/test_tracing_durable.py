"""A durable run resumed after a restart continues under a link to its first life's span."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from atmosphere_harness import (
    HarnessSettings,
    ModelRequest,
    ScriptedRuntime,
    StreamingSession,
    ToolCall,
    agent,
    prompt,
    tool,
)
from atmosphere_harness._assembly import build_host
from atmosphere_harness._registry import spec_of
from tests.tracing.conftest import Telemetry

STARTED = asyncio.Event()


@agent(name="patient")
class Patient:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)

    @tool
    async def wait_here(self) -> str:
        """Wait until the server stops."""
        STARTED.set()
        await asyncio.Event().wait()
        return "never"


def waits_then_answers(request: ModelRequest) -> Any:
    if request.messages[-1].role == "user":
        return [ToolCall("wait_here", {}, "call-wait")]
    return "done"


async def test_a_resumed_run_links_to_its_first_life(workspace: Path, telemetry: Telemetry) -> None:
    settings = HarnessSettings(workspace_root=workspace, durable_runs=True)
    first = build_host(
        settings,
        runtime=ScriptedRuntime((), default=waits_then_answers),
        specs=[spec_of(Patient)],
    )
    await first.start()
    try:
        STARTED.clear()
        first.start_run(
            first.endpoints["/atmosphere/agent/patient"],
            message="wait",
            conversation_id="durable-1",
            user_id=None,
        )
        await asyncio.wait_for(STARTED.wait(), 30)
    finally:
        await first.stop()  # the run is suspended, to resume on the next start
    (cut,) = telemetry.named("invoke_agent")
    assert cut.attributes["atmosphere.run.status"] == "suspended"

    second = build_host(
        settings,
        runtime=ScriptedRuntime((), default=waits_then_answers),
        specs=[spec_of(Patient)],
    )
    await second.start()  # resumes it
    try:
        live = await second.runs.find("/atmosphere/agent/patient", "durable-1")
        assert live is not None
        frames = [frame async for frame in live.follow(0)]
    finally:
        await second.stop()
    assert frames[-1].event == "complete", frames[-1]
    runs = telemetry.named("invoke_agent")
    assert len(runs) == 2
    resumed = runs[1]
    assert resumed.attributes["atmosphere.run.status"] == "completed"
    assert [link.context.span_id for link in resumed.links] == [cut.context.span_id]
    assert [link.context.trace_id for link in resumed.links] == [cut.context.trace_id]
