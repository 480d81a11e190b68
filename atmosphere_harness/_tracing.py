"""Tracing and metrics with OpenTelemetry, in the GenAI semantic conventions.

`Tracing` is the `contracts.RunHooks` the assembly installs first (outermost: its spans see
retries, fallbacks and replays) when `opentelemetry-api` is installed (extra `[otel]`) and
`ATMOSPHERE_AI_TRACING` is not `false`. It uses the tracer and meter providers the application
configures (the global ones unless given), as an instrumentation library does: without a
configured provider every span and instrument is OpenTelemetry's no-op.

- `invoke_agent {agent}`: one span per run (`around_run`): a prompt, a fleet member's answer, a
  `task` sub-agent. A prompt's parent is the incoming W3C `traceparent` (`incoming`, which the
  HTTP routes use) or the application's current span; a run inside a tool call (a sub-agent,
  a fleet member) nests under that call's span through the context. A resumed durable run
  links to its first life's span (kept in the run's journal, `contracts.RUN_CHECKPOINTS`).
- `chat {model}`: one span per model call (`around_model`), with the tokens it used: the chat
  spans of a run add up to its `complete` frame's `usage`.
- `execute_tool {tool}`: one span per tool call (`around_tool`); a call that did not end `ok`
  (or `replayed`) sets the span's error status.
- Metrics: `gen_ai.client.token.usage` and `gen_ai.client.operation.duration` (histograms), and
  `atmosphere.runs` (by status), `atmosphere.tool.calls` (by outcome), `atmosphere.approvals.
  waiting` (approvals this process's runs wait on).

Nothing here imports OpenTelemetry until a `Tracing` is built, so `import atmosphere_harness`
never does. Message and tool contents are recorded only with
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import time
import weakref
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._contracts import (
    RUN_CHECKPOINTS,
    ModelStep,
    ProceedModel,
    ProceedRun,
    ProceedTool,
    Run,
    RunHooks,
    ToolOutcome,
    ToolStep,
)
from ._log import get_logger
from ._version import __version__

if TYPE_CHECKING:
    from ._runtimes.base import Message, ModelResponse
    from ._settings import HarnessSettings

log = get_logger(__name__)

ACTIVE = "ACTIVE(otel)"
NOT_INSTALLED = "INACTIVE(no-opentelemetry)"
DISABLED = "INACTIVE(disabled)"

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
TOKEN_TYPE = "gen_ai.token.type"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
ERROR_TYPE = "error.type"
RUN_STATUS = "atmosphere.run.status"
TOOL_OUTCOME = "atmosphere.tool.outcome"

TRACEPARENT = "traceparent"
SPAN_NOTE = "trace.span"
"""The run's journal note holding its span (`[trace_id, span_id, flags]`, hex)."""
CONTENT_CHARS = 64 * 1024
"""At most this much of one recorded content (a message list, a tool's arguments or result)."""
LOOK_AGAIN_SECONDS = 1.0
"""How often a hook with no provider yet looks whether the application set one."""
FINE = frozenset({"ok", "replayed"})
"""Tool outcomes that are no error (every other `ToolStatus` sets the span's error status)."""


def installed() -> bool:
    """Whether `opentelemetry-api` is importable (looked up, not imported)."""
    return importlib.util.find_spec("opentelemetry") is not None and (
        importlib.util.find_spec("opentelemetry.trace") is not None
    )


def state(settings: HarnessSettings) -> str:
    """The truth key `tracing`: `ACTIVE(otel)`, `INACTIVE(no-opentelemetry)` or
    `INACTIVE(disabled)`."""
    if not settings.groups.tracing.enabled:
        return DISABLED
    return ACTIVE if installed() else NOT_INSTALLED


def tracing_hooks(settings: HarnessSettings, *, approvals: object = None) -> Tracing | None:
    """The tracing hook for `settings`, or `None` when it is off or OpenTelemetry is absent."""
    if state(settings) != ACTIVE:
        return None
    return Tracing(capture_content=settings.groups.tracing.capture_content, approvals=approvals)


@contextlib.contextmanager
def incoming(headers: Mapping[str, str] | None, *, enabled: bool = True) -> Iterator[None]:
    """Runs started in the block have the request's `traceparent` (and `tracestate`) as their
    parent, read with the global propagator; a no-op without the header, without
    OpenTelemetry, or when the application already made a span current (its own HTTP server
    instrumentation read the header)."""
    if not enabled or not headers or TRACEPARENT not in headers or not installed():
        yield
        return
    from opentelemetry import context, propagate, trace

    if trace.get_current_span().get_span_context().is_valid:
        yield
        return
    token = context.attach(propagate.extract(headers))
    try:
        yield
    finally:
        context.detach(token)


class Tracing(RunHooks):
    """Spans and metrics around every run, model call and tool call (module docstring).

    `tracer_provider` and `meter_provider` default to the global ones (set by the application,
    or OpenTelemetry's no-op); `approvals` is the approval store whose waiting approvals the
    `atmosphere.approvals.waiting` gauge reports (any store with a `len`).
    """

    def __init__(
        self,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        capture_content: bool = False,
        approvals: object = None,
    ) -> None:
        from opentelemetry import context, metrics, trace
        from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

        self._context = context
        self._trace = trace
        self._metrics = metrics
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._live = False
        self._look_again = 0.0
        self._placeholders = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        self._no_meter = metrics.NoOpMeterProvider
        self._link = Link
        self._span_context = SpanContext
        self._flags = TraceFlags
        self._client = SpanKind.CLIENT
        self._internal = SpanKind.INTERNAL
        self._error = StatusCode.ERROR
        self._status = Status
        self.capture_content = capture_content
        self._tracer = trace.get_tracer(
            "atmosphere_harness", __version__, tracer_provider=tracer_provider
        )
        meter = metrics.get_meter("atmosphere_harness", __version__, meter_provider=meter_provider)
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Tokens used by each model call, by type (input, output)",
        )
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="Duration of each model call and each agent run",
        )
        self._runs = meter.create_counter(
            "atmosphere.runs", unit="{run}", description="Runs ended, by status"
        )
        self._tool_calls = meter.create_counter(
            "atmosphere.tool.calls", unit="{call}", description="Tool calls ended, by outcome"
        )
        if approvals is not None and hasattr(approvals, "__len__"):
            _WATCHED.add(approvals)
        # One callback over every watched store: the SDK keeps the first instrument of a name
        # a meter makes, so a second host in the process adds its store, not an instrument.
        meter.create_observable_up_down_counter(
            "atmosphere.approvals.waiting",
            callbacks=[_waiting],
            unit="{approval}",
            description="Approvals this process's runs wait on",
        )

    def live(self) -> bool:
        """Whether a real provider takes the spans or the metrics. Until the application sets
        one, the API's placeholders drop everything, and the hook only passes calls through;
        it looks again at most once a second (reading the providers costs more than a no-op
        span), so a provider set later is used within a second, and from then on for good (a
        process sets it once)."""
        if self._live:
            return True
        now = time.monotonic()
        if now < self._look_again:
            return False
        self._look_again = now + LOOK_AGAIN_SECONDS
        tracer = self._tracer_provider or self._trace.get_tracer_provider()
        if type(tracer) not in self._placeholders:
            self._live = True
            return True
        meter = self._meter_provider or self._metrics.get_meter_provider()
        # `_ProxyMeterProvider`: the API's placeholder for the global one (no public name).
        self._live = type(meter) is not self._no_meter and (
            type(meter).__name__ != "_ProxyMeterProvider"
        )
        return self._live

    # --- runs -------------------------------------------------------------------------------

    def around_run(self, run: Run, proceed: ProceedRun) -> Coroutine[Any, Any, None]:
        # Off, the hook is no layer: the run's own coroutine (none of its own for a run in
        # flight to keep).
        return self._run(run, proceed) if self.live() else proceed()

    async def _run(self, run: Run, proceed: ProceedRun) -> None:
        agent = agent_name(run)
        attributes: dict[str, Any] = {
            OPERATION: "invoke_agent",
            AGENT_NAME: agent,
            CONVERSATION: run.conversation_id,
            PROVIDER: run.endpoint.runtime.name,
        }
        notes = run.state.get(RUN_CHECKPOINTS) if run.parent is None else None
        first = notes.recall(SPAN_NOTE) if notes is not None else None
        links = self._links(first)
        span = self._tracer.start_span(
            f"invoke_agent {agent}", kind=self._internal, attributes=attributes, links=links
        )
        token = self._context.attach(self._trace.set_span_in_context(span))
        started = time.perf_counter()
        status = "completed"
        try:
            if notes is not None and first is None:
                carried = span.get_span_context()
                if carried.is_valid:
                    await notes.record(
                        SPAN_NOTE,
                        [
                            f"{carried.trace_id:032x}",
                            f"{carried.span_id:016x}",
                            int(carried.trace_flags),
                        ],
                    )
            await proceed()
            if run.discarded:
                status = "discarded"
        except asyncio.CancelledError:
            status = "suspended" if run.suspended else "cancelled"
            raise
        except BaseException as exc:
            status = "discarded" if run.discarded else "error"
            if status == "error":
                span.record_exception(exc)
                span.set_status(self._status(self._error, f"{type(exc).__name__}: {exc}"))
                span.set_attribute(ERROR_TYPE, type(exc).__qualname__)
            raise
        finally:
            usage = run.usage
            span.set_attributes(
                {
                    INPUT_TOKENS: usage.input_tokens,
                    OUTPUT_TOKENS: usage.output_tokens,
                    RUN_STATUS: status,
                }
            )
            self._context.detach(token)
            span.end()
            self._runs.add(1, {AGENT_NAME: agent, RUN_STATUS: status})
            measured = {OPERATION: "invoke_agent", AGENT_NAME: agent}
            if status != "completed":
                measured[ERROR_TYPE] = status
            self._duration.record(time.perf_counter() - started, measured)

    def _links(self, first: Any) -> list[Any]:
        """A link to the first life's span of a resumed run, from its journal note."""
        if not isinstance(first, list) or len(first) != 3:
            return []
        try:
            trace_id, span_id, flags = int(first[0], 16), int(first[1], 16), int(first[2])
        except (TypeError, ValueError):
            return []
        carried = self._span_context(
            trace_id, span_id, is_remote=True, trace_flags=self._flags(flags)
        )
        if not carried.is_valid:
            return []
        return [self._link(carried, {"atmosphere.link": "resumed-from"})]

    # --- model calls ------------------------------------------------------------------------

    def around_model(
        self, step: ModelStep, proceed: ProceedModel
    ) -> Coroutine[Any, Any, ModelResponse]:
        # As `around_run`: off, the call's own coroutine.
        return self._model(step, proceed) if self.live() else proceed(step)

    async def _model(self, step: ModelStep, proceed: ProceedModel) -> ModelResponse:
        run = step.run
        runtime = step.runtime
        requested = model_of(runtime)
        attributes: dict[str, Any] = {
            OPERATION: "chat",
            PROVIDER: runtime.name,
            AGENT_NAME: agent_name(run),
            CONVERSATION: run.conversation_id,
        }
        if requested:
            attributes[REQUEST_MODEL] = requested
        if self.capture_content:
            attributes[SYSTEM_INSTRUCTIONS] = bounded(step.request.system_prompt)
            attributes[INPUT_MESSAGES] = bounded(messages_json(step.request.messages))
        span = self._tracer.start_span(
            f"chat {requested or runtime.name}", kind=self._client, attributes=attributes
        )
        token = self._context.attach(self._trace.set_span_in_context(span))
        started = time.perf_counter()
        measured = {OPERATION: "chat", PROVIDER: runtime.name}
        if requested:
            measured[REQUEST_MODEL] = requested
        try:
            response = await proceed(step)
        except BaseException as exc:
            kind = (
                "cancelled" if isinstance(exc, asyncio.CancelledError) else type(exc).__qualname__
            )
            if not isinstance(exc, asyncio.CancelledError):
                span.record_exception(exc)
                span.set_status(self._status(self._error, f"{type(exc).__name__}: {exc}"))
            span.set_attribute(ERROR_TYPE, kind)
            measured[ERROR_TYPE] = kind
            raise
        else:
            usage = response.usage
            answered = response.model or requested
            if answered:
                measured[RESPONSE_MODEL] = answered
            if span.is_recording():  # a sampled-out span takes no attributes: build none
                answered_with: dict[str, Any] = {
                    INPUT_TOKENS: usage.input_tokens,
                    OUTPUT_TOKENS: usage.output_tokens,
                }
                if usage.cache_read_tokens:
                    answered_with[CACHE_READ_TOKENS] = usage.cache_read_tokens
                if usage.cache_write_tokens:
                    answered_with[CACHE_WRITE_TOKENS] = usage.cache_write_tokens
                if answered:
                    answered_with[RESPONSE_MODEL] = answered
                if response.stop_reason:
                    answered_with[FINISH_REASONS] = (response.stop_reason,)
                if self.capture_content:
                    answered_with[OUTPUT_MESSAGES] = bounded(output_json(response))
                span.set_attributes(answered_with)
            self._tokens.record(usage.input_tokens, {**measured, TOKEN_TYPE: "input"})
            self._tokens.record(usage.output_tokens, {**measured, TOKEN_TYPE: "output"})
            return response
        finally:
            self._context.detach(token)
            span.end()
            self._duration.record(time.perf_counter() - started, measured)

    # --- tool calls -------------------------------------------------------------------------

    async def around_tool(self, step: ToolStep, proceed: ProceedTool) -> ToolOutcome:
        if not self.live():
            return await proceed(step)
        call = step.call
        run = step.run
        attributes: dict[str, Any] = {
            OPERATION: "execute_tool",
            TOOL_NAME: call.name,
            TOOL_CALL_ID: call.id,
            TOOL_TYPE: "function",
            AGENT_NAME: agent_name(run),
            CONVERSATION: run.conversation_id,
        }
        if self.capture_content:
            attributes[TOOL_ARGUMENTS] = bounded(dumps(call.arguments))
        span = self._tracer.start_span(
            f"execute_tool {call.name}", kind=self._internal, attributes=attributes
        )
        token = self._context.attach(self._trace.set_span_in_context(span))
        outcome_name = "cancelled"
        try:
            outcome = await proceed(step)
            outcome_name = outcome.status
            ended: dict[str, Any] = {TOOL_OUTCOME: outcome.status}
            if outcome.status not in FINE:
                span.set_status(self._status(self._error, outcome.status))
                ended[ERROR_TYPE] = outcome.status
            if self.capture_content and span.is_recording():
                ended[TOOL_RESULT] = bounded(outcome.result)
            span.set_attributes(ended)
            return outcome
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                outcome_name = "error"
                span.record_exception(exc)
                span.set_status(self._status(self._error, f"{type(exc).__name__}: {exc}"))
                span.set_attribute(ERROR_TYPE, type(exc).__qualname__)
            raise
        finally:
            self._context.detach(token)
            span.end()
            self._tool_calls.add(1, {TOOL_NAME: call.name, TOOL_OUTCOME: outcome_name})


_WATCHED: weakref.WeakSet[Any] = weakref.WeakSet()
"""The approval stores of this process's hosts (`atmosphere.approvals.waiting` sums them)."""


def _waiting(_: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    yield Observation(sum(len(store) for store in list(_WATCHED)))


# --- what the spans say ---------------------------------------------------------------------


def agent_name(run: Run) -> str:
    """The agent's name (its `@agent(name=...)`), else its endpoint's owner."""
    endpoint = run.endpoint
    spec = endpoint.spec
    return spec.name if spec is not None and spec.name else endpoint.owner


def model_of(runtime: object) -> str | None:
    """The model a runtime asks for, when it says (`OpenAIRuntime.model`)."""
    model = getattr(runtime, "model", None)
    return model if isinstance(model, str) and model else None


def bounded(text: str) -> str:
    """At most `CONTENT_CHARS` of a recorded content."""
    if len(text) <= CONTENT_CHARS:
        return text
    return text[:CONTENT_CHARS] + f"... [{len(text) - CONTENT_CHARS} more characters]"


def dumps(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def messages_json(messages: Sequence[Message]) -> str:
    """Messages in the GenAI conventions' shape (`role` and `parts`)."""
    return dumps([message_parts(message) for message in messages])


def message_parts(message: Message) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if message.role == "tool":
        parts.append(
            {"type": "tool_call_response", "id": message.tool_call_id, "response": message.content}
        )
    elif message.content:
        parts.append({"type": "text", "content": message.content})
    parts.extend(
        {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        for call in message.tool_calls
    )
    return {"role": message.role, "parts": parts}


def output_json(response: ModelResponse) -> str:
    parts: list[dict[str, Any]] = []
    if response.text:
        parts.append({"type": "text", "content": response.text})
    parts.extend(
        {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        for call in response.tool_calls
    )
    answer: dict[str, Any] = {"role": "assistant", "parts": parts}
    if response.stop_reason:
        answer["finish_reason"] = response.stop_reason
    return dumps([answer])
