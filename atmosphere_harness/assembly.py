"""Assembly: the default primitives and backends wired into one `HarnessHost`.

The kernel never imports a primitive; this module (used by the router's lifespan, and by anyone
building a host by hand) is where the built-in set is chosen and given its backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .backends import StateBackends, resolve_backends
from .contracts import Primitive
from .delegation.primitive import DelegationPrimitive
from .filesystem.primitive import FilesystemPrimitive
from .governance.approval import ToolApprovalPolicy
from .governance.primitive import GovernancePrimitive
from .kernel.host import HarnessHost
from .memory.long_term import LongTermMemory
from .memory.primitive import MemoryPrimitive
from .planning import PlanningPrimitive
from .registry import AgentSpec
from .runtimes.base import AgentRuntime
from .settings import HarnessSettings


def default_primitives(
    backends: StateBackends | None = None,
    *,
    long_term_memory: LongTermMemory | None = None,
    policies: Sequence[Any] = (),
    approval_policy: ToolApprovalPolicy | None = None,
) -> list[Primitive]:
    """The built-in primitives, in attach order, on `backends` (embedded when `None`)."""
    backends = backends or StateBackends(state="sqlite", events="local")
    return [
        MemoryPrimitive(
            history=backends.history,
            long_term_memory=long_term_memory,
            fallback_long_term_memory=backends.long_term_memory,
        ),
        PlanningPrimitive(backends.plan_bus, stores=backends.plan_stores),
        FilesystemPrimitive(usage=backends.workspace_usage),
        GovernancePrimitive(
            policies=policies, approval_policy=approval_policy, approvals=backends.approvals
        ),
        DelegationPrimitive(),
    ]


def build_host(
    settings: HarnessSettings,
    *,
    runtime: AgentRuntime,
    specs: Sequence[AgentSpec],
    primitives: Sequence[Primitive] | None = None,
    long_term_memory: LongTermMemory | None = None,
    policies: Sequence[Any] = (),
    approval_policy: ToolApprovalPolicy | None = None,
) -> HarnessHost:
    """A host on the backends `settings` choose, with the default primitives unless given."""
    backends = resolve_backends(settings)
    chosen = (
        list(primitives)
        if primitives is not None
        else default_primitives(
            backends,
            long_term_memory=long_term_memory,
            policies=policies,
            approval_policy=approval_policy,
        )
    )
    host = HarnessHost(
        settings,
        runtime=runtime,
        specs=specs,
        primitives=chosen,
        locks=backends.locks,
        runs=backends.runs,
        resources=backends.resources,
    )
    host.backends = backends.describe()
    return host
