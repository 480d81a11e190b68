"""`HostedEndpoint`: one agent (or sub-agent) as the loop runs it.

An endpoint is what the attach engines complete: they add built-in tools, injectable providers,
request interceptors and tool hooks to it, and report what they attached. The web layer only
routes requests to it. A sub-agent is a `HostedEndpoint` built directly, with no class behind it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .._cache import PromptCache
from .._contracts import (
    AdmissionHook,
    ApprovalHook,
    CloseHook,
    ForgetHook,
    HistoryMark,
    HistoryStore,
    LockedReader,
    Provider,
    ResultHook,
    RunHooks,
    RunInterceptor,
    TypedMap,
)
from .._harness import Harness
from .._injection import injectable_type, resolved_hints
from .._log import get_logger
from .._registry import AgentSpec, EndpointKind, sanitize
from .._runtimes.base import AgentRuntime, ToolSpec
from .._tools.base import Tool, as_tool
from .._tools.bounds import DEFAULT_MAX_ARGUMENT_CHARS, DEFAULT_MAX_TOOL_CALLS

if TYPE_CHECKING:
    from .._preset import RuntimeTruth

log = get_logger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are {name}, a capable assistant. Work through the user's request step by step, "
    "use your tools when they help, and finish with a clear answer."
)


class HostedEndpoint:
    """One prompt loop: its runtime, system prompt, tools and the hooks primitives attached."""

    def __init__(
        self,
        *,
        path: str,
        kind: EndpointKind,
        owner: str,
        features: frozenset[Harness],
        runtime: AgentRuntime,
        system_prompt: str,
        root: Path,
        tool_timeout: float,
        max_rounds: int,
        spec: AgentSpec | None = None,
        instance: object | None = None,
        tools: Sequence[Tool] = (),
        cache_policy: PromptCache = PromptCache.NONE,
        truth: RuntimeTruth | None = None,
        max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
        max_tool_argument_chars: int = DEFAULT_MAX_ARGUMENT_CHARS,
        hooks: Sequence[RunHooks] = (),
    ) -> None:
        self.path = path
        self.kind = kind
        self.owner = owner
        self.features = features
        self.runtime = runtime
        self.system_prompt = system_prompt
        self.root = root
        self.tool_timeout = tool_timeout
        self.max_rounds = max_rounds
        self.max_tool_calls = max_tool_calls
        """Tool calls one model message may ask for (see `tools.bounds`)."""
        self.max_tool_argument_chars = max_tool_argument_chars
        """Characters one tool call's arguments may hold (see `tools.bounds`)."""
        self.spec = spec
        self.instance = instance
        self.cache_policy = cache_policy
        self._truth = truth
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"{path}: two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.providers: dict[type, Provider] = {}
        self.interceptors: list[RunInterceptor] = []
        self.history: HistoryStore | None = None
        self.history_mark: HistoryMark | None = None
        self.locked_reader: LockedReader | None = None
        self.hooks: list[RunHooks] = list(hooks)
        """Around every model and tool call (`contracts.RunHooks`), outermost first."""
        self.close_hooks: list[CloseHook] = []
        self.forget_hooks: list[ForgetHook] = []
        """Each primitive's deletion of a conversation of this endpoint (`kernel.forget`)."""
        self.expire_hooks: list[ForgetHook] = []
        """What runs before retention deletes a conversation (fact extraction)."""
        self.admission_hooks: list[AdmissionHook] = []
        self.approval_hook: ApprovalHook | None = None
        self.result_hooks: list[ResultHook] = []
        self.services = TypedMap()
        """Per-endpoint objects primitives share (e.g. the plan store), by typed key."""
        self.prompt_parameters: list[tuple[str, type | None]] = []
        self._specs_of: tuple[Tool, ...] | None = None
        self._specs: tuple[ToolSpec, ...] = ()

    # --- what attach engines call ------------------------------------------------------------

    def has(self, feature: Harness) -> bool:
        return feature in self.features

    def add_builtin_tool(self, tool: Tool) -> bool:
        """Register a built-in tool unless a user tool already claims the name (the user wins)."""
        existing = self.tools.get(tool.name)
        if existing is not None:
            log.warning("a user tool shadows the built-in tool", tool=tool.name, endpoint=self.path)
            return False
        self.tools[tool.name] = tool
        return True

    def user_tool_names(self) -> set[str]:
        return {name for name, tool in self.tools.items() if tool.origin == "user"}

    def provide(self, kind: type, provider: Provider) -> None:
        """Make `kind` injectable into this endpoint's `@prompt` method and tools."""
        self.providers[kind] = provider

    def report(self, key: str, state: str) -> None:
        """Record what really attached (runtime truth, per endpoint and app-wide)."""
        if self._truth is not None:
            self._truth.report(self.path, key, state)

    def report_detail(self, key: str, states: Mapping[str, str]) -> None:
        """Record a map of states under `key` (e.g. `mcp`: one per server), per endpoint only."""
        if self._truth is not None:
            self._truth.report_detail(self.path, key, states)

    @property
    def hosted(self) -> bool:
        """True for endpoints served over HTTP (sub-agents are not)."""
        return self.spec is not None

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The tools as the runtime is told about them: one tuple, shared by every request
        while the tools stay the same objects (a run in flight keeps its request, so a tuple
        and a `ToolSpec` a tool each per run otherwise)."""
        tools = tuple(self.tools.values())
        if tools != self._specs_of:
            self._specs = tuple(tool.spec() for tool in tools)
            self._specs_of = tools
        return self._specs

    def derive(
        self,
        *,
        agent_id: str,
        system_prompt: str,
        root: Path,
        features: frozenset[Harness],
        tools: Sequence[Tool],
    ) -> HostedEndpoint:
        """A sub-agent's endpoint: this one's runtime and bounds, its own tools and root.

        It is not hosted (no routes, no runtime truth); the caller attaches what it needs.
        """
        return HostedEndpoint(
            path=f"{self.path}#{agent_id}",
            kind=self.kind,
            owner=agent_id,
            features=features,
            runtime=self.runtime,
            system_prompt=system_prompt,
            root=root,
            tool_timeout=self.tool_timeout,
            max_rounds=self.max_rounds,
            tools=tools,
            max_tool_calls=self.max_tool_calls,
            max_tool_argument_chars=self.max_tool_argument_chars,
            hooks=self.hooks,
        )

    # --- construction from a declared class --------------------------------------------------

    @classmethod
    def from_spec(
        cls,
        spec: AgentSpec,
        *,
        features: frozenset[Harness],
        runtime: AgentRuntime,
        workspace_root: Path,
        tool_timeout: float,
        max_rounds: int,
        cache_policy: PromptCache,
        truth: RuntimeTruth,
        max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
        max_tool_argument_chars: int = DEFAULT_MAX_ARGUMENT_CHARS,
    ) -> HostedEndpoint:
        instance = spec.cls()
        tools = [as_tool(entry) for entry in getattr(spec.cls, "tools", None) or ()]
        tools += [as_tool(getattr(spec.cls, name), bind=instance) for name in spec.tool_methods]
        endpoint = cls(
            path=spec.path,
            kind=spec.kind,
            owner=spec.owner,
            features=features,
            runtime=runtime,
            system_prompt=_system_prompt(spec),
            root=workspace_root / spec.kind.category / sanitize(spec.owner),
            tool_timeout=tool_timeout,
            max_rounds=max_rounds,
            spec=spec,
            instance=instance,
            tools=tools,
            cache_policy=cache_policy,
            truth=truth,
            max_tool_calls=max_tool_calls,
            max_tool_argument_chars=max_tool_argument_chars,
        )
        endpoint.prompt_parameters = _prompt_parameters(spec)
        # Interceptors the class declares run before the ones primitives append.
        endpoint.interceptors.extend(getattr(spec.cls, "interceptors", None) or ())
        return endpoint


def _system_prompt(spec: AgentSpec) -> str:
    if spec.system_prompt:
        return spec.system_prompt
    if spec.skill_file:
        return _read_skill_file(spec)
    return DEFAULT_SYSTEM_PROMPT.format(name=spec.name)


def _read_skill_file(spec: AgentSpec) -> str:
    """A skill file path is relative to the agent's module, then to the working directory."""
    assert spec.skill_file is not None
    candidates = []
    module_file = inspect.getsourcefile(spec.cls)
    if module_file:
        candidates.append(Path(module_file).parent / spec.skill_file)
    candidates.append(Path(spec.skill_file))
    for candidate in candidates:
        if candidate.is_file():
            text = candidate.read_text(encoding="utf-8").strip()
            if text:
                return text
    tried = ", ".join(str(candidate) for candidate in candidates)
    raise FileNotFoundError(
        f"{spec.cls.__name__}: skill_file {spec.skill_file!r} not found ({tried})"
    )


def _prompt_parameters(spec: AgentSpec) -> list[tuple[str, type | None]]:
    """How to fill each `@prompt` parameter: `None` means the message text."""
    assert spec.prompt_method is not None
    method = getattr(spec.cls, spec.prompt_method)
    hints = resolved_hints(method)
    plan: list[tuple[str, type | None]] = []
    for name, parameter in list(inspect.signature(method).parameters.items())[1:]:
        annotation = hints.get(name, inspect.Parameter.empty)
        kind = injectable_type(annotation)
        if kind is not None:
            plan.append((name, kind))
        elif annotation is str or name == "message":
            plan.append((name, None))
        elif parameter.default is not inspect.Parameter.empty:
            continue
        else:
            raise TypeError(
                f"{spec.cls.__name__}.{spec.prompt_method}: cannot inject parameter {name!r} "
                f"({annotation!r}); use str for the message, StreamingSession, or a harness type"
            )
    return plan
