"""`PolicyChain`: the installed policies, evaluated in order, fail-closed.

One chain per app, built when the host starts from `create_harness_router(policies=...)` followed
by the policies of the `atmosphere_harness.policies` entry-point group, de-duplicated by name
(the first wins). Tool calls, `task` spawns and `delegate_task` dispatches all read this one
chain when they run, so a policy installed later (`chain.install(policy)`) governs all three
(Atmosphere snapshots the list for `task` and the fleet when a coordinator registers).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._log import get_logger
from .policy import (
    DECISIONS,
    Admit,
    Deny,
    GovernancePolicy,
    PolicyContext,
    PolicyPhase,
    PolicyRequest,
    Prefer,
    Transform,
)

log = get_logger(__name__)

ENTRY_POINT_GROUP = "atmosphere_harness.policies"
POLICY_TIMEOUT = 10.0
"""Seconds an `async` policy may take before it counts as failed (and so denies)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The chain's answer: the request to run (maybe transformed), or who stopped it and why.

    `failure` is set instead of `reason` when the stopping policy raised, timed out or returned
    something that is not a decision (each caller words that its own way, as Atmosphere does).
    """

    request: PolicyRequest
    denied_by: str | None = None
    reason: str | None = None
    failure: str | None = None

    @property
    def admitted(self) -> bool:
        return self.denied_by is None


def is_policy(value: object) -> bool:
    name = getattr(value, "name", None)
    named = isinstance(name, str) and bool(name.strip())
    return named and callable(getattr(value, "evaluate", None))


class PolicyChain:
    """Ordered, de-duplicated policies; `admit` runs pre-admission, `release` post-response."""

    def __init__(self, policies: Iterable[GovernancePolicy] = ()) -> None:
        self._policies: list[GovernancePolicy] = []
        for policy in policies:
            self.install(policy)

    @property
    def policies(self) -> tuple[GovernancePolicy, ...]:
        return tuple(self._policies)

    def __bool__(self) -> bool:
        return bool(self._policies)

    def install(self, policy: GovernancePolicy) -> bool:
        """Append a policy; `False` (and a WARN) when one of that name is already installed."""
        if not is_policy(policy):
            raise TypeError(
                f"{policy!r} is not a governance policy: it needs a non-blank `name` and an "
                "`evaluate(ctx)` method"
            )
        if any(existing.name == policy.name for existing in self._policies):
            log.warning("duplicate governance policy name; keeping the first", policy=policy.name)
            return False
        self._policies.append(policy)
        return True

    async def admit(self, ctx: PolicyContext) -> Verdict:
        """Evaluate every policy in order until one denies; `Transform`s feed the next policy."""
        request = ctx.request
        for policy in tuple(self._policies):
            current = PolicyContext(
                ctx.phase,
                request,
                ctx.accumulated_response,
                ctx.user_id,
                ctx.conversation_id,
                ctx.agent,
            )
            try:
                decision = await _evaluate(policy, current)
            except Exception as exc:
                detail = str(exc) or type(exc).__name__
                log.error(
                    "governance policy failed; denying (fail-closed)",
                    policy=policy.name,
                    error=detail,
                    exc_info=not isinstance(exc, TimeoutError | TypeError),
                )
                return Verdict(request, denied_by=policy.name, failure=detail)
            if isinstance(decision, Deny):
                log.info("governance policy denied", policy=policy.name, reason=decision.reason)
                return Verdict(request, denied_by=policy.name, reason=decision.reason)
            if isinstance(decision, Transform):
                request = decision.request
            elif isinstance(decision, Prefer):
                log.debug(
                    "governance policy prefers",
                    policy=policy.name,
                    preferred=decision.preferred,
                    reason=decision.reason,
                )
        return Verdict(request)

    async def release(self, ctx: PolicyContext) -> None:
        """Post-response: every policy runs whatever the others say (stateful policies release
        what they took at admission); denials here are logged only."""
        for policy in tuple(self._policies):
            try:
                decision = await _evaluate(policy, ctx)
            except Exception as exc:
                log.warning(
                    "governance policy failed after the response",
                    policy=policy.name,
                    error=str(exc),
                )
                continue
            if isinstance(decision, Deny):
                log.info(
                    "governance policy flagged a response",
                    policy=policy.name,
                    reason=decision.reason,
                )


async def _evaluate(policy: GovernancePolicy, ctx: PolicyContext) -> Any:
    outcome = policy.evaluate(ctx)
    if inspect.isawaitable(outcome):
        outcome = await asyncio.wait_for(outcome, POLICY_TIMEOUT)
    if not isinstance(outcome, DECISIONS):
        raise TypeError(f"returned {type(outcome).__name__}, not Admit/Deny/Transform/Prefer")
    if isinstance(outcome, Transform) and not isinstance(outcome.request, PolicyRequest):
        raise TypeError("returned a Transform without a PolicyRequest")
    if ctx.phase is PolicyPhase.POST_RESPONSE and isinstance(outcome, Transform):
        return Admit()
    return outcome


def load_policies(explicit: Sequence[Any], *, group: str = ENTRY_POINT_GROUP) -> PolicyChain:
    """The app's chain: `explicit` first, then every policy the entry-point group provides.

    An entry point may name a policy object, a class (instantiated without arguments) or a
    function returning a policy or a list of them. One that fails to load stops the app: a
    governance package that silently did nothing would fail open.
    """
    chain = PolicyChain()
    for index, policy in enumerate(explicit):
        if not is_policy(policy):
            raise TypeError(
                f"policies[{index}] ({policy!r}) is not a governance policy: it needs a "
                "non-blank `name` and an `evaluate(ctx)` method"
            )
        chain.install(policy)
    for entry in importlib.metadata.entry_points(group=group):
        try:
            for policy in _from_entry_point(entry.load()):
                chain.install(policy)
        except Exception as exc:
            raise RuntimeError(
                f"governance entry point {entry.name!r} ({entry.value}) failed to load: {exc}"
            ) from exc
        log.info("governance policies loaded from entry point", entry_point=entry.name)
    return chain


def _from_entry_point(loaded: object) -> list[Any]:
    if is_policy(loaded):
        return [loaded]
    if callable(loaded):
        produced = loaded()
        if is_policy(produced):
            return [produced]
        if isinstance(produced, Iterable) and not isinstance(produced, str | bytes):
            items = list(produced)
            if all(is_policy(item) for item in items):
                return items
        raise TypeError(f"{loaded!r} produced {produced!r}, not a policy or a list of policies")
    raise TypeError(f"{loaded!r} is not a policy, a policy class or a policy factory")
