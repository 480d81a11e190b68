"""`ScriptedRuntime`: a deterministic model for tests and the offline demo.

Each turn of the script is a final answer (`str`), one model message asking for tools (a list of
`ToolCall`), or a callable that receives the `ModelRequest` and returns either (it may be async).
Every conversation walks the script from the start, independently of the others.
"""

from __future__ import annotations

import inspect
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeAlias

from .._errors import ModelError, ScriptExhausted
from .base import AiCapability, Message, ModelRequest, ModelResponse, TextSink, ToolCall, Usage
from .demo_tools import fill_arguments, pick_user_tool

TurnResult: TypeAlias = str | Sequence[ToolCall]
TurnFunction: TypeAlias = Callable[[ModelRequest], TurnResult | Awaitable[TurnResult]]
Turn: TypeAlias = str | Sequence[ToolCall] | TurnFunction

_MAX_TRACKED_CONVERSATIONS = 10_000
DEFAULT_MAX_REQUESTS = 256
"""How many model requests a `ScriptedRuntime` keeps in `requests` unless told otherwise."""


class ScriptedRuntime:
    """A model that plays a fixed script.

    Example:
        ```python
        runtime = ScriptedRuntime([
            [ToolCall("write_file", {"path": "a.md", "content": "hi"})],
            "Saved a.md.",
        ])
        ```

    `default` answers every turn after the script runs out (the demo model is a `default` only);
    without it an exhausted script raises `ScriptExhausted`, which the run reports as an error.

    `requests` holds the last `max_requests` model requests (256 by default), oldest first, so a
    test can see what the model was sent while a long-running demo keeps a bounded memory; `0`
    (or `record_requests = False`) keeps none.
    """

    name = "scripted"
    capabilities = frozenset(
        {
            AiCapability.TOOL_CALLING,
            AiCapability.PARALLEL_TOOL_CALLS,
            AiCapability.STREAMING,
            AiCapability.SYSTEM_PROMPT,
        }
    )

    def __init__(
        self,
        turns: Sequence[Turn] = (),
        *,
        default: TurnFunction | None = None,
        max_requests: int = DEFAULT_MAX_REQUESTS,
    ) -> None:
        if max_requests < 0:
            raise ValueError(f"max_requests must be 0 or more, got {max_requests}")
        self.turns: list[Turn] = list(turns)
        self.default = default
        self.requests: list[ModelRequest] = []
        self.max_requests = max_requests
        self._cursor: OrderedDict[str, int] = OrderedDict()
        self.record_requests = True

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        if self.record_requests and self.max_requests > 0:
            self.requests.append(request)
            if len(self.requests) > self.max_requests:
                del self.requests[: len(self.requests) - self.max_requests]
        turn = self._next_turn(request.conversation_id)
        produced = turn(request) if callable(turn) else turn
        result: TurnResult = await produced if inspect.isawaitable(produced) else produced
        if isinstance(result, str):
            if on_text is not None:
                for chunk in _chunks(result):
                    await on_text(chunk)
            return ModelResponse(text=result, usage=_usage(request, result))
        calls = tuple(result)
        if not all(isinstance(call, ToolCall) for call in calls):
            raise ModelError("a scripted turn must be a str or a list of ToolCall")
        return ModelResponse(tool_calls=calls, usage=_usage(request, ""))

    def _next_turn(self, conversation_id: str) -> Turn:
        index = self._cursor.pop(conversation_id, 0)
        self._cursor[conversation_id] = index + 1
        while len(self._cursor) > _MAX_TRACKED_CONVERSATIONS:
            self._cursor.popitem(last=False)
        if index < len(self.turns):
            return self.turns[index]
        if self.default is not None:
            return self.default
        raise ScriptExhausted(
            f"the scripted model has no turn {index + 1} for conversation "
            f"{conversation_id!r} (script has {len(self.turns)} turns)"
        )

    @classmethod
    def demo(cls) -> ScriptedRuntime:
        """The built-in demo model: every primitive can be seen with no API key.

        - "plan ... and save ... to a file": `write_todos` -> `write_file` -> `write_todos`
          (all completed) -> a final report;
        - "use the task tool ...": a `task` spawn, then the sub-agent's report;
        - "ask the <name> agent about ...": a `delegate_task` to that fleet member, then its reply;
        - a message that names one of the host's own tools ("what's the weather in Paris" with a
          `weather(city)` tool): that tool, with its required arguments taken from the message
          (`{"city": "Paris"}`), then an answer quoting its result (`runtimes.demo_tools` has
          the rules);
        - anything else: a short echo.

        The first that applies wins, in this order.
        """
        return cls((), default=demo_turn)


def _chunks(text: str) -> list[str]:
    """Split text into word-sized deltas so streaming is visible (and tested) offline."""
    return re.findall(r"\S+\s*|\s+", text) or [text]


def _usage(request: ModelRequest, output: str) -> Usage:
    """A rough chars/4 token estimate, so usage accounting has numbers to add up."""
    chars = len(request.system_prompt) + sum(len(m.content) for m in request.messages)
    return Usage(input_tokens=chars // 4, output_tokens=len(output) // 4)


# --- the demo model -------------------------------------------------------------------------

_TASK_PROMPT = re.compile(r"\btask tool\b|\bspawn\b.*\bsub-?agent\b", re.IGNORECASE)
_SUBTASK = re.compile(r"^.*\b(?:sub-?agent|task tool)\s+to\s+", re.IGNORECASE)
_THEN = re.compile(r",?\s+then\s+(?:give|send|show|tell|report)\b", re.IGNORECASE)
_DELEGATE_PROMPT = re.compile(
    r"\bask (?:the |my )?([A-Za-z0-9][\w.-]*) agent (?:about|for|to) (.+)", re.IGNORECASE
)
_SUBAGENT_MARKER = "general-purpose subagent"


def _since_last_user(messages: Sequence[Message]) -> tuple[str, list[Message]]:
    """The last user message and everything the loop added after it."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return messages[index].content, list(messages[index + 1 :])
    return "", []


def _slug(text: str) -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())
    stop = {"plan", "a", "an", "the", "and", "save", "to", "file", "result", "short", "it", "of"}
    keep = [word for word in words if word not in stop][:4]
    return "-".join(keep) or "result"


def demo_turn(request: ModelRequest) -> TurnResult:
    """One turn of the demo model, derived only from the request (so it survives restarts)."""
    prompt, after = _since_last_user(request.messages)
    tools = {tool.name for tool in request.tools}
    rounds = sum(1 for message in after if message.role == "assistant" and message.tool_calls)
    results = [message for message in after if message.role == "tool"]
    lowered = prompt.lower()
    is_subagent = _SUBAGENT_MARKER in request.system_prompt

    if _TASK_PROMPT.search(prompt) and "task" in tools and not is_subagent:
        if rounds == 0:
            # "... subagent to <subtask>, then give me its report": the sub-agent gets <subtask>.
            subtask = _THEN.split(_SUBTASK.sub("", prompt, count=1), maxsplit=1)[0].strip()
            subtask = subtask or prompt
            description = (
                f"{subtask.rstrip('.')}. Plan the work with write_todos, save your findings to "
                "report.md, and reply with a short report."
            )
            return [ToolCall("task", {"description": description})]
        report = results[-1].content if results else "(no report)"
        return f"The sub-agent finished. Its report:\n\n{report}"

    delegation = _DELEGATE_PROMPT.search(prompt)
    if delegation and "delegate_task" in tools and not is_subagent:
        if rounds == 0:
            name, message = delegation.group(1), delegation.group(2).strip().rstrip(".?!")
            return [ToolCall("delegate_task", {"agent": name, "message": message})]
        reply = results[-1].content if results else "(no reply)"
        return f"The {delegation.group(1)} agent replied:\n\n{reply}"

    wants_plan = "plan" in lowered and "file" in lowered
    if (wants_plan or is_subagent) and "write_todos" in tools:
        path = "report.md" if is_subagent else f"notes/{_slug(prompt)}.md"
        steps = ["Outline the task", "Write the result to a file", "Review the result"]
        goal = prompt.strip()[:200]
        sequence: list[list[ToolCall]] = [
            [
                ToolCall(
                    "write_todos",
                    {
                        "todos": [
                            {
                                "content": steps[0],
                                "status": "in_progress",
                                "activeForm": "Outlining the task",
                            },
                            {"content": steps[1], "status": "pending"},
                            {"content": steps[2], "status": "pending"},
                        ],
                        "goal": goal,
                    },
                )
            ]
        ]
        if "write_file" in tools:
            body = (
                f"# {prompt.strip()[:120]}\n\n"
                "1. Outline: break the request into three small steps.\n"
                "2. Result: this file holds the outcome of the plan.\n"
                "3. Review: every step of the plan is complete.\n"
            )
            sequence.append([ToolCall("write_file", {"path": path, "content": body})])
        done = [{"content": step, "status": "completed"} for step in steps]
        sequence.append([ToolCall("write_todos", {"todos": done, "goal": goal})])
        if rounds < len(sequence):
            return sequence[rounds]
        saved = f" and saved the result to {path}" if "write_file" in tools else ""
        return f"Done: I planned the task in three steps{saved}. Every step is completed."

    user_tool = pick_user_tool(prompt, request.tools) if not is_subagent else None
    if user_tool is not None:
        if rounds == 0:
            return [ToolCall(user_tool.name, fill_arguments(prompt, user_tool))]
        answer = results[-1].content if results else "(no result)"
        return f"The {user_tool.name} tool says: {answer}"

    return f"You said: {prompt.strip()}" if prompt.strip() else "Hello! Ask me to plan something."
