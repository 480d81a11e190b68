"""Assembly: the default primitives and backends wired into one `HarnessHost`.

The kernel never imports a primitive; this module (used by the router's lifespan, and by anyone
building a host by hand) is where the built-in set is chosen and given its backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from ._backends import StateBackends, resolve_backends
from ._contracts import USER_DAILY_CAP, Primitive, RunHooks
from ._delegation.primitive import DelegationPrimitive
from ._filesystem.primitive import FilesystemPrimitive
from ._governance.approval import ToolApprovalPolicy
from ._governance.primitive import GovernancePrimitive
from ._kernel.budget import UsageLimitsHook, UserDailyTokensHook
from ._kernel.fallback import ModelFallbackHook
from ._kernel.host import HarnessHost
from ._limits import UsageLimits
from ._mcp.primitive import MCPPrimitive
from ._memory.long_term import LongTermMemory
from ._memory.primitive import MemoryPrimitive
from ._planning import PlanningPrimitive
from ._registry import AgentSpec
from ._runtimes.base import AgentRuntime
from ._runtimes.fallback import FallbackRuntime
from ._runtimes.resolve import runtime_from_ref
from ._settings import HarnessSettings
from ._skills.primitive import SkillsPrimitive
from ._tracing import state as tracing_state
from ._tracing import tracing_hooks


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
        FilesystemPrimitive(
            usage=backends.workspace_usage,
            workspaces=backends.workspaces,
            route_stores=backends.route_stores,
        ),
        SkillsPrimitive(),
        GovernancePrimitive(
            policies=policies, approval_policy=approval_policy, approvals=backends.approvals
        ),
        DelegationPrimitive(),
        MCPPrimitive(),  # last: a tool-name collision is checked against every built-in
    ]


def run_hooks(
    backends: StateBackends,
    settings: HarnessSettings | None = None,
    *,
    runtime: AgentRuntime | None = None,
    specs: Sequence[AgentSpec] = (),
) -> list[RunHooks]:
    """The `RunHooks` around every model and tool call, outermost first, each only when on.

    The order is fixed: tracing (spans see everything, retries and replays included),
    cancellation, usage limits (a replayed turn still counts), durable replay (a replayed call
    never reaches the model or the tool), model fallback (innermost: the journal records the
    one answer the chain gave). Usage limits are on when the settings or an agent set any (the
    per-user daily token cap, when set, sits right inside durable replay, so a replayed turn
    is not counted twice); model fallback when the app's runtime or an agent has a fallback
    chain.

    Cancellation needs no hook today: `kernel.control` stops a run through its task, which
    reaches it wherever it waits (for its conversation's lock, a model, a tool, a person),
    where a hook sees only model and tool calls; the slot stays for a hook that would need to
    see a cancelled call.
    """
    app_limits = settings.groups.usage.limits if settings is not None else UsageLimits()
    limited = app_limits.any or any(spec.usage_limits is not None for spec in specs)
    chained = isinstance(runtime, FallbackRuntime) or any(
        spec.fallback_models or isinstance(spec.model, FallbackRuntime) for spec in specs
    )
    daily = settings.groups.usage.user_daily_token_limit if settings is not None else None
    tracing = (
        tracing_hooks(settings, approvals=backends.approvals) if settings is not None else None
    )
    hooks = (
        tracing,
        UsageLimitsHook(app_limits) if limited else None,
        backends.runs.hooks,
        # Inside durable replay: a resumed run's replayed turns were counted in its first life.
        UserDailyTokensHook(backends.user_tokens, daily) if daily is not None else None,
        ModelFallbackHook() if chained else None,
    )
    return [hook for hook in hooks if hook is not None]


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
        prompt_keys=backends.prompt_keys,
        resources=backends.resources,
        scrubbers=backends.scrubbers,
        hooks=run_hooks(backends, settings, runtime=runtime, specs=specs),
        models=partial(runtime_from_ref, settings=settings),
        owners=backends.owners,
        registry=backends.run_registry,
    )
    for hook in host.hooks:
        if isinstance(hook, UserDailyTokensHook):
            # The memory primitive's own model calls count toward the same cap.
            host.services.set(USER_DAILY_CAP, hook)
    host.backends = backends.describe()
    host.truth.set_tracing(tracing_state(settings))
    return host
