"""The planning primitive: a persistent, live `write_todos` plan per agent and conversation.

- `model`: `PlanStatus`, `PlanStep`, `AgentPlan` (Markdown, wire and stored forms);
- `store`: the `PlanStore` protocol and `FilePlanStore` (atomic, bounded, never bricks);
- `bus`: the plan event bus behind `GET P/plan/events` (`InProcessPlanBus`);
- `tools`: `write_todos` and `record_plan`, the one path a plan change takes;
- `attach`: `PlanningPrimitive`, the attach engine.
"""

from .._errors import PlanStoreError
from .attach import PlanningPrimitive
from .bus import InProcessPlanBus, PlanEvent, PlanEventBus, PlanSubscription
from .model import AgentPlan, PlanStatus, PlanStep
from .store import FilePlanStore, OwnerPlanStores, PlanStore
from .tools import record_plan, write_todos_tool

__all__ = [
    "AgentPlan",
    "FilePlanStore",
    "InProcessPlanBus",
    "OwnerPlanStores",
    "PlanEvent",
    "PlanEventBus",
    "PlanStatus",
    "PlanStep",
    "PlanStore",
    "PlanStoreError",
    "PlanSubscription",
    "PlanningPrimitive",
    "record_plan",
    "write_todos_tool",
]
