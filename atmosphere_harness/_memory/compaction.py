"""Compaction: which part of a stored conversation is sent to the model.

The full history stays in storage; a strategy only shapes the view. Every strategy works on
*units*, never on single messages: a user message, a plain assistant message, or an assistant
tool request together with all of its tool results. So no view ever separates a tool call from
its result or starts with an orphan tool result (providers reject both). A unit left incomplete
by storage (a request whose results are missing) is repaired before any strategy sees it.

- `sliding-window` keeps the newest units that fit `max_messages`, starting on a user turn when
  it can;
- `summarizing` folds everything but a recent window into one summary message (a new summary
  absorbs the previous one, so summaries never pile up), written by the model when one is
  configured and locally otherwise;
- `token-window` keeps the newest units that fit a token budget (chars/4) and `max_messages`;
  the budget is the model's context window when the runtime knows it (`token_budget`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .._contracts import UserDailyCap
from .._errors import UsageLimitExceeded
from .._log import get_logger
from .._runtimes.base import AgentRuntime, ContextWindowRuntime, Message
from .._settings import Compaction, HarnessSettings
from .oneshot import ask

log = get_logger(__name__)

DEFAULT_RECENT_WINDOW = 6
LOCAL_LINE_CHARS = 100
MAX_SUMMARY_CHARS = 4000
"""A summary longer than this keeps its end (the newest part)."""
SUMMARY_HEADER = "[Conversation summary of {count} earlier messages]\n"

SUMMARIZER_SYSTEM_PROMPT = "You are a conversation summarizer. Respond with the summary only."
SUMMARIZER_PROMPT = (
    "Summarize the following conversation concisely, preserving key facts, decisions, names, "
    "and open questions. Respond with the summary text only.\n\nConversation:\n{conversation}"
)


@dataclass(frozen=True, slots=True)
class Summary:
    """A conversation's running summary: its text and how many messages it covers."""

    text: str
    covered: int

    def message(self) -> Message:
        return Message.system(SUMMARY_HEADER.format(count=self.covered) + self.text)


@dataclass(frozen=True, slots=True)
class Compacted:
    """A strategy's result: the view to send, and the summary it wrote (if any).

    `absorbed` is how many leading input messages the new summary covers, so the store can move
    its summary checkpoint past them.
    """

    messages: list[Message]
    summary: Summary | None = None
    absorbed: int = 0


class CompactionStrategy(Protocol):
    name: str
    summarizes: bool
    """Whether it keeps a running summary (then it is given the stored one, and the messages
    after it, instead of the newest `max_messages`)."""

    async def compact(
        self,
        messages: Sequence[Message],
        max_messages: int,
        summary: Summary | None = None,
        user_id: str | None = None,
    ) -> Compacted:
        """The view of `messages`; `user_id` is whose conversation it is (a summary written by
        the model counts toward that user's daily tokens)."""
        ...


# --- units ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Unit:
    """Messages that must stay together, and where they start in the input."""

    start: int
    messages: tuple[Message, ...]


def units(messages: Sequence[Message]) -> list[Unit]:
    """Group `messages` into units, dropping orphan tool results and unanswered tool calls.

    An assistant request whose results are not all present keeps its text (without the calls)
    when it has any; a tool message that answers no preceding request is dropped.
    """
    grouped: list[Unit] = []
    index = 0
    count = len(messages)
    while index < count:
        message = messages[index]
        if message.role == "assistant" and message.tool_calls:
            wanted = {call.id for call in message.tool_calls}
            results: list[Message] = []
            cursor = index + 1
            while cursor < count and messages[cursor].role == "tool":
                if messages[cursor].tool_call_id in wanted:
                    results.append(messages[cursor])
                cursor += 1
            answered = {result.tool_call_id for result in results}
            if answered == wanted and len(results) == len(wanted):
                grouped.append(Unit(index, (message, *results)))
            elif message.content:
                grouped.append(Unit(index, (Message.assistant(message.content),)))
            index = cursor
        elif message.role == "tool":
            index += 1
        else:
            grouped.append(Unit(index, (message,)))
            index += 1
    return grouped


def flatten(groups: Sequence[Unit]) -> list[Message]:
    return [message for unit in groups for message in unit.messages]


def _size(groups: Sequence[Unit]) -> int:
    return sum(len(unit.messages) for unit in groups)


def newest_that_fit(
    groups: Sequence[Unit], budget: int, cost: Callable[[Unit], int] | None = None
) -> list[Unit]:
    """The longest suffix of `groups` within `budget`; never empty while `groups` is not.

    The newest unit is kept even when it alone is over budget: dropping the turn in progress
    would cost more than a long request.
    """
    measure = cost or (lambda unit: len(unit.messages))
    kept: list[Unit] = []
    used = 0
    for unit in reversed(groups):
        weight = measure(unit)
        if kept and used + weight > budget:
            break
        kept.append(unit)
        used += weight
    kept.reverse()
    return kept


def from_user_turn(groups: list[Unit]) -> list[Unit]:
    """Start the view on a user message when the kept units contain one."""
    for position, unit in enumerate(groups):
        if unit.messages[0].role == "user":
            return groups[position:]
    return groups


def _split_pinned(groups: Sequence[Unit]) -> tuple[list[Unit], list[Unit]]:
    pinned = [unit for unit in groups if unit.messages[0].role == "system"]
    rest = [unit for unit in groups if unit.messages[0].role != "system"]
    return pinned, rest


# --- strategies ----------------------------------------------------------------------------


class SlidingWindowCompaction:
    """Keep the newest units within `max_messages`; system messages are kept first."""

    name = Compaction.SLIDING_WINDOW.value
    summarizes = False

    async def compact(
        self,
        messages: Sequence[Message],
        max_messages: int,
        summary: Summary | None = None,
        user_id: str | None = None,
    ) -> Compacted:
        pinned, rest = _split_pinned(units(messages))
        room = max_messages - 1 if rest else max_messages
        if len(pinned) > room:
            pinned = pinned[len(pinned) - room :]
        kept = newest_that_fit(rest, max_messages - len(pinned)) if rest else []
        return Compacted(flatten(pinned) + flatten(from_user_turn(kept)))


def estimate_tokens(message: Message) -> int:
    """chars/4, counting tool-call arguments, plus a few tokens of per-message framing."""
    chars = len(message.content)
    for call in message.tool_calls:
        chars += len(call.name) + len(json.dumps(call.arguments, ensure_ascii=False))
    return chars // 4 + 4


class TokenWindowCompaction:
    """Keep the newest units that fit `budget_tokens` (and `max_messages`)."""

    name = Compaction.TOKEN_WINDOW.value
    summarizes = False

    def __init__(self, budget_tokens: int) -> None:
        if budget_tokens <= 0:
            raise ValueError(f"token budget must be positive, got {budget_tokens}")
        self.budget_tokens = budget_tokens

    async def compact(
        self,
        messages: Sequence[Message],
        max_messages: int,
        summary: Summary | None = None,
        user_id: str | None = None,
    ) -> Compacted:
        pinned, rest = _split_pinned(units(messages))
        budget = self.budget_tokens - sum(estimate_tokens(m) for m in flatten(pinned))
        by_tokens = newest_that_fit(rest, budget, lambda u: sum(map(estimate_tokens, u.messages)))
        by_count = newest_that_fit(by_tokens, max(max_messages - len(pinned), 1))
        return Compacted(flatten(pinned) + flatten(from_user_turn(by_count)))


Summarizer = Callable[[Summary | None, Sequence[Message], str | None], Awaitable[str]]
"""`(previous summary, messages to absorb, user id) -> the new summary's text`."""


def transcript(messages: Sequence[Message], line_chars: int | None = None) -> str:
    """`role: content` lines (tool requests shown by name), optionally cut to `line_chars`."""
    lines = []
    for message in messages:
        text = message.content
        if message.tool_calls:
            names = ", ".join(call.name for call in message.tool_calls)
            text = f"{text} [called {names}]".strip()
        if line_chars is not None and len(text) > line_chars:
            text = text[:line_chars] + "..."
        lines.append(f"{message.role}: {text}")
    return "\n".join(lines)


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_SUMMARY_CHARS else "..." + text[-MAX_SUMMARY_CHARS:]


def local_summary(previous: Summary | None, messages: Sequence[Message]) -> str:
    """The offline summary: the previous one, then one short line per absorbed message."""
    parts = [previous.text] if previous is not None and previous.text else []
    parts.append(transcript(messages, LOCAL_LINE_CHARS))
    return _bounded("\n".join(part for part in parts if part))


def model_summarizer(
    runtime: AgentRuntime, timeout: float, cap: UserDailyCap | None = None
) -> Summarizer:
    """Ask `runtime` for the summary; fail open to `local_summary` (error, timeout, blank, a
    user at the daily token cap). With `cap`, the call counts toward the user's day."""

    async def summarize(
        previous: Summary | None, messages: Sequence[Message], user_id: str | None = None
    ) -> str:
        conversation = transcript(messages)
        if previous is not None and previous.text:
            conversation = f"(summary so far) {previous.text}\n{conversation}"
        try:
            answer = await ask(
                runtime,
                system_prompt=SUMMARIZER_SYSTEM_PROMPT,
                prompt=SUMMARIZER_PROMPT.format(conversation=conversation),
                purpose="memory-summary",
                conversation_id="memory-summary",
                timeout=timeout,
                user_id=user_id,
                cap=cap,
            )
        except UsageLimitExceeded:
            log.info("the user reached the daily token limit: the summary is written locally")
            answer = None
        text = (answer or "").strip()
        if not text:
            log.warning("no summary from the model, using the local summary")
            return local_summary(previous, messages)
        return _bounded(text)

    return summarize


class SummarizingCompaction:
    """Fold all but the newest `recent_window` messages into one summary message."""

    name = Compaction.SUMMARIZING.value
    summarizes = True

    def __init__(
        self, summarizer: Summarizer | None = None, recent_window: int = DEFAULT_RECENT_WINDOW
    ) -> None:
        if recent_window <= 0:
            raise ValueError(f"recent window must be positive, got {recent_window}")
        self.summarizer = summarizer
        self.recent_window = recent_window

    async def compact(
        self,
        messages: Sequence[Message],
        max_messages: int,
        summary: Summary | None = None,
        user_id: str | None = None,
    ) -> Compacted:
        groups = units(messages)
        head = [summary.message()] if summary is not None else []
        if _size(groups) + len(head) <= max_messages or not groups:
            return Compacted(head + flatten(groups))
        window = min(self.recent_window, max(max_messages - 1, 1))
        recent = newest_that_fit(groups, window)
        old = [unit for unit in groups if unit.start < recent[0].start]
        if not old:
            return Compacted(head + flatten(recent))
        absorbed_messages = flatten(old)
        if self.summarizer is not None:
            text = await self.summarizer(summary, absorbed_messages, user_id)
        else:
            text = local_summary(summary, absorbed_messages)
        covered = (summary.covered if summary is not None else 0) + len(absorbed_messages)
        new_summary = Summary(text, covered)
        return Compacted(
            [new_summary.message(), *flatten(recent)],
            new_summary,
            absorbed=recent[0].start,
        )


def token_budget(settings: HarnessSettings, runtime: AgentRuntime | None) -> int:
    """The `token-window` budget, in tokens, strongest first.

    1. `context_window_tokens` when it was set explicitly (argument or environment);
    2. the context window of the runtime's model, when the runtime knows it
       (`ContextWindowRuntime`: the provider runtimes, for the models of
       `runtimes.windows.MODEL_CONTEXT_WINDOWS`);
    3. the `context_window_tokens` default.
    """
    if "context_window_tokens" in settings.model_fields_set:
        return settings.groups.memory.context_window_tokens
    candidate: object = runtime  # any runtime may opt in; AgentRuntime does not declare it
    if isinstance(candidate, ContextWindowRuntime):
        window = candidate.context_window
        if isinstance(window, int) and window > 0:
            return window
    return settings.groups.memory.context_window_tokens


def build_strategy(
    choice: Compaction,
    *,
    runtime: AgentRuntime | None,
    model_timeout: float,
    recent_window: int,
    context_tokens: int,
    cap: UserDailyCap | None = None,
) -> CompactionStrategy:
    """The strategy `compaction` names; summaries come from `runtime` when there is one (and
    count toward the user's daily tokens with `cap`)."""
    if choice is Compaction.SUMMARIZING:
        summarizer = model_summarizer(runtime, model_timeout, cap) if runtime is not None else None
        return SummarizingCompaction(summarizer, recent_window)
    if choice is Compaction.TOKEN_WINDOW:
        return TokenWindowCompaction(context_tokens)
    return SlidingWindowCompaction()
