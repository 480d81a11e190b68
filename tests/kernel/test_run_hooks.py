"""`RunHooks` around the loop's model and tool calls: order, what a hook sees, what it may do.

Hosted for real (`HarnessHost` with the default primitives, a scripted model, a user tool),
driven as the HTTP routes drive a run (`start_run`, the frames read from its journal).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import HarnessSettings, ScriptedRuntime, ToolCall, agent, prompt, tool
from atmosphere_harness._assembly import default_primitives
from atmosphere_harness._contracts import (
    BEFORE_HANDLER,
    Key,
    ModelStep,
    ProceedModel,
    ProceedRun,
    ProceedTool,
    Run,
    RunHooks,
    ToolOutcome,
    ToolStep,
)
from atmosphere_harness._events import Frame
from atmosphere_harness._kernel.host import HarnessHost
from atmosphere_harness._kernel.session import StreamingSession
from atmosphere_harness._registry import spec_of
from atmosphere_harness._runtimes.base import ModelRequest, ModelResponse, TextSink

PATH = "/atmosphere/agent/hooked"


@agent(name="hooked")
class Hooked:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)

    @tool
    async def add(self, a: int, b: int) -> str:
        """Add two numbers.

        Args:
            a: The first.
            b: The second.
        """
        return str(a + b)

    @tool
    async def boom(self) -> str:
        """Fail."""
        raise RuntimeError("kaboom")


class Recorder(RunHooks):
    """Records what it sees, in a shared log, under its name."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    async def around_model(self, step: ModelStep, proceed: ProceedModel) -> ModelResponse:
        self.log.append(f"{self.name} model {step.turn} in")
        response = await proceed(step)
        self.log.append(f"{self.name} model {step.turn} out")
        return response

    async def around_tool(self, step: ToolStep, proceed: ProceedTool) -> ToolOutcome:
        self.log.append(f"{self.name} tool {step.call.name} {step.turn} in")
        outcome = await proceed(step)
        self.log.append(f"{self.name} tool {step.call.name} {outcome.status} out")
        return outcome


@asynccontextmanager
async def hosted(
    workspace: Path, runtime: Any, hooks: list[RunHooks]
) -> AsyncIterator[HarnessHost]:
    host = HarnessHost(
        HarnessSettings(workspace_root=workspace, conversation_idle_timeout=0),
        runtime=runtime,
        specs=[spec_of(Hooked)],
        primitives=default_primitives(),
        hooks=hooks,
    )
    await host.start()
    try:
        yield host
    finally:
        await host.stop()


async def run(host: HarnessHost, message: str = "go", conversation: str = "c") -> list[Frame]:
    live = host.start_run(
        host.endpoints[PATH], message=message, conversation_id=conversation, user_id=None
    )
    return [frame async for frame in live.follow(0)]


def results(frames: list[Frame]) -> list[Any]:
    return [frame.data["result"] for frame in frames if frame.event == "tool-result"]


async def test_hooks_wrap_each_call_outermost_first(workspace: Path) -> None:
    log: list[str] = []
    runtime = ScriptedRuntime(
        [
            [ToolCall("add", {"a": 1, "b": 2}, "c1"), ToolCall("boom", {}, "c2")],
            [ToolCall("nope", {}, "c3"), ToolCall("add", {"a": "x"}, "c4")],
            "done",
        ]
    )
    async with hosted(workspace, runtime, [Recorder("outer", log), Recorder("inner", log)]) as h:
        frames = await run(h)
    assert frames[-1].event == "complete"
    assert log[:4] == [
        "outer model 1 in",
        "inner model 1 in",
        "inner model 1 out",
        "outer model 1 out",
    ]
    assert [line for line in log if line.startswith("outer tool") and line.endswith(" out")] == [
        "outer tool add ok out",
        "outer tool boom error out",
        "outer tool nope unknown out",
        "outer tool add invalid out",
    ]
    assert "outer tool add 1 in" in log
    assert "outer tool nope 2 in" in log
    # Every call still gets its frames, sent once the hooks returned.
    assert [f.event for f in frames if f.event.startswith("tool-")] == [
        "tool-start",
        "tool-result",
    ] * 4


class BeforeHandlers(RunHooks):
    """Gives the run a `BEFORE_HANDLER` that records each call it sees; every other call's
    wait is a coroutine the executor must await."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def around_run(self, run: Run, proceed: ProceedRun) -> None:
        def before(step: ToolStep, arguments: Mapping[str, Any]) -> Awaitable[None] | None:
            assert step.run is run
            self.log.append(f"before {step.call.name} {step.turn} {dict(arguments)}")
            if len(self.log) % 2:
                return None  # (done at once: nothing to await)
            return self.waited(step.call.name)

        run.state.set(BEFORE_HANDLER, before)
        await proceed()

    async def waited(self, name: str) -> None:
        self.log.append(f"awaited {name}")


async def test_the_runs_before_handler_sees_each_call_that_reaches_its_handler(
    workspace: Path,
) -> None:
    # The executor gives every tool step the run's `BEFORE_HANDLER` (no hook builds each
    # call's step again to set it), calls it once the gates passed, and awaits what it returns
    # only when it returns something.
    log: list[str] = []
    runtime = ScriptedRuntime(
        [
            [ToolCall("add", {"a": 1, "b": 2}, "c1"), ToolCall("boom", {}, "c2")],
            [ToolCall("nope", {}, "c3"), ToolCall("add", {"a": "x"}, "c4")],
            [ToolCall("add", {"a": 3, "b": 4}, "c5")],
            "done",
        ]
    )
    async with hosted(workspace, runtime, [BeforeHandlers(log)]) as host:
        frames = await run(host)
    assert frames[-1].event == "complete"
    assert results(frames)[0] == "3"
    assert log == [
        "before add 1 {'a': 1, 'b': 2}",
        "before boom 1 {}",
        "awaited boom",
        "before add 3 {'a': 3, 'b': 4}",
        "awaited add",
    ]


class Answering(RunHooks):
    """Answers `add` without running it, and asks the model twice for the first turn."""

    def __init__(self) -> None:
        self.calls = 0

    async def around_model(self, step: ModelStep, proceed: ProceedModel) -> ModelResponse:
        if step.turn == 1:
            await proceed(step)  # a first answer, dropped (a retry)
        return await proceed(step)

    async def around_tool(self, step: ToolStep, proceed: ProceedTool) -> ToolOutcome:
        if step.call.name == "add":
            await step.run.session.emit("tool-note", {"toolCallId": step.call.id})
            return ToolOutcome("answered by a hook", "denied", frames="start")
        return await proceed(step)


class Script:
    """A runtime that plays `responses` in turn and keeps every request it got."""

    name = "script"
    capabilities = ScriptedRuntime([]).capabilities

    def __init__(self, *responses: ModelResponse) -> None:
        self.responses = list(responses)
        self.requests: list[ModelRequest] = []

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        self.requests.append(request)
        return self.responses[min(len(self.requests), len(self.responses)) - 1]


ADD = ModelResponse(tool_calls=(ToolCall("add", {"a": 1, "b": 2}, "c1"),))


async def test_a_hook_may_call_proceed_twice_or_not_at_all(workspace: Path) -> None:
    runtime = Script(ADD, ADD, ModelResponse(text="done"))
    async with hosted(workspace, runtime, [Answering()]) as host:
        frames = await run(host)
    assert frames[-1].event == "complete"
    assert len(runtime.requests) == 3  # turn 1 asked twice, turn 2 once
    assert results(frames) == ["answered by a hook"]
    events = [f.event for f in frames]
    assert events.index("tool-note") < events.index("tool-start") < events.index("tool-result")


class Limit(RunHooks):
    """Ends the run before its second model request (a usage limit's shape)."""

    COUNT: Key[list[int]] = Key("test.requests")

    async def around_model(self, step: ModelStep, proceed: ProceedModel) -> ModelResponse:
        count = step.run.root.state.setdefault(self.COUNT, lambda: [0])
        if count[0] == 1:
            raise RuntimeError("request limit reached")
        count[0] += 1
        return await proceed(step)


async def test_a_hook_that_raises_ends_the_run_and_keeps_no_half_tool_pair(
    workspace: Path,
) -> None:
    runtime = Script(ADD, ModelResponse(text="second prompt"))
    async with hosted(workspace, runtime, [Limit()]) as host:
        frames = await run(host)
        assert frames[-1].event == "error"
        assert frames[-1].data["message"] == "request limit reached"
        assert results(frames) == ["3"]
        assert len(runtime.requests) == 1
        assert (await run(host, "next", "other"))[-1].event == "complete"
        # (Another conversation is another run: its own count.)
        await run(host, "again")
    # The conversation's next prompt sees the whole first turn: the call with its result.
    history = [(m.role, m.content) for m in runtime.requests[-1].messages]
    assert history[:3] == [("user", "go"), ("assistant", ""), ("tool", "3")]


async def test_a_hook_may_change_the_request_and_the_runtime(workspace: Path) -> None:
    primary, fallback = Script(), ScriptedRuntime(["from the fallback"])

    class Fallback(RunHooks):
        async def around_model(self, step: ModelStep, proceed: ProceedModel) -> ModelResponse:
            request = replace(step.request, system_prompt=step.request.system_prompt + " [x]")
            response = await proceed(replace(step, request=request, runtime=fallback))
            return replace(response, model="fallback")

    async with hosted(workspace, primary, [Fallback()]) as host:
        frames = await run(host)
    assert frames[-1].data["summary"] == "from the fallback"
    assert primary.requests == []


@pytest.mark.parametrize("hooks", [0, 3])
async def test_tool_batches_and_concurrent_calls_keep_their_order(
    workspace: Path, hooks: int
) -> None:
    log: list[str] = []
    writes = [
        ToolCall("write_file", {"path": f"f{n}.md", "content": str(n)}, f"w{n}") for n in range(3)
    ]
    deep: dict[str, Any] = {}
    for _ in range(100):
        deep = {"d": deep}
    refused = ToolCall("write_file", {"path": "d.md", "content": deep}, "deep")
    bad = ToolCall("write_file", {}, "bad")
    runtime = ScriptedRuntime([[refused, *writes[:2], bad, writes[2]], "ok"])
    chain: list[RunHooks] = [Recorder(str(n), log) for n in range(hooks)]
    async with hosted(workspace, runtime, chain) as host:
        frames = await run(host)
    tool_frames = [(f.event, f.data["toolCallId"]) for f in frames if f.event.startswith("tool-")]
    # Each passes its gates in order (the invalid one is answered there), then the batch runs,
    # then the results come in the model's order.
    assert tool_frames == [
        ("tool-start", "deep"),  # refused by the loop's bounds: alone, first
        ("tool-result", "deep"),
        ("tool-start", "w0"),
        ("tool-start", "w1"),
        ("tool-start", "bad"),
        ("tool-result", "bad"),
        ("tool-start", "w2"),
        ("tool-result", "w0"),
        ("tool-result", "w1"),
        ("tool-result", "w2"),
    ]
    if hooks:
        assert log.count("0 tool write_file ok out") == 3
