"""write_todos through the real executor: shape, persistence, frames, messages.

Covers Atmosphere's Java harness's PlanningToolsTest point by point, plus the stricter rules we add.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import AgentPlan, Harness, PlanStatus, PlanStep, ToolCall, ToolKind
from atmosphere_harness._events import Frame
from atmosphere_harness._kernel.endpoint import HostedEndpoint
from atmosphere_harness._kernel.executor import execute_call
from atmosphere_harness._kernel.run import RunContext
from atmosphere_harness._planning import (
    FilePlanStore,
    InProcessPlanBus,
    PlanStore,
    write_todos_tool,
)
from atmosphere_harness._planning.tools import BUS_SERVICE, parse_todos
from atmosphere_harness._registry import EndpointKind
from atmosphere_harness._runtimes.scripted import ScriptedRuntime

TWO_STEPS = [
    {"content": "Write the plan", "status": "in_progress", "activeForm": "Writing the plan"},
    {"content": "Ship it", "status": "pending"},
]


class Harnessed:
    """A planning endpoint wired by hand, the way a sub-agent or a test builds one."""

    def __init__(self, root: Path, *, store: PlanStore | None = None, bus: Any = None) -> None:
        self.store = store if store is not None else FilePlanStore(root)
        self.endpoint = HostedEndpoint(
            path="/atmosphere/agent/planner",
            kind=EndpointKind.AGENT,
            owner="planner",
            features=frozenset({Harness.PLANNING}),
            runtime=ScriptedRuntime(),
            system_prompt="test",
            root=root,
            tool_timeout=10,
            max_rounds=5,
        )
        self.endpoint.add_builtin_tool(write_todos_tool())
        self.endpoint.provide(PlanStore, lambda run: self.store)
        if bus is not None:
            self.endpoint.services.set(BUS_SERVICE, bus)
        self.frames: list[Frame] = []

    def run(self, conversation_id: str = "conv-1") -> RunContext:
        async def sink(frame: Frame) -> None:
            self.frames.append(frame)

        return RunContext(
            host=None,
            endpoint=self.endpoint,
            conversation_id=conversation_id,
            user_id=None,
            sink=sink,
        )

    async def call(self, arguments: Any, conversation_id: str = "conv-1") -> str:
        return await execute_call(ToolCall("write_todos", arguments), self.run(conversation_id))

    def plan_updates(self) -> list[Mapping[str, Any]]:
        return [frame.data for frame in self.frames if frame.event == "plan-update"]


def test_tool_shape() -> None:
    tool = write_todos_tool()
    assert tool.name == "write_todos"
    assert tool.kind is ToolKind.EDIT
    assert tool.origin == "planning"
    assert tool.description.startswith("Create or update your task plan. Pass the FULL todo list")
    schema = tool.parameters
    assert set(schema["properties"]) == {"todos", "goal"}
    assert schema["required"] == ["todos"]
    todos = schema["properties"]["todos"]
    assert todos["type"] == "array"
    assert todos["items"]["required"] == ["content", "status"]
    assert set(todos["items"]["properties"]) == {"content", "status", "activeForm"}
    assert todos["items"]["properties"]["status"]["enum"] == [
        "pending",
        "in_progress",
        "completed",
        "abandoned",
    ]
    assert schema["properties"]["goal"]["type"] == "string"


async def test_persists_emits_and_returns_markdown(tmp_path: Path) -> None:
    harness = Harnessed(tmp_path)
    result = await harness.call({"todos": TWO_STEPS, "goal": "Ship it"})
    assert result == "Goal: Ship it\n- [~] Writing the plan\n- [ ] Ship it"
    assert await harness.store.get("planner", "conv-1") == AgentPlan(
        [
            PlanStep("Write the plan", PlanStatus.IN_PROGRESS, "Writing the plan"),
            PlanStep("Ship it"),
        ],
        "Ship it",
    )
    assert [frame.event for frame in harness.frames] == ["tool-start", "plan-update", "tool-result"]
    assert harness.plan_updates() == [
        {
            "steps": [
                {
                    "content": "Write the plan",
                    "status": "in_progress",
                    "activeForm": "Writing the plan",
                },
                {"content": "Ship it", "status": "pending"},
            ],
            "goal": "Ship it",
            "conversationId": "conv-1",
            "agentId": "planner",
        }
    ]
    assert harness.frames[-1].data["result"] == result


async def test_each_call_replaces_the_whole_list(tmp_path: Path) -> None:
    harness = Harnessed(tmp_path)
    await harness.call({"todos": TWO_STEPS})
    result = await harness.call({"todos": [{"content": "Replace the plan", "status": "done"}]})
    assert result == "- [x] Replace the plan"
    plan = await harness.store.get("planner", "conv-1")
    assert plan is not None
    assert [step.content for step in plan.steps] == ["Replace the plan"]
    updates = harness.plan_updates()
    assert len(updates) == 2
    assert updates[1]["steps"] == [{"content": "Replace the plan", "status": "completed"}]


async def test_an_empty_list_is_a_plan_with_no_steps(tmp_path: Path) -> None:
    harness = Harnessed(tmp_path)
    assert await harness.call({"todos": []}) == "(no steps)"
    assert await harness.store.get("planner", "conv-1") == AgentPlan()


async def test_no_plan_store_bound(tmp_path: Path) -> None:
    harness = Harnessed(tmp_path)
    harness.endpoint.providers.clear()
    result = await harness.call({"todos": TWO_STEPS})
    assert result == "write_todos unavailable: no plan store is bound to this session."
    assert harness.plan_updates() == []


async def test_missing_todos_is_an_invalid_arguments_result(tmp_path: Path) -> None:
    harness = Harnessed(tmp_path)
    result = await harness.call({"goal": "x"})
    assert result == (
        '{"error":"invalid_arguments","tool":"write_todos",'
        '"details":["missing required parameter \'todos\'"]}'
    )


@pytest.mark.parametrize(
    ("todos", "message"),
    [
        (None, "write_todos failed: 'todos' is required and must be an array of "),
        (5, "write_todos failed: 'todos' is required and must be an array of "),
        ({"content": "a"}, "write_todos failed: 'todos' is required and must be an array of "),
        ("not json", "write_todos failed: 'todos' is required and must be an array of "),
        (["a"], "write_todos failed: each todo must be an object with 'content' and 'status'"),
        ([{"status": "pending"}], "write_todos failed: each todo needs a non-empty 'content'"),
        ([{"content": "  "}], "write_todos failed: each todo needs a non-empty 'content'"),
    ],
)
def test_malformed_arguments_get_the_reference_messages(todos: object, message: str) -> None:
    result = parse_todos(todos)
    assert isinstance(result, str)
    assert result.startswith(message)


async def test_malformed_items_through_the_executor(tmp_path: Path) -> None:
    harness = Harnessed(tmp_path)
    assert await harness.call({"todos": [1, 2]}) == (
        "write_todos failed: each todo must be an object with 'content' and 'status'"
    )
    wrong_type = json.loads(await harness.call({"todos": 5}))
    assert wrong_type["error"] == "invalid_arguments"
    assert wrong_type["details"] == ["parameter 'todos' must be array, got integer"]
    unparsable = json.loads(await harness.call({"todos": "[{broken"}))
    assert unparsable["details"] == ["parameter 'todos' must be array, got string"]
    assert await harness.store.get("planner", "conv-1") is None
    assert harness.plan_updates() == []


async def test_a_json_encoded_list_is_accepted(tmp_path: Path) -> None:
    harness = Harnessed(tmp_path)
    result = await harness.call({"todos": json.dumps(TWO_STEPS), "goal": "g"})
    assert result == "Goal: g\n- [~] Writing the plan\n- [ ] Ship it"
    assert parse_todos("  " + json.dumps(TWO_STEPS)) == parse_todos(TWO_STEPS)


async def test_lenient_statuses(tmp_path: Path) -> None:
    harness = Harnessed(tmp_path)
    todos = [
        {"content": "a", "status": "DONE"},
        {"content": "b", "status": "Active", "active_form": "Doing b"},
        {"content": "c", "status": "cancelled"},
        {"content": "d", "status": "todo"},
        {"content": "e"},
        {"content": 42, "status": "finished"},
    ]
    result = await harness.call({"todos": todos})
    assert result == "- [x] a\n- [~] Doing b\n- [-] c\n- [ ] d\n- [ ] e\n- [x] 42"


async def test_an_unknown_status_is_rejected_with_the_fix_and_nothing_changes(
    tmp_path: Path,
) -> None:
    harness = Harnessed(tmp_path)
    await harness.call({"todos": TWO_STEPS})
    result = await harness.call({"todos": [{"content": "Deploy", "status": "wip"}]})
    assert result == (
        "write_todos failed: todo 1 ('Deploy') has unknown status 'wip'; use one of pending, "
        "in_progress, completed, abandoned and call write_todos again with the full list"
    )
    plan = await harness.store.get("planner", "conv-1")
    assert plan is not None
    assert [step.content for step in plan.steps] == [
        "Write the plan",
        "Ship it",
    ]
    assert len(harness.plan_updates()) == 1


async def test_more_than_one_in_progress_is_rejected_with_the_fix(tmp_path: Path) -> None:
    harness = Harnessed(tmp_path)
    todos = [
        {"content": "A", "status": "in_progress"},
        {"content": "B", "status": "doing"},
        {"content": "C", "status": "pending"},
    ]
    result = await harness.call({"todos": todos})
    assert result == (
        "write_todos failed: 2 todos are in_progress ('A', 'B'); keep exactly one in_progress at "
        "a time - mark the others pending or completed and call write_todos again with the full "
        "list"
    )
    assert await harness.store.get("planner", "conv-1") is None
    assert harness.plan_updates() == []


async def test_a_store_bound_violation_is_a_write_todos_failure(tmp_path: Path) -> None:
    harness = Harnessed(tmp_path)
    todos = [{"content": f"step {i}", "status": "pending"} for i in range(257)]
    result = await harness.call({"todos": todos})
    assert result == "write_todos failed: plan rejected: 257 steps exceeds the 256-step limit"
    assert harness.plan_updates() == []


async def test_a_disk_error_is_a_clear_failure_not_a_crash(tmp_path: Path) -> None:
    class Broken:
        async def get(self, agent_id: str, conversation_id: str) -> AgentPlan | None:
            return None

        async def put(self, agent_id: str, conversation_id: str, plan: AgentPlan) -> None:
            raise OSError(28, "No space left on device")

    harness = Harnessed(tmp_path, store=Broken())
    result = await harness.call({"todos": TWO_STEPS})
    assert result == "write_todos failed: the plan could not be saved (No space left on device)"
    assert harness.plan_updates() == []


async def test_the_plan_belongs_to_the_conversation_not_the_prompt(tmp_path: Path) -> None:
    harness = Harnessed(tmp_path)
    first, second = harness.run("shared"), harness.run("shared")
    assert first.session_id != second.session_id
    await execute_call(ToolCall("write_todos", {"todos": TWO_STEPS}), first)
    await execute_call(ToolCall("write_todos", {"todos": TWO_STEPS[1:]}), second)
    await harness.call({"todos": [{"content": "elsewhere"}]}, conversation_id="other")
    shared = await harness.store.get("planner", "shared")
    assert shared is not None
    assert [step.content for step in shared.steps] == ["Ship it"]
    assert {frame["conversationId"] for frame in harness.plan_updates()} == {"shared", "other"}
    assert [p.name for p in sorted((tmp_path / "plans" / "planner").iterdir())] == [
        "other.json",
        "shared.json",
    ]


async def test_the_same_payload_is_published_on_the_bus(tmp_path: Path) -> None:
    bus = InProcessPlanBus()
    harness = Harnessed(tmp_path, bus=bus)
    async with bus.subscribe("planner", "conv-1") as subscription:
        await harness.call({"todos": TWO_STEPS, "goal": "g"})
        (event,) = await anext(aiter(subscription))
    assert event.data == harness.plan_updates()[0]
    assert json.loads(event.json) == harness.plan_updates()[0]


async def test_a_failing_bus_does_not_fail_a_saved_plan(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Down(InProcessPlanBus):
        async def publish(self, owner: str, conversation_id: str, data: Mapping[str, Any]) -> Any:
            raise ConnectionError("broker down")

    harness = Harnessed(tmp_path, bus=Down())
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        result = await harness.call({"todos": TWO_STEPS})
    assert result.startswith("- [~] Writing the plan")
    assert len(harness.plan_updates()) == 1
    assert "could not publish the plan update" in caplog.text
