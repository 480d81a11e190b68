"""`GovernancePrimitive`: puts the policy chain and the approval gate on every endpoint.

Governance is not a harness feature an endpoint opts into: every hosted endpoint (bare ones
included) and every sub-agent is governed. The policies are `create_harness_router(policies=...)`
then the `atmosphere_harness.policies` entry-point group; the approval policy is the agent class's
`approval_policy` attribute, else `create_harness_router(approval_policy=...)`, else
`ToolApprovalPolicy.annotated()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._contracts import PENDING_APPROVALS, Endpoint, Host, Key, Primitive
from .._log import get_logger
from .approval import ToolApprovalPolicy
from .approvals import ApprovalRegistry, ApprovalStore
from .chain import PolicyChain, load_policies
from .gate import ApprovalGate, PostResponse, ToolCallAdmission

log = get_logger(__name__)

CHAIN_SERVICE: Key[PolicyChain] = Key("governance.chain")
"""`host.services` key of the app's `PolicyChain`."""
APPROVALS_SERVICE: Key[ApprovalStore] = Key("governance.approvals")
"""`host.services` key of the app's `ApprovalStore`."""


def policy_chain(host: Host) -> PolicyChain:
    """The app's policy chain (an empty one when governance is not running)."""
    chain = host.services.get(CHAIN_SERVICE)
    # Not `or`: an empty chain is falsy, and policies installed into it later must apply.
    return chain if chain is not None else PolicyChain()


class GovernancePrimitive(Primitive):
    name = "governance"

    def __init__(
        self,
        *,
        policies: Sequence[Any] = (),
        approval_policy: ToolApprovalPolicy | None = None,
        approvals: ApprovalStore | None = None,
    ) -> None:
        """`policies` run before the entry-point ones; `approval_policy` is the app's default
        (an agent class's `approval_policy` wins); `approvals` comes from `backends`."""
        self._policies = tuple(policies)
        self._approval_policy = approval_policy
        self._given_approvals = approvals
        self.chain = PolicyChain()
        # `is None`, not `or`: a store with a length (none waiting yet) is still the one given.
        self.approvals: ApprovalStore = approvals if approvals is not None else ApprovalRegistry()

    async def start(self, host: Host) -> None:
        self.chain = load_policies(self._policies)
        given = self._given_approvals
        self.approvals = given if given is not None else ApprovalRegistry()
        host.services.set(CHAIN_SERVICE, self.chain)
        host.services.set(APPROVALS_SERVICE, self.approvals)
        if self.chain:
            names = [policy.name for policy in self.chain.policies]
            log.info("governance policies installed", policies=names)

    def attach(self, endpoint: Endpoint, host: Host) -> None:
        declared = getattr(endpoint.spec.cls, "approval_policy", None) if endpoint.spec else None
        policy = declared or self._approval_policy or ToolApprovalPolicy.annotated()
        if not isinstance(policy, ToolApprovalPolicy):
            raise TypeError(
                f"{endpoint.path}: approval_policy must be a ToolApprovalPolicy, got {policy!r}"
            )
        endpoint.admission_hooks.append(ToolCallAdmission(self.chain))
        endpoint.result_hooks.append(PostResponse(self.chain))
        gate = ApprovalGate(policy, self.approvals, host.settings.groups.runtime.approval_timeout)
        endpoint.approval_hook = gate
        endpoint.services.set(PENDING_APPROVALS, gate)
        approvals, path = self.approvals, endpoint.path

        async def forget(conversation_id: str, user_id: str | None) -> None:
            await approvals.forget(path, conversation_id)

        endpoint.forget_hooks.append(forget)

    async def stop(self, host: Host) -> None:
        host.services.pop(CHAIN_SERVICE)
        host.services.pop(APPROVALS_SERVICE)
