"""`POST P/ag-ui`: a prompt run spoken as the AG-UI protocol (events of `ag-ui-protocol`).

The request body is AG-UI's `RunAgentInput`. Its `threadId` is the conversation id and the
last user message is the prompt: the harness keeps the conversation's history itself, so the
earlier messages a client resends are not replayed. Client-side `tools` are not offered to the
model. The response is the run's frames translated one by one (`AguiTranslator`) and encoded by
the package's `EventEncoder`:

- run start: `RUN_STARTED`;
- `text`: `TEXT_MESSAGE_START` (first delta of a message), `TEXT_MESSAGE_CONTENT`;
- `tool-start`: `TEXT_MESSAGE_END` (if a message is open), then `TOOL_CALL_START`,
  `TOOL_CALL_ARGS` (the arguments as JSON), `TOOL_CALL_END`;
- `tool-result`: `TOOL_CALL_RESULT` (the text the model got);
- `plan-update`: `STATE_SNAPSHOT` the first time, then `STATE_DELTA` (a JSON Patch). The state
  is `{"plan": ...}` (plus what the client sent); a sub-agent's plan (its frame carries
  `subagentId`) goes to `{"subagentPlans": {subagentId: ...}}`;
- `subagent-start` / `subagent-end`: `SUBAGENT_STARTED` / `SUBAGENT_FINISHED` or
  `SUBAGENT_ERROR`;
- `complete`: `TEXT_MESSAGE_END` (if open), `RUN_FINISHED` (`result` = the final answer);
- `error`: `RUN_ERROR`;
- any other frame (`approval-required`, a prompt method's own events): `CUSTOM`, named after
  the frame type, with its data as the value.

`forwardedProps.multitask` is the prompt's `multitask`, as for `POST P` (default `enqueue`):
`reject` while the conversation has a run in flight answers `RUN_STARTED` then `RUN_ERROR`
(code `RunConflict`), and nothing runs.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any

from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    Message,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    SubagentErrorEvent,
    SubagentFinishedEvent,
    SubagentStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder
from fastapi import Depends, HTTPException, Request
from pydantic import Field, field_validator
from pydantic_core import PydanticSerializationError
from sse_starlette import EventSourceResponse

from .. import _events as events
from .._errors import RunConflict
from .._events import Frame, json_line, line_safe
from .._ids import check_conversation_id
from .._registry import AgentSpec
from .deps import CONVERSATION_ID_SCHEMA, HarnessDep, get_user_id, hosted_endpoint
from .ownership import require_conversation
from .route_spec import MAX_MESSAGE_CHARS, MULTITASK_MODES, NOT_FOUND_RESPONSE, RouteSpec
from .sse import PING_SECONDS, SEND_TIMEOUT, HarnessEventSource, admit, run_frames

SUBAGENT_ERROR_STATUSES = frozenset({"error", "failed", "timeout", "denied", "cancelled"})


def _new_id() -> str:
    return uuid.uuid4().hex


def _pointer(key: str) -> str:
    """A JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


class AguiTranslator:
    """Turns one run's frames into AG-UI events, keeping the protocol's open/close rules.

    Pure bookkeeping, no I/O: which text message is open, which sub-agents are running, and
    the state the client holds, so a plan change becomes a minimal `STATE_DELTA`.
    """

    def __init__(self, thread_id: str, run_id: str, state: Any = None) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.state: dict[str, Any] = dict(state) if isinstance(state, Mapping) else {}
        self._snapshot_sent = False
        self._message_id: str | None = None
        self._parent_id: str | None = None
        self._subagents: set[str] = set()

    def start(self) -> list[BaseEvent]:
        return [RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id)]

    def translate(self, frame: Frame) -> list[BaseEvent]:
        data = frame.data
        kind = frame.event
        if kind == events.TEXT:
            return self._text(str(data.get("text", "")))
        if kind == events.TOOL_START:
            return self._tool_start(data)
        if kind == events.TOOL_RESULT:
            return [
                ToolCallResultEvent(
                    message_id=_new_id(),
                    tool_call_id=str(data.get("toolCallId")),
                    content=str(data.get("result", "")),
                    role="tool",
                )
            ]
        if kind == events.PLAN_UPDATE:
            return [self._plan(data)]
        if kind == events.SUBAGENT_START:
            return self._subagent_start(data)
        if kind == events.SUBAGENT_END:
            return self._subagent_end(data)
        if kind == events.COMPLETE:
            return self._complete(data)
        if kind == events.ERROR:
            return [
                RunErrorEvent(
                    message=str(data.get("message") or "the run failed"),
                    code=str(data.get("type") or "Error"),
                )
            ]
        return [CustomEvent(name=kind, value=dict(data))]

    # --- text and tools ---------------------------------------------------------------------

    def _text(self, delta: str) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        if self._message_id is None:
            self._message_id = _new_id()
            out.append(TextMessageStartEvent(message_id=self._message_id, role="assistant"))
        out.append(TextMessageContentEvent(message_id=self._message_id, delta=delta))
        return out

    def _end_text(self) -> list[BaseEvent]:
        if self._message_id is None:
            return []
        ended = TextMessageEndEvent(message_id=self._message_id)
        self._parent_id, self._message_id = self._message_id, None
        return [ended]

    def _tool_start(self, data: Mapping[str, Any]) -> list[BaseEvent]:
        out = self._end_text()
        call_id = str(data.get("toolCallId"))
        arguments = json.dumps(data.get("arguments", {}), ensure_ascii=False, default=str)
        out += [
            ToolCallStartEvent(
                tool_call_id=call_id,
                tool_call_name=str(data.get("tool")),
                parent_message_id=self._parent_id,
            ),
            ToolCallArgsEvent(tool_call_id=call_id, delta=arguments),
            ToolCallEndEvent(tool_call_id=call_id),
        ]
        return out

    # --- plan state -------------------------------------------------------------------------

    def _plan(self, data: Mapping[str, Any]) -> BaseEvent:
        plan = json.loads(json.dumps(dict(data), default=str))
        subagent = plan.get("subagentId")
        plans = self.state.get("subagentPlans")
        if subagent is None:
            self.state["plan"] = plan
            patch = {"op": "add", "path": "/plan", "value": plan}
        elif isinstance(plans, dict):
            plans[str(subagent)] = plan
            path = f"/subagentPlans/{_pointer(str(subagent))}"
            patch = {"op": "add", "path": path, "value": plan}
        else:
            self.state["subagentPlans"] = {str(subagent): plan}
            patch = {"op": "add", "path": "/subagentPlans", "value": self.state["subagentPlans"]}
        if not self._snapshot_sent:
            self._snapshot_sent = True
            return StateSnapshotEvent(snapshot=self.state)
        return StateDeltaEvent(delta=[patch])

    # --- sub-agents and the end -------------------------------------------------------------

    def _subagent_start(self, data: Mapping[str, Any]) -> list[BaseEvent]:
        subagent = str(data.get("subagentId") or "")
        if not subagent or subagent in self._subagents:
            return []
        self._subagents.add(subagent)
        description = data.get("description")
        return [
            SubagentStartedEvent(
                subagent_run_id=subagent,
                name=str(data.get("agentId") or "subagent"),
                description=None if description is None else str(description),
            )
        ]

    def _subagent_end(self, data: Mapping[str, Any]) -> list[BaseEvent]:
        subagent = str(data.get("subagentId") or "")
        if subagent not in self._subagents:
            return []
        self._subagents.discard(subagent)
        status = str(data.get("status") or "")
        if data.get("error") is not None or status.lower() in SUBAGENT_ERROR_STATUSES:
            message = str(data.get("error") or f"the sub-agent ended with status {status!r}")
            return [SubagentErrorEvent(subagent_run_id=subagent, message=message, code=status)]
        return [SubagentFinishedEvent(subagent_run_id=subagent, result=data.get("report"))]

    def _complete(self, data: Mapping[str, Any]) -> list[BaseEvent]:
        out = self._end_text()
        for subagent in sorted(self._subagents):
            out.append(
                SubagentErrorEvent(
                    subagent_run_id=subagent, message="the run ended before the sub-agent did"
                )
            )
        self._subagents.clear()
        usage = data.get("usage")
        tokens: list[TokenUsage] | None = None
        if isinstance(usage, Mapping):
            tokens = [
                TokenUsage(
                    input_tokens=usage.get("inputTokens"),
                    output_tokens=usage.get("outputTokens"),
                    cached_input_tokens=usage.get("cacheReadTokens"),
                    cache_write_input_tokens=usage.get("cacheWriteTokens"),
                )
            ]
        out.append(
            RunFinishedEvent(
                thread_id=self.thread_id,
                run_id=self.run_id,
                result=data.get("summary"),
                usage=tokens,
            )
        )
        return out


def prompt_of(run_input: RunAgentInput) -> str:
    """The text of the last user message (text parts joined), or 422."""
    for message in reversed(run_input.messages):
        if getattr(message, "role", None) != "user":
            continue
        content = getattr(message, "content", "")
        if isinstance(content, str):
            text = content
        else:
            text = "".join(getattr(part, "text", "") or "" for part in content)
        if text.strip():
            return text
    raise HTTPException(422, "the run input has no user message with text")


HAS_TEXT = {"type": "string", "pattern": "\\S"}
USER_TEXT_SCHEMA: dict[str, Any] = {
    "contains": {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"const": "user"},
            "content": {
                "anyOf": [
                    HAS_TEXT,
                    {
                        "type": "array",
                        "contains": {
                            "type": "object",
                            "required": ["text"],
                            "properties": {"text": HAS_TEXT},
                        },
                    },
                ]
            },
        },
    }
}
"""What `prompt_of` needs, for the OpenAPI document: a user message with some text."""
FORWARDED_PROPS_SCHEMA: dict[str, Any] = {
    "properties": {"multitask": {"type": "string", "enum": list(MULTITASK_MODES)}}
}


class AguiRunInput(RunAgentInput):
    """AG-UI's `RunAgentInput`, with the shape of `threadId` (a conversation id) and the user
    message a run needs (`prompt_of`) documented."""

    thread_id: str = Field(json_schema_extra=CONVERSATION_ID_SCHEMA)
    messages: list[Message] = Field(json_schema_extra=USER_TEXT_SCHEMA)
    forwarded_props: Any = Field(
        None,
        alias="forwardedProps",
        json_schema_extra=FORWARDED_PROPS_SCHEMA,
        description="`multitask`: what this run does when its thread has a run in flight "
        "(as for `POST P`; default `enqueue`).",
    )

    @field_validator("forwarded_props")
    @classmethod
    def _check_multitask(cls, value: Any) -> Any:
        if isinstance(value, Mapping) and value.get("multitask", "enqueue") not in MULTITASK_MODES:
            raise ValueError(f"multitask must be one of {', '.join(MULTITASK_MODES)}")
        return value

    @property
    def multitask(self) -> str:
        props = self.forwarded_props
        return str(props.get("multitask", "enqueue")) if isinstance(props, Mapping) else "enqueue"


def encode_event(encoder: EventEncoder, event: BaseEvent) -> str:
    """One event as an SSE block that every line reader splits right and UTF-8 can carry.

    See `events.line_safe`; a lone surrogate from the model (valid JSON, `"\\ud800"`) even
    makes pydantic refuse to serialize the event, which would break the stream mid-run.
    """
    try:
        return line_safe(encoder.encode(event))
    except PydanticSerializationError:
        return f"data: {json_line(event.model_dump(by_alias=True, mode='json'))}\n\n"


def agui_routes(spec: AgentSpec) -> list[RouteSpec]:

    encoder = EventEncoder()

    async def post_agui(
        run_input: AguiRunInput,
        request: Request,
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
    ) -> EventSourceResponse:
        endpoint = hosted_endpoint(host, spec.path)
        try:
            conversation_id = check_conversation_id(run_input.thread_id)
        except ValueError as exc:
            raise HTTPException(422, f"threadId: {exc}") from None
        message = prompt_of(run_input)
        if len(message) > MAX_MESSAGE_CHARS:
            raise HTTPException(422, f"the prompt is over {MAX_MESSAGE_CHARS} characters")
        await require_conversation(
            host, spec.path, conversation_id, user_id, claim=True, message=message
        )
        translator = AguiTranslator(conversation_id, run_input.run_id, run_input.state)

        async def stream() -> AsyncIterator[bytes]:
            for event in translator.start():
                yield encode_event(encoder, event).encode()
            try:
                ticket = await admit(
                    host,
                    endpoint,
                    message=message,
                    conversation_id=conversation_id,
                    user_id=user_id,
                    multitask=run_input.multitask,
                )
            except RunConflict as exc:
                refused = RunErrorEvent(message=str(exc), code=type(exc).__name__)
                yield encode_event(encoder, refused).encode()
                return
            frames = run_frames(
                host,
                endpoint,
                message=message,
                conversation_id=conversation_id,
                user_id=user_id,
                ticket=ticket,
                headers=request.headers,
            )
            async with contextlib.aclosing(frames):
                async for frame in frames:
                    translated = translator.translate(frame)
                    if translated:
                        yield "".join(encode_event(encoder, e) for e in translated).encode()

        return HarnessEventSource(
            stream(),
            ping=PING_SECONDS,
            send_timeout=SEND_TIMEOUT,
            headers={"X-Conversation-Id": conversation_id},
        )

    return [
        RouteSpec(
            spec.path + "/ag-ui",
            post_agui,
            methods=("POST",),
            options={
                "summary": f"Run {spec.owner} over the AG-UI protocol",
                "response_class": EventSourceResponse,
                "responses": {
                    200: {"content": {"text/event-stream": {}}, "description": "AG-UI events"},
                    **NOT_FOUND_RESPONSE,
                },
            },
        )
    ]
