"""The `write_todos` tool, and `record_plan`, the one path every plan change takes.

`record_plan` saves a plan in the run's `PlanStore`, emits one `plan-update` frame on the run's
stream (a parent run can forward a sub-agent's frames) and publishes the same payload on the
endpoint's plan bus for `GET P/plan/events` viewers. A runtime's native plan tool calls it too,
so viewers cannot tell which surface wrote the plan.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import _events as events
from .._contracts import Endpoint, Key, Run
from .._errors import PlanStoreError
from .._log import get_logger
from .._tools.base import Tool, ToolContext, ToolKind
from .model import STATUS_NAMES, AgentPlan, PlanStatus, PlanStep
from .store import PlanStore

if TYPE_CHECKING:
    from .bus import PlanEventBus

log = get_logger(__name__)

TOOL_NAME = "write_todos"
BUS_SERVICE: Key[PlanEventBus] = Key("planning.bus")
"""Key of the plan event bus in `host.services` and `endpoint.services`."""
STORE_SERVICE: Key[PlanStore] = Key("planning.store")
"""Key of the endpoint's plan store in `endpoint.services`."""

DESCRIPTION = (
    "Create or update your task plan. Pass the FULL todo list every time - this replaces the "
    "previous list. Each item has 'content' (imperative, e.g. 'Run tests'), 'status' "
    "('pending', 'in_progress', 'completed' or 'abandoned') and optional 'activeForm' (present "
    "continuous, e.g. 'Running tests'). Keep exactly one item 'in_progress' at a time. Use this "
    "for any multi-step task so progress stays visible."
)

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "todos": {
            "type": "array",
            "description": "The full todo list: an array of {content, status, activeForm} objects",
            "items": {
                "type": "object",
                "properties": {
                    "content": {
                        "type": "string",
                        "description": "What to do, imperative (e.g. 'Run tests')",
                    },
                    "status": {
                        "type": "string",
                        "enum": [status.value for status in PlanStatus],
                        "description": "Where the step stands; at most one in_progress",
                    },
                    "activeForm": {
                        "type": "string",
                        "description": "Present continuous form shown while in progress "
                        "(e.g. 'Running tests')",
                    },
                },
                "required": ["content", "status"],
            },
        },
        "goal": {"type": "string", "description": "Optional one-line goal the todos work toward"},
    },
    "required": ["todos"],
    "additionalProperties": False,
}

UNAVAILABLE = "write_todos unavailable: no plan store is bound to this session."
NOT_A_LIST = (
    "write_todos failed: 'todos' is required and must be an array of {content, status, activeForm}"
)
NOT_AN_OBJECT = "write_todos failed: each todo must be an object with 'content' and 'status'"
BLANK_CONTENT = "write_todos failed: each todo needs a non-empty 'content'"


def write_todos_tool() -> Tool:
    """The built-in plan tool (kind EDIT). It finds the plan store among the run's injectables."""
    return Tool(
        name=TOOL_NAME,
        description=DESCRIPTION,
        parameters=PARAMETERS,
        handler=_write_todos,
        kind=ToolKind.EDIT,
        origin="planning",
    )


async def _write_todos(arguments: Mapping[str, Any], context: ToolContext) -> str:
    store = plan_store_of(context.run)
    if store is None:
        return UNAVAILABLE
    parsed = parse_todos(arguments.get("todos"), arguments.get("goal"))
    if isinstance(parsed, str):
        return parsed
    try:
        await record_plan(context.run, parsed, store=store)
    except PlanStoreError as exc:
        return f"write_todos failed: {exc}"
    except OSError as exc:
        log.warning("could not save the plan", error=str(exc), exc_info=True)
        return f"write_todos failed: the plan could not be saved ({exc.strerror or exc})"
    return parsed.to_markdown()


def parse_todos(todos: object, goal: object = None) -> AgentPlan | str:
    """The plan `write_todos` arguments describe, or the message that tells the model the fix.

    Lenient where a model's intent is clear (a JSON-encoded list, status aliases such as
    `done`, a missing status read as `pending`), strict where guessing would corrupt the plan:
    an unknown status and more than one step `in_progress` are rejected.
    """
    if isinstance(todos, str) and todos.strip():
        try:
            todos = json.loads(todos)
        except ValueError:
            pass
    if not isinstance(todos, list):
        return NOT_A_LIST
    steps: list[PlanStep] = []
    for index, item in enumerate(todos, start=1):
        if not isinstance(item, Mapping):
            return NOT_AN_OBJECT
        content = item.get("content")
        text = "" if content is None else str(content)
        if not text.strip():
            return BLANK_CONTENT
        status = PlanStatus.parse(item.get("status"))
        if status is None:
            return (
                f"write_todos failed: todo {index} ({text[:60]!r}) has unknown status "
                f"{str(item.get('status'))[:40]!r}; use one of {STATUS_NAMES} and call "
                "write_todos again with the full list"
            )
        active = item.get("activeForm", item.get("active_form"))
        steps.append(PlanStep(text, status, None if active is None else str(active)))
    running = [step for step in steps if step.status is PlanStatus.IN_PROGRESS]
    if len(running) > 1:
        names = ", ".join(repr(step.content[:60]) for step in running)
        return (
            f"write_todos failed: {len(running)} todos are in_progress ({names}); keep exactly "
            "one in_progress at a time - mark the others pending or completed and call "
            "write_todos again with the full list"
        )
    return AgentPlan(steps, None if goal is None else str(goal))


def plan_store_of(run: Run) -> PlanStore | None:
    """The run's plan store, if its endpoint has one."""
    return run.resolve(PlanStore)


def agent_id_for(endpoint: Endpoint) -> str:
    """Plans are kept per agent; an endpoint's agent id is its owner name."""
    return endpoint.owner


async def record_plan(run: Run, plan: AgentPlan, *, store: PlanStore | None = None) -> None:
    """Save `plan` for the run's conversation, then announce it (frame + bus).

    Raises `PlanStoreError` when the store rejects the plan (nothing is announced then) and
    `LookupError` when no plan store is attached to the run's endpoint.
    """
    store = store if store is not None else plan_store_of(run)
    if store is None:
        raise LookupError(UNAVAILABLE)
    agent_id = agent_id_for(run.endpoint)
    await store.put(agent_id, run.conversation_id, plan)
    payload = plan.to_wire(conversation_id=run.conversation_id, agent_id=agent_id)
    # Viewers first: if the prompt's own client is gone (its run is being cancelled), the
    # people watching the plan still learn what is now on disk.
    bus = run.endpoint.services.get(BUS_SERVICE)
    if bus is not None:
        try:
            await bus.publish(run.endpoint.owner, run.conversation_id, payload)
        except Exception:
            # The plan is saved and the prompt's stream carries it; a broken broker must not
            # turn a successful call into a failure the model would retry.
            log.warning(
                "could not publish the plan update", owner=run.endpoint.owner, exc_info=True
            )
    await run.session.emit(events.PLAN_UPDATE, payload)
