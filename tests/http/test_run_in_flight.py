"""What a streamed run keeps while it is in flight: a replica holds hundreds of them, and every
object they keep is walked by each full garbage collection (see `benchmarks/inflight.py
--census-at`). These pin the parts that are shared or let go, and that the run still behaves."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import httpx2

from atmosphere_harness import ScriptedRuntime, agent
from atmosphere_harness._contracts import Run
from atmosphere_harness._kernel.endpoint import HostedEndpoint
from atmosphere_harness._registry import EndpointKind
from atmosphere_harness._runtimes.base import ModelRequest, ModelResponse, TextSink, ToolSpec
from atmosphere_harness._tools.base import Tool
from atmosphere_harness._tracing import Tracing
from tests.agents import echo
from tests.support import make_app, parse_sse, serve

PATH = "/atmosphere/agent/held"


class HeldRuntime(ScriptedRuntime):
    """Streams a first token, then waits for `release` before it answers."""

    def __init__(self) -> None:
        super().__init__(["done.", "done."])
        self.release = asyncio.Event()
        self.streaming = asyncio.Event()
        self.tools: list[tuple[ToolSpec, ...]] = []

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        self.tools.append(request.tools)
        if on_text is not None:
            await on_text("first ")
        self.streaming.set()
        await self.release.wait()
        return await super().complete(request, on_text=on_text)


async def read_stream(
    base: str, conversation_id: str, user: str
) -> tuple[int, list[dict[str, Any]]]:
    async with httpx2.AsyncClient(base_url=base, timeout=30) as client:
        response = await client.post(
            PATH,
            json={"message": "hello", "conversationId": conversation_id},
            headers={"X-User": user},
        )
        return response.status_code, parse_sse(response.text)


async def test_a_run_in_flight_keeps_no_task_of_its_entry_and_its_lock_is_freed(
    workspace: Path,
) -> None:
    runtime = HeldRuntime()
    app = make_app(
        [echo(agent(name="held"))], runtime=runtime, workspace=workspace, user_id_header="X-User"
    )
    async with serve(app) as base:
        first = asyncio.ensure_future(read_stream(base, "c-1", "alice"))
        await asyncio.wait_for(runtime.streaming.wait(), 30)
        names = [task.get_name() for task in asyncio.all_tasks()]
        # Its lock is held without a task waiting for the run's end, and its status is written.
        assert not [name for name in names if name.startswith(("entry", "run-status"))], names
        assert [name for name in names if name.startswith("prompt:")]
        # Another user's prompt on the conversation: 404 at once, and the lock stays the run's.
        status, _ = await read_stream(base, "c-1", "bob")
        assert status == 404
        runtime.release.set()
        status, frames = await asyncio.wait_for(first, 30)
        assert status == 200
        assert [frame["event"] for frame in frames][-1] == "complete"
        assert "".join(f["data"]["text"] for f in frames if f["event"] == "text") == "first done."
        # The lock was freed: the next prompt of the conversation runs.
        runtime.streaming.clear()
        status, frames = await asyncio.wait_for(read_stream(base, "c-1", "alice"), 30)
        assert status == 200
        assert frames[-1]["event"] == "complete"
        # Both runs' requests offered the model the same tool specs, not copies of them.
        assert len(runtime.tools) == 2
        assert runtime.tools[0] is runtime.tools[1]
        assert runtime.tools[0]


def tool_of(name: str) -> Tool:
    async def handler(arguments: object, context: object) -> str:
        return "ok"

    return Tool(name, f"{name} things", {"type": "object", "properties": {}}, handler)


def test_an_endpoints_tool_specs_are_one_tuple_until_its_tools_change(workspace: Path) -> None:
    endpoint = HostedEndpoint(
        path="/p",
        kind=EndpointKind.AGENT,
        owner="p",
        features=frozenset(),
        runtime=ScriptedRuntime(["x"]),
        system_prompt="",
        root=workspace,
        tool_timeout=1.0,
        max_rounds=1,
        tools=[tool_of("one")],
    )
    specs = endpoint.tool_specs()
    assert endpoint.tool_specs() is specs
    assert [spec.name for spec in specs] == ["one"]
    endpoint.add_builtin_tool(tool_of("two"))
    assert [spec.name for spec in endpoint.tool_specs()] == ["one", "two"]
    del endpoint.tools["one"]  # (as the MCP primitive drops a tool its server no longer has)
    assert [spec.name for spec in endpoint.tool_specs()] == ["two"]


async def test_tracing_off_is_no_layer_around_a_run_or_a_model_call() -> None:
    hook = Tracing()
    assert not hook.live()  # (no provider set: the API's placeholders)

    async def work() -> None:
        return None

    run = work()
    try:
        # The run's own coroutine comes back: none of the hook's own is kept while it runs.
        assert hook.around_run(cast(Run, None), lambda: run) is run
    finally:
        await run
