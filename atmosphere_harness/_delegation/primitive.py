"""`DelegationPrimitive`: fleets validated at start-up; `delegate_task` and `task` on coordinators.

DELEGATION resolved on a `@coordinator` registers both tools (a user tool of the same name wins)
and reports `delegation` = `ACTIVE`, or `ACTIVE(user-tool)` when the user's `delegate_task` wins.
On a plain `@agent` or `ai_endpoint` the feature has nothing to attach: its truth stays
`INACTIVE(no-coordinator)` (seeded by the preset), as Atmosphere's Java harness reports it.
"""

from __future__ import annotations

from .._contracts import Endpoint, Host, Key, Primitive
from .._governance.primitive import policy_chain
from .._harness import Harness
from .._preset import ACTIVE, DELEGATION
from .._registry import EndpointKind
from .delegate import delegate_tool
from .fleet import AgentFleet, resolve_fleets
from .subagent import task_tool

USER_TOOL = "ACTIVE(user-tool)"
FLEET_SERVICE: Key[AgentFleet] = Key("delegation.fleet")
"""`endpoint.services` key of a coordinator's `AgentFleet`."""


class DelegationPrimitive(Primitive):
    name = "delegation"

    def __init__(self) -> None:
        self.fleets: dict[str, AgentFleet] = {}

    async def start(self, host: Host) -> None:
        self.fleets = resolve_fleets(host)

    def attach(self, endpoint: Endpoint, host: Host) -> None:
        spec = endpoint.spec
        if spec is None or spec.kind is not EndpointKind.COORDINATOR:
            return
        if not endpoint.has(Harness.DELEGATION):
            return
        fleet = self.fleets.get(spec.name) or AgentFleet(spec.name, [])
        chain = policy_chain(host)
        endpoint.services.set(FLEET_SERVICE, fleet)
        delegated = endpoint.add_builtin_tool(delegate_tool(host, fleet, chain))
        endpoint.add_builtin_tool(task_tool(host.settings, chain))
        endpoint.report(DELEGATION, ACTIVE if delegated else USER_TOOL)

    async def stop(self, host: Host) -> None:
        self.fleets = {}
