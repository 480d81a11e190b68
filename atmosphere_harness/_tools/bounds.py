"""Bounds on what one model message may ask of the executor, checked before anything runs.

A model (a buggy one, a prompt-injected one, a hostile script) can ask for 10,000 tool calls in
one message, or pass a 50 MB string as an argument. Taken as they come, the first floods the
client's stream and the conversation history (two frames and one stored result per call, and
every later request carries them all); the second is stored in the history in full and sent back
to the model on every later turn, so one bad message bricks the conversation. The loop screens
each message with `screen_calls` first:

- a message with more than `max_calls` calls runs none of them: it is kept as its first call
  only, answered with `too_many_tool_calls` (how many it asked for, and the limit), so the model
  can send them again in smaller batches and the history never holds the flood;
- a call whose arguments are larger than `max_argument_chars` characters, or nested deeper than
  `MAX_ARGUMENT_DEPTH`, does not run: its arguments are replaced (in the history and in its
  frames) by a short note of what was dropped, and it is answered with `invalid_arguments`;
- a tool name or call id longer than any real one is cut, so neither can carry the payload.

Everything else passes untouched, at the cost of one walk over each call's arguments that stops
as soon as a bound is crossed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .._limits import DEFAULT_MAX_ARGUMENT_CHARS as DEFAULT_MAX_ARGUMENT_CHARS
from .._limits import DEFAULT_MAX_TOOL_CALLS as DEFAULT_MAX_TOOL_CALLS
from .._runtimes.base import ToolCall, new_call_id
from .results import invalid_arguments, json_result

MAX_ARGUMENT_DEPTH = 64
"""Nesting of arguments beyond which a call is refused (JSON encoders recurse on it)."""
MAX_NAME_CHARS = 128
"""Tool names are at most 64 characters; a longer one is cut to this before it is echoed."""
MAX_ID_CHARS = 128
"""Longer call ids are replaced by a fresh one (ids are opaque; only their pairing matters)."""


@dataclass(frozen=True, slots=True)
class Screened:
    """A model message's calls after screening.

    `calls` is what the history keeps and the executor sees; `answers` maps the id of each call
    that must not run to the result the model gets instead.
    """

    calls: tuple[ToolCall, ...]
    answers: Mapping[str, str] = field(default_factory=dict)


def argument_size(value: object, limit: int) -> tuple[int, int]:
    """`(characters, depth)` of `value` as JSON would spell it, roughly; the walk stops early
    (and the figures are lower bounds) once either passes its bound."""
    chars = 0
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            chars += len(item) + 2
        elif isinstance(item, Mapping):
            deepest = max(deepest, depth)
            chars += 2 + 4 * len(item)
            if chars <= limit:
                for key, child in item.items():
                    chars += len(key) if isinstance(key, str) else 8
                    stack.append((child, depth + 1))
        elif isinstance(item, list | tuple):
            deepest = max(deepest, depth)
            chars += 2 + len(item)
            if chars <= limit:
                stack.extend((child, depth + 1) for child in item)
        else:
            chars += 8  # a number, a boolean or null: a few characters
        if chars > limit or deepest > MAX_ARGUMENT_DEPTH:
            break
    return chars, deepest


def screen_calls(calls: Sequence[ToolCall], *, max_calls: int, max_argument_chars: int) -> Screened:
    """Apply the bounds of the module docstring to one model message's calls."""
    if len(calls) > max_calls:
        first = _screen_one(calls[0], max_argument_chars)[0]
        message = (
            f"This message asked for {len(calls)} tool calls; at most {max_calls} run per "
            "message, so none of them ran. Send them again in batches of at most "
            f"{max_calls} calls per message."
        )
        answer = json_result(error="too_many_tool_calls", tool=first.name, message=message)
        return Screened((first,), {first.id: answer})
    kept: list[ToolCall] = []
    answers: dict[str, str] = {}
    for call in calls:
        screened, problem = _screen_one(call, max_argument_chars)
        kept.append(screened)
        if problem is not None:
            answers[screened.id] = problem
    return Screened(tuple(kept), answers)


def _screen_one(call: ToolCall, max_chars: int) -> tuple[ToolCall, str | None]:
    name = call.name if isinstance(call.name, str) else str(call.name)
    if len(name) > MAX_NAME_CHARS:
        name = name[:MAX_NAME_CHARS] + "…"
    call_id = call.id if isinstance(call.id, str) and len(call.id) <= MAX_ID_CHARS else None
    chars, depth = argument_size(call.arguments, max_chars)
    problem: str | None = None
    if chars > max_chars:
        problem = (
            f"arguments are too large: more than {max_chars} characters; send less per call "
            "(large content can be written in parts: write_file, then edit_file)"
        )
    elif depth > MAX_ARGUMENT_DEPTH:
        problem = f"arguments are nested more than {MAX_ARGUMENT_DEPTH} levels deep"
    if problem is None:
        if name == call.name and call_id is not None:
            return call, None
        return ToolCall(name, call.arguments, call_id or new_call_id()), None
    dropped = {"omitted": f"arguments not kept: {problem}"}
    screened = ToolCall(name, dropped, call_id or new_call_id())
    return screened, invalid_arguments(name, [problem])
