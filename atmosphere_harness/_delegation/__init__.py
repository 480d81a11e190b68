"""The delegation primitive: a coordinator's fleet (`delegate_task`) and `task` sub-agents.

- `fleet`: start-up validation of every fleet, and how a member is called;
- `delegate`: the `delegate_task` tool;
- `subagent`: the `task` tool (isolated, bounded, governed sub-agents);
- `primitive`: `DelegationPrimitive`, the attach engine.
"""

from .._errors import DelegationError
from .delegate import delegate_tool
from .fleet import AgentFleet, FleetMember, resolve_fleets
from .primitive import DelegationPrimitive
from .subagent import SYSTEM_PROMPT, subagent_endpoint, task_tool

__all__ = [
    "SYSTEM_PROMPT",
    "AgentFleet",
    "DelegationError",
    "DelegationPrimitive",
    "FleetMember",
    "delegate_tool",
    "resolve_fleets",
    "subagent_endpoint",
    "task_tool",
]
