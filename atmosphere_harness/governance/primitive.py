"""`GovernancePrimitive`: puts the policy chain and the approval gate on every endpoint.

Governance is not a harness feature an endpoint opts into: every hosted endpoint (bare ones
included) and every sub-agent is governed. The policies are `create_harness_router(policies=...)`
then the `atmosphere_harness.policies` entry-point group; the approval policy is the agent class's
`approval_policy` attribute, else `create_harness_router(approval_policy=...)`, else
`ToolApprovalPolicy.annotated()`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..attach import Primitive
from ..log import get_logger
from .approval import ToolApprovalPolicy
from .approvals import ApprovalRegistry
from .chain import PolicyChain, load_policies
from .gate import ApprovalGate, PostResponse, ToolCallAdmission

if TYPE_CHECKING:
    from ..kernel.endpoint import HostedEndpoint
    from ..kernel.host import HarnessHost

log = get_logger(__name__)

CHAIN_SERVICE = "governance"
"""`host.services` key of the app's `PolicyChain`."""
APPROVALS_SERVICE = "approvals"
"""`host.services` key of the app's `ApprovalRegistry`."""


def policy_chain(host: HarnessHost) -> PolicyChain:
    """The app's policy chain (an empty one when governance is not running)."""
    chain = host.services.get(CHAIN_SERVICE)
    return chain if isinstance(chain, PolicyChain) else PolicyChain()


class GovernancePrimitive(Primitive):
    name = "governance"

    def __init__(self) -> None:
        self.chain = PolicyChain()
        self.approvals = ApprovalRegistry()

    async def start(self, host: HarnessHost) -> None:
        self.chain = load_policies(tuple(host.options.get("policies") or ()))
        self.approvals = ApprovalRegistry()
        host.services[CHAIN_SERVICE] = self.chain
        host.services[APPROVALS_SERVICE] = self.approvals
        if self.chain:
            names = [policy.name for policy in self.chain.policies]
            log.info("governance policies installed", policies=names)

    def attach(self, endpoint: HostedEndpoint, host: HarnessHost) -> None:
        declared = getattr(endpoint.spec.cls, "approval_policy", None) if endpoint.spec else None
        policy = declared or host.options.get("approval_policy") or ToolApprovalPolicy.annotated()
        if not isinstance(policy, ToolApprovalPolicy):
            raise TypeError(
                f"{endpoint.path}: approval_policy must be a ToolApprovalPolicy, got {policy!r}"
            )
        endpoint.admission_hooks.append(ToolCallAdmission(self.chain))
        endpoint.result_hooks.append(PostResponse(self.chain))
        endpoint.approval_hook = ApprovalGate(
            policy, self.approvals, host.settings.approval_timeout
        )

    async def stop(self, host: HarnessHost) -> None:
        host.services.pop(CHAIN_SERVICE, None)
        host.services.pop(APPROVALS_SERVICE, None)
