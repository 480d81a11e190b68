"""Fleets: who a coordinator may delegate to, validated at start-up, and how a member is called.

`resolve_fleets(host)` runs when the host starts, before any endpoint is attached. It resolves
every coordinator's `fleet=[...]` (agent classes or agent names) and stops the app with a clear
error on an entry that is not a declared agent, a member listed twice, an `ai_endpoint` member,
a headless member with no skill to call, or a cycle (`a -> b -> a`, or a coordinator in its own
fleet). A class listed in a fleet but not in `create_harness_router(agents=[...])` is hosted too:
the fleet declares it.

A member is called in one of two ways:

- a prompt agent runs its own `@prompt` method, with its full harness, in a conversation of its
  own that is stable per coordinator conversation (so it remembers earlier delegations there);
  its frames stay out of the coordinator's stream, except the `approval-required` frames of its
  gated calls (tagged `fleetAgent`), which the coordinator's client answers;
- a headless agent runs its `@skill` handler: the one named `default`, else its only skill.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _events as events
from .._errors import DelegationError
from .._events import Frame
from .._injection import resolved_hints
from .._registry import AgentSpec, EndpointKind, spec_of
from .._tools.base import ToolContext, render_result

if TYPE_CHECKING:
    from .._contracts import Host, Run, Stream

DEFAULT_SKILL = "default"
PROMPT_SKILL = "prompt"
_MEMBER_CONVERSATIONS = uuid.UUID("6f1d3c1e-5b0a-4c55-9a59-5c8f7e0b2d41")

FORWARDED = frozenset(
    {events.APPROVAL_REQUIRED, events.SUBAGENT_START, events.SUBAGENT_END, events.MODEL_FALLBACK}
)
"""A child run's frames that reach its parent's stream (tagged): what a person must see."""


SkillCall = Callable[[str, ToolContext], Awaitable[Any]]


@dataclass(frozen=True)
class FleetMember:
    """One agent a coordinator may delegate to."""

    spec: AgentSpec
    skill: str
    call_skill: SkillCall | None = None
    """The headless member's skill handler; `None` for a prompt agent."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def description(self) -> str:
        lines = (self.spec.description or "").strip().splitlines()
        return lines[0] if lines else ""


class AgentFleet:
    """A coordinator's members, by name, in declaration order."""

    def __init__(self, coordinator: str, members: list[FleetMember]) -> None:
        self.coordinator = coordinator
        self.members: dict[str, FleetMember] = {member.name: member for member in members}

    def names(self) -> list[str]:
        return list(self.members)

    def get(self, name: str) -> FleetMember | None:
        return self.members.get(name)

    async def call(
        self, host: Host, member: FleetMember, message: str, context: ToolContext
    ) -> str:
        """The member's reply to `message`; raises `DelegationError` when it fails."""
        if member.call_skill is not None:
            return render_result(await member.call_skill(message, context))
        return await self._prompt(host, member, message, context.run)

    async def _prompt(self, host: Host, member: FleetMember, message: str, run: Run) -> str:
        if host.endpoint(member.spec.path) is None:
            raise DelegationError(f"agent '{member.name}' is not hosted")
        collected = _Reply(run.session, member.name)
        await host.prompt(
            member.spec.path,
            message=message,
            conversation_id=member_conversation(run, member.name),
            user_id=run.user_id,
            sink=collected,
            parent=run,
        )
        return collected.result()


def member_conversation(run: Run, member: str) -> str:
    """The member's conversation for this coordinator conversation (stable, opaque)."""
    key = f"{run.endpoint.path}\0{run.conversation_id}\0{member}"
    return str(uuid.uuid5(_MEMBER_CONVERSATIONS, key))


async def forward(
    session: Stream, frame: Frame, tags: Mapping[str, str], *, also: frozenset[str]
) -> None:
    """Put a child run's frame on its parent's stream, tagged, if it is one a parent needs."""
    if frame.event in FORWARDED or frame.event in also:
        data = dict(frame.data)
        for key, value in tags.items():
            data.setdefault(key, value)
        await session.emit(frame.event, data)


class _Reply:
    """A member run's sink: keeps its answer, forwards what the coordinator's client needs."""

    def __init__(self, parent: Stream, member: str) -> None:
        self._parent = parent
        self._tags = {"fleetAgent": member}
        self._text: list[str] = []
        self._summary: str | None = None
        self._error: str | None = None

    async def __call__(self, frame: Frame) -> None:
        if frame.event == events.TEXT:
            self._text.append(str(frame.data.get("text", "")))
        elif frame.event == events.COMPLETE:
            summary = frame.data.get("summary")
            self._summary = summary if isinstance(summary, str) else None
        elif frame.event == events.ERROR:
            self._error = str(frame.data.get("message") or "") or "no error detail"
        else:
            await forward(self._parent, frame, self._tags, also=frozenset())

    def result(self) -> str:
        if self._error is not None:
            raise DelegationError(self._error)
        return self._summary if self._summary is not None else "".join(self._text)


# --- start-up validation -------------------------------------------------------------------


def resolve_fleets(host: Host) -> dict[str, AgentFleet]:
    """Every coordinator's validated fleet, by coordinator name (see the module docstring)."""
    coordinators = [spec for spec in host.specs if spec.kind is EndpointKind.COORDINATOR]
    pending = list(coordinators)
    while pending:
        spec = pending.pop()
        for entry in spec.fleet:
            if isinstance(entry, type):
                added = _include(host, spec, entry)
                if added is not None and added.kind is EndpointKind.COORDINATOR:
                    coordinators.append(added)
                    pending.append(added)
    graph: dict[str, list[AgentSpec]] = {}
    for spec in coordinators:
        graph[spec.name] = _members(host, spec)
    _check_cycles(graph)
    instances: dict[type, object] = {}
    return {
        name: AgentFleet(name, [_member(spec, instances) for spec in members])
        for name, members in graph.items()
    }


def _include(host: Host, coordinator: AgentSpec, cls: type) -> AgentSpec | None:
    """Host a fleet class the router was not given; returns its spec when it was added."""
    try:
        spec = spec_of(cls)
    except TypeError:
        raise ValueError(
            f"coordinator '{coordinator.name}': fleet entry {cls.__name__} is not decorated "
            "with @agent or @coordinator"
        ) from None
    if spec.kind is EndpointKind.AI_ENDPOINT:
        return None  # reported by _members with the other entry errors
    known = host.agents.get(spec.name)
    if known is not None:
        if known.cls is not cls:
            raise ValueError(
                f"coordinator '{coordinator.name}': fleet entry {cls.__name__} is named "
                f"{spec.name!r}, like {known.cls.__name__}"
            )
        return None
    if not spec.headless and any(other.path == spec.path for other in host.specs):
        raise ValueError(f"fleet entry {cls.__name__}: {spec.path} is already served")
    host.specs.append(spec)
    host.agents[spec.name] = spec
    return spec


def _members(host: Host, coordinator: AgentSpec) -> list[AgentSpec]:
    members: list[AgentSpec] = []
    seen: set[str] = set()
    for entry in coordinator.fleet:
        if isinstance(entry, type):
            spec = spec_of(entry)
            if spec.kind is EndpointKind.AI_ENDPOINT:
                raise ValueError(
                    f"coordinator '{coordinator.name}': {entry.__name__} is an ai_endpoint "
                    f"({spec.path}); a fleet member must be an @agent or a @coordinator"
                )
        elif isinstance(entry, str) and entry.strip() in host.agents:
            spec = host.agents[entry.strip()]
        else:
            declared = ", ".join(sorted(host.agents)) or "none"
            raise ValueError(
                f"coordinator '{coordinator.name}': fleet entry {entry!r} is not a declared "
                f"agent (declared: {declared})"
            )
        if spec.name in seen:
            raise ValueError(
                f"coordinator '{coordinator.name}': fleet lists '{spec.name}' more than once"
            )
        seen.add(spec.name)
        members.append(spec)
    return members


def _check_cycles(graph: Mapping[str, list[AgentSpec]]) -> None:
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            raise ValueError("fleet cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for member in graph.get(name, []):
            if member.kind is EndpointKind.COORDINATOR:
                visit(member.name, [*path, name])
        done.add(name)

    for name in graph:
        visit(name, [])


def _member(spec: AgentSpec, instances: dict[type, object]) -> FleetMember:
    if not spec.headless:
        return FleetMember(spec, PROMPT_SKILL)
    if DEFAULT_SKILL in spec.skills:
        skill = DEFAULT_SKILL
    elif len(spec.skills) == 1:
        skill = next(iter(spec.skills))
    elif not spec.skills:
        raise ValueError(
            f"fleet member '{spec.name}' has neither a @prompt method nor a @skill handler"
        )
    else:
        raise ValueError(
            f"fleet member '{spec.name}' is headless with skills {', '.join(sorted(spec.skills))}"
            f": name one @skill('{DEFAULT_SKILL}') so delegate_task knows which to call"
        )
    if spec.cls not in instances:
        instances[spec.cls] = spec.cls()
    method = getattr(instances[spec.cls], spec.skills[skill])
    return FleetMember(spec, skill, _skill_caller(spec, method))


def _skill_caller(spec: AgentSpec, method: Callable[..., Any]) -> SkillCall:
    """Call a skill handler with the message (a `str` parameter or one named `message`) and,
    when it asks for one, the delegating call's `ToolContext`."""
    hints = resolved_hints(method)
    message_names: list[str] = []
    context_names: list[str] = []
    for name, parameter in inspect.signature(method).parameters.items():
        annotation = hints.get(name)
        if annotation is ToolContext:
            context_names.append(name)
        elif annotation is str or name == "message":
            message_names.append(name)
        elif parameter.default is inspect.Parameter.empty and parameter.kind not in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
        ):
            raise TypeError(
                f"{spec.cls.__name__}.{method.__name__}: skill parameter {name!r} cannot be "
                "filled; a skill takes the message (str) and optionally a ToolContext"
            )
    is_async = inspect.iscoroutinefunction(method)

    async def call(message: str, context: ToolContext) -> Any:
        kwargs: dict[str, Any] = dict.fromkeys(message_names, message)
        kwargs.update(dict.fromkeys(context_names, context))
        if is_async:
            return await method(**kwargs)
        # A plain `def` skill may block (I/O, CPU): keep it off the event loop.
        result = await asyncio.to_thread(method, **kwargs)
        return await result if inspect.isawaitable(result) else result

    return call
