"""The decorators users write (`agent`, `coordinator`, `ai_endpoint`, `prompt`, `skill`) and the
registry of the classes they declare.

Decorating a class records an `AgentSpec` on it and in a registry (`AgentRegistry`): the default
one for the package's decorators, or one of your own through its methods. Nothing is hosted until
a harness router's lifespan runs. `create_harness_router(agents=[...])` hosts an explicit list and
reads no registry.
"""

from __future__ import annotations

import enum
import inspect
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from os import PathLike, fspath
from typing import Any, TypeVar

from ._cache import PromptCache
from ._harness import Harness
from ._limits import UsageLimits
from ._runtimes.base import AgentRuntime
from ._runtimes.refs import check_model_ref

ModelRef = AgentRuntime | str
"""A per-agent model: a runtime, or `"openai:<model>"`, `"anthropic:<model>"`, `"scripted:demo"`."""

C = TypeVar("C", bound=type)
F = TypeVar("F", bound=Callable[..., Any])

SPEC_ATTRIBUTE = "__atmosphere_agent__"
PROMPT_MARKER = "__atmosphere_prompt__"
SKILL_MARKER = "__atmosphere_skill__"
TOOL_MARKER = "__atmosphere_tool__"
"""Set on a function by `@tool` (its `tools.base.ToolOptions`)."""
AGENT_PATH_PREFIX = "/atmosphere/agent/"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_PATH = re.compile(r"^(/[A-Za-z0-9._~-]+)+$")


class EndpointKind(enum.Enum):
    AGENT = "agent"
    COORDINATOR = "coordinator"
    AI_ENDPOINT = "ai-endpoint"

    @property
    def category(self) -> str:
        """The workspace directory this kind's owners live under."""
        return {"agent": "agents", "coordinator": "coordinators", "ai-endpoint": "endpoints"}[
            self.value
        ]


@dataclass(frozen=True)
class AgentSpec:
    """Everything a decorator declared about one class."""

    cls: type
    kind: EndpointKind
    name: str
    path: str
    harness: tuple[Harness, ...]
    is_agent_default: bool
    headless: bool
    prompt_method: str | None
    skills: dict[str, str] = field(default_factory=dict)
    tool_methods: tuple[str, ...] = ()
    skill_file: str | None = None
    system_prompt: str | None = None
    description: str | None = None
    conversation_memory: bool = False
    max_history_messages: int = 20
    prompt_cache: PromptCache | None = None
    fleet: tuple[type | str, ...] = ()
    skill_sources: tuple[str, ...] = ()
    """The decorator's `skills=` folders (each a folder of skill folders), weakest first."""
    mcp_servers: tuple[Any, ...] = ()
    """The decorator's `mcp_servers=` (`MCPServerStdio` / `MCPServerHTTP`)."""
    model: ModelRef | None = None
    """The decorator's `model=`; `None`: the app's runtime."""
    fallback_models: tuple[ModelRef, ...] = ()
    """The decorator's `fallback_models=`: tried in order on a transient failure."""
    usage_limits: UsageLimits | None = None
    """The decorator's `usage_limits=`; `None`: the app-wide ones (`ATMOSPHERE_AI_USAGE_LIMITS`)."""

    @property
    def owner(self) -> str:
        """Owner name: the agent name, or the sanitized path of an `ai_endpoint`."""
        if self.kind is EndpointKind.AI_ENDPOINT:
            return sanitize(self.path)
        return self.name


def spec_of(cls: object) -> AgentSpec:
    found = getattr(cls, SPEC_ATTRIBUTE, None)
    if not isinstance(found, AgentSpec) or found.cls is not cls:
        raise TypeError(f"{cls!r} is not decorated with @agent, @coordinator or @ai_endpoint")
    return found


def sanitize(value: str | None) -> str:
    """A path or name as one safe directory name (`/atmosphere/ai-chat` -> `atmosphere-ai-chat`)."""
    text = (value or "").strip().lstrip("/\\")
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", text)
    if not cleaned or set(cleaned) <= {".", "-"}:
        return "default"
    return cleaned


def prompt(fn: F) -> F:
    """Mark the method that handles a prompt. It must be `async def`.

    Its parameters are injected by annotation: `str` (the message), `StreamingSession`, and the
    primitives' types (`PlanStore`, `AgentFileSystem`, `LongTermMemory`, `ConversationMemory`).
    """
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"@prompt method {fn.__qualname__} must be declared with 'async def'")
    setattr(fn, PROMPT_MARKER, True)
    return fn


def skill(name: str) -> Callable[[F], F]:
    """Mark a method of a headless agent as the handler of skill `name` (used by delegation)."""
    if not name or not _NAME.match(name):
        raise ValueError(f"invalid skill name {name!r}")

    def mark(fn: F) -> F:
        setattr(fn, SKILL_MARKER, name)
        return fn

    return mark


def _scan(cls: type) -> tuple[str | None, dict[str, str], tuple[str, ...]]:
    prompts: list[str] = []
    skills: dict[str, str] = {}
    tools: list[str] = []
    for attribute, value in inspect.getmembers(cls):
        target = value
        if isinstance(value, staticmethod | classmethod):
            target = value.__func__
        if getattr(target, PROMPT_MARKER, False):
            prompts.append(attribute)
        skill_name = getattr(target, SKILL_MARKER, None)
        if isinstance(skill_name, str):
            if skill_name in skills:
                raise TypeError(f"{cls.__name__} declares skill {skill_name!r} twice")
            skills[skill_name] = attribute
        if getattr(target, TOOL_MARKER, None) is not None and inspect.isfunction(target):
            tools.append(attribute)
    if len(prompts) > 1:
        raise TypeError(f"{cls.__name__} declares several @prompt methods: {sorted(prompts)}")
    return (prompts[0] if prompts else None), skills, tuple(tools)


def _harness_tuple(harness: Iterable[Harness]) -> tuple[Harness, ...]:
    values = tuple(harness)
    for value in values:
        if not isinstance(value, Harness):
            raise TypeError(f"harness entries must be Harness members, got {value!r}")
    return values


_Models = tuple[ModelRef | None, tuple[ModelRef, ...], UsageLimits | None]


def _models(
    model: ModelRef | None, fallbacks: Sequence[ModelRef], limits: UsageLimits | None
) -> _Models:
    """The decorator's model arguments, checked now so a typo fails at import, not at start."""
    if isinstance(fallbacks, str | AgentRuntime):
        fallbacks = (fallbacks,)
    chain = tuple(fallbacks)
    for ref in (model, *chain) if model is not None else chain:
        check_model_ref(ref)
    if limits is not None and not isinstance(limits, UsageLimits):
        raise TypeError(f"usage_limits must be a UsageLimits, got {limits!r}")
    return model, chain, limits


def _skill_sources(skills: Sequence[str | PathLike[str]]) -> tuple[str, ...]:
    if isinstance(skills, str | PathLike):
        skills = (skills,)
    return tuple(fspath(entry) for entry in skills)


class AgentRegistry:
    """The classes declared with `agent`, `coordinator` and `ai_endpoint`, in declaration order.

    The package's decorators write to one default registry, which `harness_router` (and
    `create_harness_router()` without `agents=`) reads when the app includes it. A registry of
    your own keeps its classes apart: decorate with its methods (`@registry.agent(name=...)`)
    and host them with `create_harness_router(agents=registry)`. A decorated class is also
    hostable by itself, whichever registry saw it: `create_harness_router(agents=[Cls])`.
    """

    def __init__(self) -> None:
        self._specs: dict[type, AgentSpec] = {}

    def specs(self) -> list[AgentSpec]:
        """Every class decorated through this registry, in declaration order."""
        return list(self._specs.values())

    def _register(self, spec: AgentSpec) -> None:
        setattr(spec.cls, SPEC_ATTRIBUTE, spec)
        self._specs[spec.cls] = spec

    def agent(
        self,
        name: str,
        *,
        harness: Iterable[Harness] = (Harness.ALL,),
        skill_file: str | None = None,
        headless: bool = False,
        system_prompt: str | None = None,
        description: str | None = None,
        skills: Sequence[str | PathLike[str]] = (),
        mcp_servers: Sequence[Any] = (),
        model: ModelRef | None = None,
        fallback_models: Sequence[ModelRef] = (),
        usage_limits: UsageLimits | None = None,
    ) -> Callable[[C], C]:
        """Declare an agent hosted at `/atmosphere/agent/{name}` with the full harness by default.

        `harness=()` is a deliberate opt-down to a bare loop; an agent without a `@prompt` method
        (or with `headless=True`) is never harnessed and only serves its `@skill` handlers.
        `skills=` names folders of `SKILL.md` skills (see `docs/skills.md`); `mcp_servers=`
        lists MCP tool servers whose tools the agent is offered (see `docs/mcp.md`).
        `model=` (a runtime, or `"openai:<model>"`, `"anthropic:<model>"`, `"scripted:demo"`)
        replaces the app's runtime for this agent, `fallback_models=` are tried in order when
        it fails with a transient error, and `usage_limits=` caps what one of its runs may
        spend (see `docs/runtimes.md`).
        """
        return self._decorator(
            EndpointKind.AGENT,
            name,
            harness=harness,
            skill_file=skill_file,
            headless=headless,
            system_prompt=system_prompt,
            description=description,
            skill_sources=_skill_sources(skills),
            mcp_servers=tuple(mcp_servers),
            models=_models(model, fallback_models, usage_limits),
        )

    def coordinator(
        self,
        name: str,
        *,
        fleet: Sequence[type | str] = (),
        harness: Iterable[Harness] = (Harness.ALL,),
        skill_file: str | None = None,
        system_prompt: str | None = None,
        description: str | None = None,
        skills: Sequence[str | PathLike[str]] = (),
        mcp_servers: Sequence[Any] = (),
        model: ModelRef | None = None,
        fallback_models: Sequence[ModelRef] = (),
        usage_limits: UsageLimits | None = None,
    ) -> Callable[[C], C]:
        """Declare a coordinator: an agent with a fleet to delegate to (`delegate_task`, `task`).

        `skills=`, `mcp_servers=`, `model=`, `fallback_models=` and `usage_limits=` as on
        `agent`; `task` sub-agents see the coordinator's skills and run on its model, and its
        usage limits count what its sub-agents and fleet members spend.
        """
        return self._decorator(
            EndpointKind.COORDINATOR,
            name,
            harness=harness,
            skill_file=skill_file,
            headless=False,
            system_prompt=system_prompt,
            description=description,
            fleet=tuple(fleet),
            skill_sources=_skill_sources(skills),
            mcp_servers=tuple(mcp_servers),
            models=_models(model, fallback_models, usage_limits),
        )

    def _decorator(
        self,
        kind: EndpointKind,
        name: str,
        *,
        harness: Iterable[Harness],
        skill_file: str | None,
        headless: bool,
        system_prompt: str | None,
        description: str | None,
        fleet: tuple[type | str, ...] = (),
        skill_sources: tuple[str, ...] = (),
        mcp_servers: tuple[Any, ...] = (),
        models: _Models = (None, (), None),
    ) -> Callable[[C], C]:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"invalid agent name {name!r}: 1-64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        declared = _harness_tuple(harness)

        def decorate(cls: C) -> C:
            prompt_method, skills, tool_methods = _scan(cls)
            self._register(
                AgentSpec(
                    cls=cls,
                    kind=kind,
                    name=name,
                    path=AGENT_PATH_PREFIX + name,
                    harness=declared,
                    is_agent_default=True,
                    headless=headless or prompt_method is None,
                    prompt_method=None if headless else prompt_method,
                    skills=skills,
                    tool_methods=tool_methods,
                    skill_file=skill_file,
                    system_prompt=system_prompt,
                    description=description or inspect.getdoc(cls),
                    fleet=fleet,
                    skill_sources=skill_sources,
                    mcp_servers=mcp_servers,
                    model=models[0],
                    fallback_models=models[1],
                    usage_limits=models[2],
                )
            )
            return cls

        return decorate

    def ai_endpoint(
        self,
        path: str,
        *,
        harness: Iterable[Harness] = (),
        conversation_memory: bool = False,
        max_history_messages: int = 20,
        prompt_cache: PromptCache = PromptCache.NONE,
        skill_file: str | None = None,
        system_prompt: str | None = None,
        skills: Sequence[str | PathLike[str]] = (),
        mcp_servers: Sequence[Any] = (),
        model: ModelRef | None = None,
        fallback_models: Sequence[ModelRef] = (),
        usage_limits: UsageLimits | None = None,
    ) -> Callable[[C], C]:
        """Declare a plain AI endpoint at `path`. Bare by default: opt in with `harness=(...)`.

        `skills=`, `mcp_servers=`, `model=`, `fallback_models=` and `usage_limits=` as on
        `agent` (skills need the FILESYSTEM feature).
        """
        if not isinstance(path, str) or not _PATH.match(path) or ".." in path.split("/"):
            raise ValueError(f"invalid ai_endpoint path {path!r}: expected e.g. '/atmosphere/chat'")
        if max_history_messages < 2:
            raise ValueError(f"max_history_messages must be >= 2, got {max_history_messages}")
        declared = _harness_tuple(harness)
        sources = _skill_sources(skills)
        servers = tuple(mcp_servers)
        models = _models(model, fallback_models, usage_limits)

        def decorate(cls: C) -> C:
            prompt_method, skills, tool_methods = _scan(cls)
            if prompt_method is None:
                raise TypeError(f"@ai_endpoint class {cls.__name__} needs a @prompt method")
            self._register(
                AgentSpec(
                    cls=cls,
                    kind=EndpointKind.AI_ENDPOINT,
                    name=path,
                    path=path,
                    harness=declared,
                    is_agent_default=False,
                    headless=False,
                    prompt_method=prompt_method,
                    skills=skills,
                    tool_methods=tool_methods,
                    skill_file=skill_file,
                    system_prompt=system_prompt,
                    description=inspect.getdoc(cls),
                    conversation_memory=conversation_memory,
                    max_history_messages=max_history_messages,
                    prompt_cache=prompt_cache,
                    skill_sources=sources,
                    mcp_servers=servers,
                    model=models[0],
                    fallback_models=models[1],
                    usage_limits=models[2],
                )
            )
            return cls

        return decorate


DEFAULT_REGISTRY = AgentRegistry()
"""The registry the package's decorators write to and `harness_router` reads."""

agent = DEFAULT_REGISTRY.agent
coordinator = DEFAULT_REGISTRY.coordinator
ai_endpoint = DEFAULT_REGISTRY.ai_endpoint
