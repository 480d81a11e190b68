"""Tools: the `Tool` record, `ToolKind`, the `tool` decorator and the per-call `ToolContext`."""

from __future__ import annotations

import enum
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar, overload

import pydantic
from pydantic_core import to_jsonable_python

from .._errors import ToolArgumentError
from .._injection import injectable_type, resolved_hints
from .._runtimes.base import ToolCall, ToolSpec

if TYPE_CHECKING:
    from .._contracts import Run

T = TypeVar("T")


class ToolKind(enum.Enum):
    """What a tool does to the world; approval policies key on it (e.g. gate every DELETE)."""

    READ = "read"
    EDIT = "edit"
    EXECUTE = "execute"
    NETWORK = "network"
    DELETE = "delete"
    OTHER = "other"


@dataclass(slots=True)
class ToolContext:
    """What a running tool may know about its call: the call, the run, and injectables."""

    call: ToolCall
    run: Run

    @property
    def conversation_id(self) -> str:
        return self.run.conversation_id

    @property
    def user_id(self) -> str | None:
        return self.run.user_id

    def get(self, kind: type[T]) -> T | None:
        """The run's injectable of type `kind` (e.g. `PlanStore`), or `None` if not attached."""
        return self.run.resolve(kind)


Handler = Callable[[Mapping[str, Any], ToolContext], Awaitable[Any]]
HistoryArguments = Callable[[Mapping[str, Any], str], Mapping[str, Any]]
Prefetch = Callable[[Sequence[Any], "Run"], Awaitable[Callable[[], None]]]
Batch = Callable[[Sequence[Mapping[str, Any]], "Run"], Awaitable[Sequence[Any]]]


@dataclass(slots=True)
class Tool:
    """A tool the model can call.

    `handler(arguments, context)` returns the model-facing result (a `str`, or anything JSON
    serializable). `concurrent` tools requested in the same model message run concurrently with
    each other; all others run one after another in the order the model gave.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    handler: Handler
    kind: ToolKind = ToolKind.OTHER
    requires_approval: bool = False
    concurrent: bool = False
    timeout: float | None = None
    origin: str = "user"
    """`user` for host tools, otherwise the primitive that registered it (e.g. `planning`)."""
    idempotent: bool = False
    """Durable runs: a call a restart cut off runs again (`True`) instead of being answered
    `interrupted` (user tools run at most once unless they say so; built-ins always re-run)."""
    native: Mapping[str, Any] | None = None
    """A provider-native declaration, see `ToolSpec.native`."""
    history_arguments: HistoryArguments | None = None
    """What conversation history keeps of a finished call's arguments, given them and the
    call's result; `None` keeps them as the model sent them. `write_file` uses it so a large
    content, which the workspace already holds, is not stored a second time."""
    prefetch: Prefetch | None = None
    """For a run of two or more consecutive calls to this tool in one model message: called
    once, with the calls' arguments as the model sent them (unvalidated), before the first of
    them runs; it may load in one go what those calls will need (`read_file` reads all their
    files in one worker-thread hop). It returns a callable the executor calls after the run to
    free what was loaded. The calls still go one by one through every gate and their handlers;
    a prefetch must change nothing the model or a client can see, and its failure is ignored."""
    batch: Batch | None = None
    """For a run of two or more consecutive calls to this tool in one model message: runs the
    handlers of the calls that passed their gates (each call still goes through every gate, in
    order, and gets its `tool-start` frame first) together, given their validated arguments in
    the model's order, and returns one value per call, in that order: what the handler would
    have returned, or the exception it would have raised. It must give exactly what running the
    handlers one by one would (each call sees the effects of the ones before it): `write_file`
    writes all their files in one worker-thread hop. Its deadline is the tool's timeout once per
    call."""

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters, self.native)

    def with_name(self, name: str) -> Tool:
        return replace(self, name=name)


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
TOOL_MARKER = "__atmosphere_tool__"


@dataclass(frozen=True, slots=True)
class ToolOptions:
    name: str | None = None
    kind: ToolKind = ToolKind.OTHER
    requires_approval: bool = False
    concurrent: bool = False
    description: str | None = None
    timeout: float | None = None
    idempotent: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


F = TypeVar("F", bound=Callable[..., Any])


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(
    name: str | None = None,
    *,
    kind: ToolKind = ToolKind.OTHER,
    requires_approval: bool = False,
    concurrent: bool = False,
    description: str | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
) -> Callable[[F], F]: ...


def tool(
    name: Any = None,
    *,
    kind: ToolKind = ToolKind.OTHER,
    requires_approval: bool = False,
    concurrent: bool = False,
    description: str | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
) -> Any:
    """Mark a function (or an agent method) as a tool.

    The JSON schema comes from the signature; the description and the per-parameter
    descriptions come from the docstring (Google style `Args:`). Parameters annotated with an
    injectable type (`ToolContext`, `PlanStore`, `AgentFileSystem`, ...) are filled by the harness
    and never shown to the model. The function is returned unchanged, so it stays callable.

    `idempotent=True` says running a call twice does no harm: with durable runs, a call a
    restart cut off then runs again, instead of being answered `interrupted`.

    Example:
        ```python
        @tool(kind=ToolKind.READ)
        async def weather(city: str) -> str:
            \"\"\"Current weather for a city.

            Args:
                city: City name, e.g. "Montreal".
            \"\"\"
            return f"Sunny in {city}"
        ```
    """

    options = ToolOptions(
        name=name if isinstance(name, str) else None,
        kind=kind,
        requires_approval=requires_approval,
        concurrent=concurrent,
        description=description,
        timeout=timeout,
        idempotent=idempotent,
    )
    if options.name is not None and not _NAME.match(options.name):
        raise ValueError(f"invalid tool name {options.name!r}: use letters, digits, _ or -")

    def mark(fn: F) -> F:
        setattr(fn, TOOL_MARKER, options)
        return fn

    if callable(name) and not isinstance(name, str):
        fn, name = name, None
        return mark(fn)
    return mark


def build_tool(fn: Callable[..., Any], *, bind: object | None = None) -> Tool:
    """Turn a function (marked with `@tool` or plain) into a `Tool`; `bind` is the instance."""
    options: ToolOptions = getattr(fn, TOOL_MARKER, None) or ToolOptions()
    tool_name = options.name or fn.__name__
    if not _NAME.match(tool_name):
        raise ValueError(f"invalid tool name {tool_name!r}: use letters, digits, _ or -")
    summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    signature = inspect.signature(fn)
    hints = resolved_hints(fn)
    fields: dict[str, Any] = {}
    injected: dict[str, type] = {}
    parameters = list(signature.parameters.values())
    if bind is not None and parameters:
        parameters = parameters[1:]
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        annotation = hints.get(parameter.name, Any)
        kind = injectable_type(annotation)
        if kind is not None:
            injected[parameter.name] = kind
            continue
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[parameter.name] = (
            annotation,
            pydantic.Field(default, description=arg_docs.get(parameter.name)),
        )
    model = pydantic.create_model(
        f"{tool_name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )
    schema = _clean_schema(model.model_json_schema())
    target = fn.__get__(bind) if bind is not None else fn

    async def handler(arguments: Mapping[str, Any], context: ToolContext) -> Any:
        try:
            parsed = model.model_validate(dict(arguments))
        except pydantic.ValidationError as exc:
            raise ToolArgumentError(_pydantic_details(exc)) from None
        kwargs = {key: getattr(parsed, key) for key in fields}
        for key, kind in injected.items():
            kwargs[key] = context if kind is ToolContext else context.get(kind)
        result = target(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    return Tool(
        name=tool_name,
        description=options.description or summary or tool_name,
        parameters=schema,
        handler=handler,
        kind=options.kind,
        requires_approval=options.requires_approval,
        concurrent=options.concurrent,
        timeout=options.timeout,
        idempotent=options.idempotent,
    )


def as_tool(entry: object, *, bind: object | None = None) -> Tool:
    """Accept a `Tool`, or a function (marked or not), from an agent's `tools = [...]`."""
    if isinstance(entry, Tool):
        return entry
    if callable(entry):
        return build_tool(entry, bind=bind)
    raise TypeError(f"tools entries must be functions or Tool objects, got {entry!r}")


def render_result(value: Any) -> str:
    """The model-facing text of a tool's return value."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(to_jsonable_python(value), ensure_ascii=False)


def _pydantic_details(exc: pydantic.ValidationError) -> list[str]:
    details = []
    for error in exc.errors():
        location = ".".join(str(part) for part in error["loc"]) or "arguments"
        if error["type"] == "missing":
            details.append(f"missing required parameter '{location}'")
        elif error["type"] == "extra_forbidden":
            details.append(f"unexpected parameter '{location}'")
        else:
            details.append(f"parameter '{location}': {error['msg']}")
    return details


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's auto titles, which only add tokens to every request."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                key: strip(value)
                for key, value in node.items()
                if not (key == "title" and isinstance(value, str))
            }
        if isinstance(node, list):
            return [strip(item) for item in node]
        return node

    cleaned: dict[str, Any] = strip(schema)
    cleaned.setdefault("properties", {})
    cleaned["type"] = "object"
    cleaned["additionalProperties"] = False
    return cleaned


_ARGS_HEADER = re.compile(r"^(Args|Arguments|Parameters):\s*$")
_ARG_LINE = re.compile(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """First paragraph, plus `name: description` entries of a Google-style `Args:` section."""
    lines = doc.splitlines()
    summary: list[str] = []
    index = 0
    while index < len(lines) and lines[index].strip() and not _ARGS_HEADER.match(lines[index]):
        summary.append(lines[index].strip())
        index += 1
    args: dict[str, str] = {}
    current: str | None = None
    in_args = False
    for line in lines[index:]:
        if _ARGS_HEADER.match(line.strip()):
            in_args = True
            continue
        if not in_args:
            continue
        if line.strip() and not line.startswith((" ", "\t")):
            in_args = False
            continue
        match = _ARG_LINE.match(line)
        if match and (line.startswith("    ") and not line.startswith("        ")):
            current = match.group(1)
            args[current] = match.group(2).strip()
        elif current and line.strip():
            args[current] = (args[current] + " " + line.strip()).strip()
    return " ".join(summary), args
