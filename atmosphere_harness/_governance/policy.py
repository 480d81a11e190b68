"""The governance SPI: `GovernancePolicy`, what it sees (`PolicyContext`) and what it decides.

A policy is any object with a `name` and an `evaluate(ctx)` method (plain or `async`) returning
one of four decisions:

- `Admit()` — let it through;
- `Deny(reason)` — stop it; the reason is shown to the model (and must not be blank);
- `Transform(request)` — let a rewritten request through: later policies see the rewrite, and the
  rewrite is what runs (the sub-agent's description, the delegated message, a tool's arguments);
- `Prefer(preferred, reason)` — advisory: admitted like `Admit`, and logged.

The harness evaluates policies at three points, each with one synthetic request:

- every tool call: message `call_tool:<name>`, metadata `tool_name`, `action` (`call_tool`) and,
  when there are arguments, `tool_args` and `tool_args_preview` (200 characters);
- a `task` spawn: message = the sub-agent's description, metadata `subagent.spawn`;
- a `delegate_task` dispatch: message = the delegated text, metadata `fleet.dispatch.agent` and
  `fleet.dispatch.skill`.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeAlias, runtime_checkable


class PolicyPhase(enum.Enum):
    """When a policy is asked: before the action runs, or after it answered."""

    PRE_ADMISSION = "pre-admission"
    POST_RESPONSE = "post-response"


@dataclass(frozen=True, slots=True)
class PolicyRequest:
    """The request a policy judges: a message and its metadata (see the module table)."""

    message: str
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def with_message(self, message: str) -> PolicyRequest:
        """The same request carrying another message (the usual body of a `Transform`)."""
        return replace(self, message=message)

    def with_metadata(self, **changes: Any) -> PolicyRequest:
        """The same request with some metadata entries replaced (e.g. `tool_args=...`)."""
        return replace(self, metadata={**self.metadata, **changes})


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy sees: the phase, the request, and who is asking.

    `accumulated_response` is the result the model got, in the post-response phase only.
    """

    phase: PolicyPhase
    request: PolicyRequest
    accumulated_response: str | None = None
    user_id: str | None = None
    conversation_id: str | None = None
    agent: str | None = None
    """The owner of the endpoint that asked (an agent name, or a sub-agent's id)."""


@dataclass(frozen=True, slots=True)
class Admit:
    """Let the request through unchanged."""


@dataclass(frozen=True, slots=True)
class Deny:
    """Stop the request; `reason` is shown to the model."""

    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError("a Deny needs a non-blank reason")


@dataclass(frozen=True, slots=True)
class Transform:
    """Let a rewritten request through (pre-admission only; post-response it admits)."""

    request: PolicyRequest


@dataclass(frozen=True, slots=True)
class Prefer:
    """Advisory: admitted, and the preference is logged for whoever reviews decisions."""

    preferred: str
    reason: str = ""


PolicyDecision: TypeAlias = Admit | Deny | Transform | Prefer
DECISIONS = (Admit, Deny, Transform, Prefer)


@runtime_checkable
class GovernancePolicy(Protocol):
    """A named rule evaluated on the critical path; `evaluate` may be `async`.

    Example:
        ```python
        class NoDeletes:
            name = "no-deletes"

            def evaluate(self, ctx: PolicyContext) -> PolicyDecision:
                if ctx.request.metadata.get("tool_name") == "delete":
                    return Deny("deleting files is not allowed here")
                return Admit()
        ```

    A policy that raises, times out or returns something that is not a decision denies the
    request (fail-closed).
    """

    name: str

    def evaluate(self, ctx: PolicyContext) -> PolicyDecision | Awaitable[PolicyDecision]: ...
