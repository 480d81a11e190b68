"""Governance: policies on every tool call, `task` spawn and fleet dispatch, and approvals.

- `policy`: the SPI (`GovernancePolicy`, `PolicyContext`, `Admit`, `Deny`, `Transform`, `Prefer`);
- `chain`: `PolicyChain` (ordered, fail-closed) and the entry-point loader;
- `approval`: `ToolApprovalPolicy` (which calls wait for a person);
- `approvals`: the registry of pending approvals;
- `gate`: the executor hooks; `primitive`: `GovernancePrimitive`, which installs them.
"""

from .approval import ToolApprovalPolicy
from .approvals import Answer, AnswerStatus, ApprovalRegistry, ApprovalStore, PendingApproval
from .chain import ENTRY_POINT_GROUP, PolicyChain, Verdict, load_policies
from .policy import (
    Admit,
    Deny,
    GovernancePolicy,
    PolicyContext,
    PolicyDecision,
    PolicyPhase,
    PolicyRequest,
    Prefer,
    Transform,
)
from .primitive import GovernancePrimitive, policy_chain

__all__ = [
    "ENTRY_POINT_GROUP",
    "Admit",
    "Answer",
    "AnswerStatus",
    "ApprovalRegistry",
    "ApprovalStore",
    "Deny",
    "GovernancePolicy",
    "GovernancePrimitive",
    "PendingApproval",
    "PolicyChain",
    "PolicyContext",
    "PolicyDecision",
    "PolicyPhase",
    "PolicyRequest",
    "Prefer",
    "ToolApprovalPolicy",
    "Transform",
    "Verdict",
    "load_policies",
    "policy_chain",
]
