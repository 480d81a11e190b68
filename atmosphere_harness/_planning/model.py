"""The plan: `PlanStatus`, `PlanStep`, `AgentPlan`, their Markdown and their two JSON forms.

The *wire* form is what clients see in a `plan-update` frame (`status` lower-case, `activeForm`
only when set). The *stored* form is the same shape plus nothing else, so a plan file can be read
back by hand and served by the admin API without translation. Reading is lenient (upper-case
statuses and `active_form` are accepted too) so documents written by other tools still load.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class PlanStatus(enum.Enum):
    """Where one step stands. The values are the wire (and stored) names."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    ABANDONED = "abandoned"

    @property
    def marker(self) -> str:
        """The Markdown checkbox of the status: `[ ]`, `[~]`, `[x]` or `[-]`."""
        return _MARKERS[self]

    @classmethod
    def parse(cls, value: object) -> PlanStatus | None:
        """Lenient parse: case-insensitive, trimmed, with the aliases models use.

        `None` or blank is `PENDING`; a value that matches nothing returns `None`, so the caller
        decides whether to reject it (`write_todos` does) or default it.
        """
        if isinstance(value, PlanStatus):
            return value
        if value is None:
            return cls.PENDING
        text = str(value).strip().lower()
        if not text:
            return cls.PENDING
        return _ALIASES.get(text)


_MARKERS = {
    PlanStatus.PENDING: "[ ]",
    PlanStatus.IN_PROGRESS: "[~]",
    PlanStatus.COMPLETED: "[x]",
    PlanStatus.ABANDONED: "[-]",
}

_ALIASES: dict[str, PlanStatus] = {
    **dict.fromkeys(("pending", "todo", "to-do", "not_started"), PlanStatus.PENDING),
    **dict.fromkeys(
        ("in_progress", "in-progress", "in progress", "inprogress", "active", "doing"),
        PlanStatus.IN_PROGRESS,
    ),
    **dict.fromkeys(("completed", "complete", "done", "finished"), PlanStatus.COMPLETED),
    **dict.fromkeys(("abandoned", "cancelled", "canceled", "skipped"), PlanStatus.ABANDONED),
}

STATUS_NAMES = ", ".join(status.value for status in PlanStatus)
"""`pending, in_progress, completed, abandoned`: for messages that list the valid statuses."""


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One todo: what to do (`content`), where it stands, and how to say it while it runs.

    `active_form` is the present-continuous wording ("Running tests") shown for the step in
    progress; its wire name is `activeForm`.
    """

    content: str
    status: PlanStatus = PlanStatus.PENDING
    active_form: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.content, str) or not self.content.strip():
            raise ValueError("a plan step needs a non-empty content")
        if not isinstance(self.status, PlanStatus):
            raise TypeError(f"status must be a PlanStatus, got {self.status!r}")
        if self.active_form is not None and not self.active_form.strip():
            object.__setattr__(self, "active_form", None)

    @property
    def text(self) -> str:
        """The line shown for the step: `active_form` while in progress, else `content`."""
        if self.status is PlanStatus.IN_PROGRESS and self.active_form:
            return self.active_form
        return self.content

    def to_wire(self) -> dict[str, str]:
        wire = {"content": self.content, "status": self.status.value}
        if self.active_form:
            wire["activeForm"] = self.active_form
        return wire

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PlanStep:
        """Read a stored or wire step (lenient about status case and `active_form`)."""
        status = PlanStatus.parse(data.get("status"))
        if status is None:
            raise ValueError(f"unknown plan status {data.get('status')!r}")
        active = data.get("activeForm", data.get("active_form"))
        return cls(
            content=data.get("content"),  # type: ignore[arg-type]  # checked in __post_init__
            status=status,
            active_form=active if isinstance(active, str) else None,
        )


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """The whole plan of one agent in one conversation: ordered steps and an optional goal.

    A plan is replaced as a whole, never patched: `write_todos` always sends the full list, so
    there is no index bookkeeping to get wrong. Instances are immutable: `steps` is stored as a
    tuple copied from the sequence given (`None` reads as no steps).
    """

    steps: Sequence[PlanStep] = field(default_factory=tuple)
    goal: str | None = None

    def __post_init__(self) -> None:
        steps = tuple(self.steps) if self.steps is not None else ()
        for step in steps:
            if not isinstance(step, PlanStep):
                raise TypeError(f"plan steps must be PlanStep objects, got {step!r}")
        object.__setattr__(self, "steps", steps)
        if self.goal is not None and not self.goal.strip():
            object.__setattr__(self, "goal", None)

    def to_markdown(self) -> str:
        """The checklist the model gets back: `Goal:` line, one `- [marker] text` per step.

        Example: `Goal: Ship it\\n- [x] Write tests\\n- [~] Fixing bug\\n- [ ] Update docs`.
        An empty plan reads `(no steps)`; there is no trailing newline.
        """
        lines = [f"Goal: {self.goal}"] if self.goal else []
        if not self.steps:
            lines.append("(no steps)")
        lines.extend(f"- {step.status.marker} {step.text}" for step in self.steps)
        return "\n".join(lines)

    def wire_steps(self) -> list[dict[str, str]]:
        return [step.to_wire() for step in self.steps]

    def to_wire(self, *, conversation_id: str, agent_id: str) -> dict[str, Any]:
        """The `plan-update` frame's data (DESIGN section 3)."""
        return {
            "steps": self.wire_steps(),
            "goal": self.goal,
            "conversationId": conversation_id,
            "agentId": agent_id,
        }

    def to_json(self) -> str:
        """The stored document: compact UTF-8 JSON of `{"goal", "steps"}`."""
        return json.dumps(
            {"goal": self.goal, "steps": self.wire_steps()},
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> AgentPlan:
        """Parse a stored document; raises `ValueError` when it is not a plan."""
        data = json.loads(text)
        if not isinstance(data, Mapping):
            raise ValueError("a plan document must be a JSON object")
        raw_steps = data.get("steps") or []
        if not isinstance(raw_steps, list) or not all(isinstance(s, Mapping) for s in raw_steps):
            raise ValueError("a plan document's steps must be a list of objects")
        goal = data.get("goal")
        return cls(
            tuple(PlanStep.from_wire(step) for step in raw_steps),
            goal if isinstance(goal, str) else None,
        )
