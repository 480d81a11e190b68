"""PlanningPrimitive: feature gating, mode knob, native surface, user tool, runtime truth, DI
(PlanningPresetTest + PlanningModeTest)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import (
    AiCapability,
    Harness,
    HarnessSettings,
    ModelRequest,
    ModelResponse,
    PlanStore,
    ScriptedRuntime,
    StreamingSession,
    Tool,
    ToolCall,
    ToolContext,
    agent,
    ai_endpoint,
    coordinator,
    prompt,
    tool,
)
from atmosphere_harness._assembly import default_primitives
from atmosphere_harness._kernel.host import HarnessHost
from atmosphere_harness._kernel.run import RunContext
from atmosphere_harness._planning import FilePlanStore, PlanningPrimitive
from atmosphere_harness._planning.attach import SURFACE
from atmosphere_harness._planning.tools import BUS_SERVICE, STORE_SERVICE
from atmosphere_harness._registry import spec_of
from atmosphere_harness._settings import SurfaceMode
from tests.agents import echo

PlainPlanner = echo(agent(name="plain-planner"), "PlainPlanner")


MemoryOnly = echo(agent(name="memory-only", harness=(Harness.MEMORY,)), "MemoryOnly")


@tool(name="write_todos")
async def my_todos(items: str) -> str:
    """The user's own plan tool."""
    return "mine"


OwnTodos = echo(agent(name="own-todos"), "OwnTodos", tools=[my_todos])


PlanChat = echo(ai_endpoint("/atmosphere/plan-chat", harness=(Harness.PLANNING,)), "PlanChat")


Lead = echo(coordinator("lead", fleet=()), "Lead")


class NativePlanner:
    """A runtime whose provider plans natively (no shipped runtime does today)."""

    name = "native-fake"
    capabilities = frozenset({AiCapability.TOOL_CALLING, AiCapability.PLANNING})

    def __init__(self, tools: Sequence[Any] = ()) -> None:
        self._tools = tools
        self.asked: list[AiCapability] = []

    async def complete(self, request: ModelRequest, *, on_text: Any = None) -> ModelResponse:
        return ModelResponse(text="ok")

    def native_tools(self, capability: AiCapability) -> Sequence[Any]:
        self.asked.append(capability)
        return self._tools


async def _native_update_plan(steps: str) -> str:
    """The provider's own plan tool."""
    return "planned"


class BareNative(NativePlanner):
    """Declares PLANNING but serves it inside the provider, with no tool to register."""

    native_tools = None  # type: ignore[assignment]


@asynccontextmanager
async def hosted(
    cls: type, workspace: Path, runtime: Any = None, **settings: Any
) -> AsyncIterator[HarnessHost]:
    host = HarnessHost(
        HarnessSettings(workspace_root=workspace, **settings),
        runtime=runtime if runtime is not None else ScriptedRuntime(),
        specs=[spec_of(cls)],
        primitives=[PlanningPrimitive()],
    )
    await host.start()
    try:
        yield host
    finally:
        await host.stop()


def only(host: HarnessHost):
    (endpoint,) = host.endpoints.values()
    return endpoint


def test_planning_is_a_default_primitive() -> None:
    assert any(isinstance(p, PlanningPrimitive) for p in default_primitives())


async def test_feature_off_attaches_nothing(workspace: Path) -> None:
    async with hosted(MemoryOnly, workspace) as host:
        endpoint = only(host)
        assert "write_todos" not in endpoint.tools
        assert PlanStore not in endpoint.providers
        assert STORE_SERVICE not in endpoint.services
        assert host.surface(SURFACE, "memory-only") is None
        assert host.truth.endpoint(endpoint.path)["planning"] == "INACTIVE(disabled)"


async def test_auto_on_a_plain_runtime_attaches_the_builtin_floor(workspace: Path) -> None:
    async with hosted(PlainPlanner, workspace) as host:
        endpoint = only(host)
        assert endpoint.tools["write_todos"].origin == "planning"
        store = endpoint.services.get(STORE_SERVICE)
        assert isinstance(store, FilePlanStore)
        assert store.root == workspace / "agents" / "plain-planner"
        assert host.surface(SURFACE, "plain-planner") is store, "the exact instance"
        assert host.owners(SURFACE) == ["plain-planner"]
        assert endpoint.providers[PlanStore](None) is store
        assert endpoint.services.get(BUS_SERVICE) is host.services.get(BUS_SERVICE)
        assert host.truth.endpoint(endpoint.path)["planning"] == "ACTIVE(builtin)"
        assert host.truth.app_wide()["planning"] == "ACTIVE(builtin)"


@pytest.mark.parametrize(
    ("cls", "root"),
    [
        (PlainPlanner, "agents/plain-planner"),
        (PlanChat, "endpoints/atmosphere-plan-chat"),
        (Lead, "coordinators/lead"),
    ],
)
async def test_each_kind_keeps_plans_under_its_owner_root(
    workspace: Path, cls: type, root: str
) -> None:
    async with hosted(cls, workspace) as host:
        endpoint = only(host)
        assert endpoint.services.get(STORE_SERVICE).root == workspace / root
        assert host.surface(SURFACE, endpoint.owner) is endpoint.services.get(STORE_SERVICE)


async def test_auto_on_a_native_runtime_registers_the_native_tools_only(workspace: Path) -> None:
    runtime = NativePlanner([_native_update_plan])
    async with hosted(PlainPlanner, workspace, runtime=runtime) as host:
        endpoint = only(host)
        assert "write_todos" not in endpoint.tools
        assert endpoint.tools["_native_update_plan"].origin == "planning"
        assert endpoint.user_tool_names() == set()
        assert runtime.asked == [AiCapability.PLANNING]
        assert host.truth.endpoint(endpoint.path)["planning"] == "ACTIVE(native:native-fake)"
        assert host.surface(SURFACE, "plain-planner") is endpoint.services.get(STORE_SERVICE)


async def test_a_native_runtime_without_tools_still_reports_native(workspace: Path) -> None:
    async with hosted(PlainPlanner, workspace, runtime=BareNative()) as host:
        endpoint = only(host)
        assert "write_todos" not in endpoint.tools
        assert host.truth.endpoint(endpoint.path)["planning"] == "ACTIVE(native:native-fake)"


async def test_builtin_beats_native(workspace: Path) -> None:
    runtime = NativePlanner([_native_update_plan])
    async with hosted(PlainPlanner, workspace, runtime=runtime, planning="builtin") as host:
        endpoint = only(host)
        assert "write_todos" in endpoint.tools
        assert "_native_update_plan" not in endpoint.tools
        assert runtime.asked == []
        assert host.truth.endpoint(endpoint.path)["planning"] == "ACTIVE(builtin)"


async def test_native_on_a_plain_runtime_attaches_no_surface_and_warns(
    workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        async with hosted(PlainPlanner, workspace, planning="native") as host:
            endpoint = only(host)
            assert "write_todos" not in endpoint.tools
            assert host.truth.endpoint(endpoint.path)["planning"] == "INACTIVE(native-unavailable)"
            assert host.truth.app_wide()["planning"] == "INACTIVE(native-unavailable)"
            # The store is still bound, as Atmosphere binds it before picking a surface.
            assert host.surface(SURFACE, "plain-planner") is not None
    assert "planning=native but the runtime has no native plan surface" in caplog.text


async def test_native_on_a_capable_runtime_is_native(workspace: Path) -> None:
    declared = Tool(
        name="update_plan",
        description="The provider's plan tool.",
        parameters={"type": "object", "properties": {}},
        handler=lambda arguments, context: _native_update_plan("x"),
        native={"type": "plan_20990101", "name": "update_plan"},
    )
    runtime = NativePlanner([declared])
    async with hosted(PlainPlanner, workspace, runtime=runtime, planning="native") as host:
        endpoint = only(host)
        assert endpoint.tools["update_plan"].native == declared.native
        assert endpoint.tools["update_plan"].origin == "planning"
        assert "write_todos" not in endpoint.tools
        assert host.truth.endpoint(endpoint.path)["planning"] == "ACTIVE(native:native-fake)"


async def test_a_user_write_todos_wins(workspace: Path) -> None:
    async with hosted(OwnTodos, workspace) as host:
        endpoint = only(host)
        assert endpoint.tools["write_todos"].origin == "user"
        assert endpoint.tools["write_todos"].description == "The user's own plan tool."
        assert host.truth.endpoint(endpoint.path)["planning"] == "ACTIVE(user-tool)"
        assert host.surface(SURFACE, "own-todos") is not None


async def test_kill_switch_attaches_nothing(workspace: Path) -> None:
    async with hosted(PlainPlanner, workspace, enabled=False) as host:
        endpoint = only(host)
        assert "write_todos" not in endpoint.tools
        assert host.owners(SURFACE) == []
        assert host.truth.app_wide()["planning"] == "INACTIVE(disabled)"


async def test_the_bus_is_app_wide_and_closed_at_shutdown(workspace: Path) -> None:
    primitive = PlanningPrimitive()
    host = HarnessHost(
        HarnessSettings(workspace_root=workspace),
        runtime=ScriptedRuntime(),
        specs=[spec_of(PlainPlanner), spec_of(PlanChat)],
        primitives=[primitive],
    )
    await host.start()
    bus = host.services.get(BUS_SERVICE)
    assert {id(e.services.get(BUS_SERVICE)) for e in host.endpoints.values()} == {id(bus)}
    async with bus.subscribe("plain-planner", "c") as subscription:
        await host.stop()
        assert [batch async for batch in subscription] == []
    assert BUS_SERVICE not in host.services


async def test_a_given_bus_replaces_the_in_process_one(workspace: Path) -> None:
    from atmosphere_harness._planning import InProcessPlanBus

    mine = InProcessPlanBus(queue_size=2)
    host = HarnessHost(
        HarnessSettings(workspace_root=workspace),
        runtime=ScriptedRuntime(),
        specs=[spec_of(PlainPlanner)],
        primitives=[PlanningPrimitive(bus=mine)],
    )
    await host.start()
    try:
        assert host.services.get(BUS_SERVICE) is mine
    finally:
        await host.stop()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"LLM_PLANNING": "builtin"}, SurfaceMode.BUILTIN),
        ({"LLM_PLANNING": "Built-In"}, SurfaceMode.BUILTIN),
        ({"LLM_PLANNING": " NATIVE "}, SurfaceMode.NATIVE),
        ({"LLM_PLANNING": "whatever"}, SurfaceMode.AUTO),
        ({}, SurfaceMode.AUTO),
        ({"ATMOSPHERE_AI_PLANNING": "native", "LLM_PLANNING": "builtin"}, SurfaceMode.NATIVE),
    ],
)
def test_planning_mode_parsing(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: SurfaceMode
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert HarnessSettings().planning is expected
    assert HarnessSettings(planning="builtin").planning is SurfaceMode.BUILTIN, "argument wins"


SEEN: list[Any] = []


@agent(name="store-user")
class StoreUser:
    @prompt
    async def chat(self, message: str, session: StreamingSession, plans: PlanStore) -> None:
        SEEN.append(plans)
        await session.send("ok")


async def test_plan_store_is_injected_into_prompt_methods(workspace: Path) -> None:
    from atmosphere_harness._kernel.run import execute_prompt

    SEEN.clear()
    async with hosted(StoreUser, workspace) as host:
        endpoint = only(host)

        async def sink(frame: Any) -> None:
            return None

        run: RunContext = await execute_prompt(
            host, endpoint, message="hi", conversation_id="c", user_id=None, sink=sink
        )
        assert [endpoint.services.get(STORE_SERVICE)] == SEEN
        assert run.resolve(PlanStore) is SEEN[0]


@tool
async def count_steps(plans: PlanStore, context: ToolContext) -> str:
    """How many steps the current plan has."""
    plan = await plans.get(context.run.endpoint.owner, context.conversation_id)
    return f"{0 if plan is None else len(plan.steps)} steps"


StepCounter = echo(agent(name="step-counter"), "StepCounter", tools=[count_steps])


async def test_plan_store_is_injected_into_tools_and_hidden_from_the_model(
    workspace: Path,
) -> None:
    from atmosphere_harness._kernel.run import execute_prompt

    runtime = ScriptedRuntime(
        [
            [ToolCall("write_todos", {"todos": [{"content": "a"}, {"content": "b"}]})],
            [ToolCall("count_steps", {})],
            "done",
        ]
    )
    async with hosted(StepCounter, workspace, runtime=runtime) as host:
        endpoint = only(host)
        assert endpoint.tools["count_steps"].parameters["properties"] == {}
        frames: list[Any] = []

        async def sink(frame: Any) -> None:
            frames.append(frame)

        await execute_prompt(
            host, endpoint, message="count", conversation_id="c", user_id=None, sink=sink
        )
    results = [frame.data["result"] for frame in frames if frame.event == "tool-result"]
    assert results == ["- [ ] a\n- [ ] b", "2 steps"]
