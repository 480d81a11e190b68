"""The model/tool loop behind `session.stream(message)`.

Build the request (stable system prompt, history, tools), ask the model, run the tool calls it
asked for through the executor, feed the results back, and repeat until the model answers without
tools or the round limit stops it. The turn is written to the history at the end, whatever ended
it (an error, a cancellation), with no half tool pair; a run suspended by a shutdown or
discarded writes nothing (its next life, if any, writes the whole turn).

Each model call goes through the endpoint's `RunHooks` (`around_model`, outermost first) to the
innermost step: the endpoint's interceptors shape the request, the runtime answers, and the
answer is bounded (`tools.bounds`) before any hook sees it, so a flood of calls or a huge or
deeply nested argument reaches neither a journal, the history, the stream nor a tool. The loop
knows nothing of durability, limits, fallback or tracing: they are hooks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from .._cache import CacheHint, PromptCache
from .._contracts import Key, ModelStep, ProceedModel, ProceedRun, Run, RunHooks
from .._errors import LoopLimitExceeded
from .._log import get_logger
from .._runtimes.base import Message, ModelRequest, ModelResponse, ToolCall
from .._tools.bounds import screen_calls
from .executor import execute_calls

if TYPE_CHECKING:
    from .._tools.base import Tool

log = get_logger(__name__)

_TURNS: Key[int] = Key("kernel.model-turns")
"""Run state: the run's model turns so far (the number its hooks see)."""


async def run_loop(run: Run, message: str, *, cache_hint: CacheHint | None = None) -> str:
    """Run the loop for one user message; returns the model's final answer.

    `cache_hint` is the caller's: it wins over the endpoint's effective policy (a
    `CacheHint.none()` switches caching off for this prompt).
    """
    endpoint = run.endpoint
    user = Message.user(message)
    history = endpoint.history
    working: list[Message] = [*(await history.load(run) if history is not None else ()), user]
    turn: list[Message] = [user]
    if cache_hint is None and endpoint.cache_policy is not PromptCache.NONE:
        cache_hint = CacheHint(endpoint.cache_policy)
    try:
        for _ in range(endpoint.max_rounds):
            number = run.state.get(_TURNS, 0) + 1
            run.state.set(_TURNS, number)
            request = ModelRequest(
                system_prompt=endpoint.system_prompt,
                messages=tuple(working),
                tools=endpoint.tool_specs(),
                conversation_id=run.conversation_id,
                cache_hint=cache_hint,
            )
            step = ModelStep(run, request, endpoint.runtime, number)
            response = await call_model(endpoint.hooks, step)
            run.add_usage(response.usage)
            if not response.tool_calls:
                answer = Message.assistant(response.text)
                working.append(answer)
                turn.append(answer)
                return response.text
            asked = Message.assistant(response.text, response.tool_calls)
            working.append(asked)
            turn.append(asked)
            results = await execute_calls(response.tool_calls, run, response.refusals, number)
            for call, result in zip(response.tool_calls, results, strict=True):
                answered = Message.tool(call, result)
                working.append(answered)
                turn.append(answered)
        raise LoopLimitExceeded(
            f"stopped after {endpoint.max_rounds} model turns: the model kept calling tools "
            "(raise ATMOSPHERE_AI_MAX_TOOL_ROUNDS if this task needs more)"
        )
    finally:
        if not run.suspended and not run.discarded:
            await asyncio.shield(_finish_turn(run, complete_pairs(turn)))


def call_run(hooks: Sequence[RunHooks], run: Run, work: ProceedRun) -> Coroutine[Any, Any, None]:
    """`work` (the whole run) through every hook's `around_run`, outermost first: the awaitable
    of the outermost hook (no coroutine of its own: a run in flight keeps every frame it
    awaits through alive)."""
    return _next_run(hooks, 0, run, work)


def _next_run(
    hooks: Sequence[RunHooks], index: int, run: Run, work: ProceedRun
) -> Coroutine[Any, Any, None]:
    if index == len(hooks):
        return work()
    # The innermost hook proceeds to the run itself.
    proceed = work if index + 1 == len(hooks) else partial(_next_run, hooks, index + 1, run, work)
    return hooks[index].around_run(run, proceed)


def call_model(hooks: Sequence[RunHooks], step: ModelStep) -> Coroutine[Any, Any, ModelResponse]:
    """`step` through every hook's `around_model`, outermost first, then `_complete` (as
    `call_run`, no coroutine of its own)."""
    return _next_model(hooks, 0, step)


def _next_model(
    hooks: Sequence[RunHooks], index: int, step: ModelStep
) -> Coroutine[Any, Any, ModelResponse]:
    if index == len(hooks):
        return _complete(step)
    # The innermost hook proceeds to the model step itself.
    proceed: ProceedModel = (
        _complete if index + 1 == len(hooks) else partial(_next_model, hooks, index + 1)
    )
    return hooks[index].around_model(step, proceed)


async def _complete(step: ModelStep) -> ModelResponse:
    """The innermost model step: interceptors, the runtime, then the loop's bounds."""
    run = step.run
    endpoint = run.endpoint
    request = step.request
    for interceptor in endpoint.interceptors:
        request = await interceptor.before_request(run, request)
    response = await step.runtime.complete(request, on_text=run.session.send)
    if not response.tool_calls:
        return response
    # Bounded before anything is stored or run: a flood of calls or a huge argument must
    # not reach the history, the stream or the tools (see tools.bounds).
    screened = screen_calls(
        response.tool_calls,
        max_calls=endpoint.max_tool_calls,
        max_argument_chars=endpoint.max_tool_argument_chars,
    )
    if screened.calls is response.tool_calls or (
        screened.calls == response.tool_calls and not screened.answers
    ):
        return response
    return replace(response, tool_calls=screened.calls, refusals=screened.answers)


async def _finish_turn(run: Run, turn: Sequence[Message]) -> None:
    """Persist and announce the turn, even when it ended in an error or a cancellation."""
    endpoint = run.endpoint
    if endpoint.history is not None:
        await endpoint.history.append(run, recorded(turn, endpoint.tools))
    for interceptor in endpoint.interceptors:
        await interceptor.after_turn(run, turn)


def recorded(turn: Sequence[Message], tools: Mapping[str, Tool]) -> list[Message]:
    """The turn as conversation history keeps it: each tool's `history_arguments` applied.

    A call's result is the tool message right after its request, in the order of the calls
    (how the loop builds a turn); a call without its result is kept as the model sent it.
    """
    kept = list(turn)
    for index, message in enumerate(kept):
        if message.tool_calls:
            answers = kept[index + 1 : index + 1 + len(message.tool_calls)]
            calls = tuple(
                _kept_call(call, tools.get(call.name), answers[position : position + 1])
                for position, call in enumerate(message.tool_calls)
            )
            kept[index] = replace(message, tool_calls=calls)
    return kept


def _kept_call(call: ToolCall, tool: Tool | None, answer: Sequence[Message]) -> ToolCall:
    if (
        tool is None
        or tool.history_arguments is None
        or not answer
        or answer[0].tool_call_id != call.id
        or not isinstance(call.arguments, Mapping)
    ):
        return call
    try:
        arguments = tool.history_arguments(call.arguments, answer[0].content)
    except Exception:
        log.exception("history_arguments failed; keeping the call as sent", tool=tool.name)
        return call
    return call if arguments is call.arguments else replace(call, arguments=arguments)


def complete_pairs(messages: Sequence[Message]) -> list[Message]:
    """Drop a trailing assistant tool request whose results never arrived.

    Results are appended only once their whole batch has run, so an interrupted turn ends with
    the unanswered request; providers reject a tool call without a result, so it is not kept.
    """
    kept = list(messages)
    while kept and kept[-1].role == "assistant" and kept[-1].tool_calls:
        kept.pop()
    return kept
