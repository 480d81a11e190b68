"""The model/tool loop behind `session.stream(message)`.

Build the request (stable system prompt, history, tools), ask the runtime, run the tool calls it
asked for through the executor, feed the results back, and repeat until the model answers without
tools or the round limit stops it.

Durable runs: each model answer is journalled (`model:<n>`, in order with the frames, so before
any frame that follows it is sent); a resumed run takes its journalled answers instead of asking
the model again, and asks the model only for the turns its first life had not finished. The
turn is written to history once (`history:<n>` marks it written), and not at all when a shutdown
suspends the run (its next life writes the whole turn).

A resumed run whose conversation went on without it is not resumed (`RunSuperseded`): as it
loads the history, a durable run journals the history's newest seq (`since:<n>`, in order before
its first model turn); its next life, if that turn's history is not written yet, reads the mark
again, and if the history changed meanwhile (a client that gave up on the cut-off stream re-sent
the prompt elsewhere and went on), it ends the run with an `error` frame instead: no model call,
nothing appended after the newer turns, and its journal is marked ended. A run whose first life
stored nothing (killed before its first write) has no mark and resumes as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from .._cache import CacheHint, PromptCache
from .._contracts import HistoryMark, PendingCloser
from .._errors import LoopLimitExceeded, RunSuperseded
from .._log import get_logger
from .._runtimes.base import Message, ModelRequest, ModelResponse, ToolCall, Usage
from .._tools.bounds import Screened, screen_calls
from .executor import execute_calls
from .journal import ENDED

if TYPE_CHECKING:
    from .._tools.base import Tool
    from .endpoint import HostedEndpoint
    from .run import RunContext

log = get_logger(__name__)


SUPERSEDED = "superseded: the conversation went on without this run; it was not resumed"


async def run_loop(run: RunContext, message: str, *, cache_hint: CacheHint | None = None) -> str:
    """Run the loop for one user message; returns the model's final answer.

    `cache_hint` is the caller's: it wins over the endpoint's effective policy (a
    `CacheHint.none()` switches caching off for this prompt).
    """
    endpoint = run.endpoint
    run.loops += 1
    loop_index = run.loops
    if run.root.superseded:
        raise RunSuperseded(SUPERSEDED)  # (a prompt method that caught it and went on)
    marked: object = endpoint.history
    if run.live is not None and isinstance(marked, HistoryMark):
        await _check_superseded(run, marked, loop_index)
    history = await endpoint.history.load(run) if endpoint.history is not None else []
    user = Message.user(message)
    working: list[Message] = [*history, user]
    turn: list[Message] = [user]
    if cache_hint is None and endpoint.cache_policy is not PromptCache.NONE:
        cache_hint = CacheHint(endpoint.cache_policy)
    try:
        for _ in range(endpoint.max_rounds):
            run.model_turns += 1
            turn_key = f"model:{run.model_turns}"
            recalled = run.recalled(turn_key)
            refused: Mapping[str, str] = {}
            if recalled is not None:
                response, refused = load_response(recalled), refused_calls(recalled)
            else:
                run.go_live()
                request = ModelRequest(
                    system_prompt=endpoint.system_prompt,
                    messages=tuple(working),
                    tools=endpoint.tool_specs(),
                    conversation_id=run.conversation_id,
                    cache_hint=cache_hint,
                )
                for interceptor in endpoint.interceptors:
                    request = await interceptor.before_request(run, request)
                response = await endpoint.runtime.complete(request, on_text=run.session.send)
                if run.live is not None:
                    # Journalled as screened (what runs and what is kept): a refused call's
                    # huge arguments are never encoded and stored, only why it was refused.
                    screened = _screen(response, endpoint)
                    screened_response = replace(response, tool_calls=screened.calls)
                    await run.record(turn_key, dump_response(screened_response, screened.answers))
            run.current_turn = run.model_turns
            run.add_usage(response.usage)
            if not response.tool_calls:
                answer = Message.assistant(response.text)
                working.append(answer)
                turn.append(answer)
                return response.text
            # Bounded before anything is stored or run: a flood of calls or a huge argument must
            # not reach the history, the stream or the tools (see tools.bounds).
            screened = _screen(response, endpoint)
            answers = {**screened.answers, **refused}
            asked = Message.assistant(response.text, screened.calls)
            working.append(asked)
            turn.append(asked)
            results = await execute_calls(screened.calls, run, answers)
            for call, result in zip(screened.calls, results, strict=True):
                answered = Message.tool(call, result)
                working.append(answered)
                turn.append(answered)
        raise LoopLimitExceeded(
            f"stopped after {endpoint.max_rounds} model turns: the model kept calling tools "
            "(raise ATMOSPHERE_AI_MAX_TOOL_ROUNDS if this task needs more)"
        )
    finally:
        if not run.suspended and not run.root.superseded:
            await asyncio.shield(_finish_turn(run, complete_pairs(turn), loop_index))


async def _check_superseded(run: RunContext, history: HistoryMark, loop_index: int) -> None:
    """Journal where the history stands as this loop starts, or, in a resumed life, end the
    run (`RunSuperseded`) if it moved since its first life journalled that.

    Read before the history is loaded: a turn another replica stores in between makes the
    mark differ later (the run is ended, conservatively) rather than slip past it. A loop whose
    turn is already written (`history:<n>`) only replays: the history grew by its own turn.
    """
    if run.recalled(f"history:{loop_index}") is not None:
        return
    key = f"since:{loop_index}"
    newest = await history.newest_seq(run)
    was = run.recalled(key)
    if was is None:
        await run.record(key, newest)
        return
    if was == newest:
        return
    root = run.root
    root.superseded = True
    log.warning(
        "a resumed run's conversation went on without it; it is ended, not resumed",
        endpoint=root.endpoint.path,
        conversation=root.conversation_id,
        history_then=was,
        history_now=newest,
    )
    # Journalled at once: whatever happens next, no later life runs it again.
    await run.record(ENDED, "superseded", wait=True)
    await _close_pending(root)
    error = RunSuperseded(SUPERSEDED)
    # Closes the stream: a prompt method that catches the exception sends nothing more.
    await root.session.error(error)
    raise error


async def _close_pending(root: RunContext) -> None:
    """Close the approvals the superseded run's first life left waiting (a shared approval
    store still lists them); a failure only leaves them to expire."""
    closer: object = root.endpoint.approval_hook
    if root.live is None or not isinstance(closer, PendingCloser):
        return
    try:
        await closer.close_pending(root, root.live.checkpoints)
    except Exception:
        log.warning("could not close a superseded run's approvals", exc_info=True)


async def _finish_turn(run: RunContext, turn: Sequence[Message], loop_index: int) -> None:
    """Persist and announce the turn, even when it ended in an error or a cancellation."""
    endpoint = run.endpoint
    written = f"history:{loop_index}"
    if endpoint.history is not None and run.recalled(written) is None:
        await endpoint.history.append(run, recorded(turn, endpoint.tools))
        # Stored before anything else happens: a restart must not write the turn twice.
        await run.record(written, 1, wait=True)
    for interceptor in endpoint.interceptors:
        await interceptor.after_turn(run, turn)


def _screen(response: ModelResponse, endpoint: HostedEndpoint) -> Screened:
    return screen_calls(
        response.tool_calls,
        max_calls=endpoint.max_tool_calls,
        max_argument_chars=endpoint.max_tool_argument_chars,
    )


def dump_response(
    response: ModelResponse, refused: Mapping[str, str] | None = None
) -> dict[str, object]:
    """A model answer as a durable run journals it (JSON), with the answers of the calls its
    screen refused (`tools.bounds`: their arguments were already replaced by a note)."""
    data: dict[str, object] = {"text": response.text}
    if response.tool_calls:
        data["calls"] = [[call.id, call.name, call.arguments] for call in response.tool_calls]
    if refused:
        data["refused"] = dict(refused)
    usage = response.usage.to_wire()
    if any(usage.values()):
        data["usage"] = usage
    if response.stop_reason is not None:
        data["stop"] = response.stop_reason
    return data


def refused_calls(data: Mapping[str, object]) -> Mapping[str, str]:
    """The answers `dump_response` journalled for the calls the screen refused."""
    refused = data.get("refused")
    return refused if isinstance(refused, dict) else {}


def load_response(data: Mapping[str, object]) -> ModelResponse:
    """`dump_response` read back."""
    calls = data.get("calls") or []
    usage = data.get("usage") or {}
    assert isinstance(calls, list)
    assert isinstance(usage, dict)
    return ModelResponse(
        text=str(data.get("text", "")),
        tool_calls=tuple(ToolCall(name, arguments, call_id) for call_id, name, arguments in calls),
        usage=Usage(
            input_tokens=int(usage.get("inputTokens", 0)),
            output_tokens=int(usage.get("outputTokens", 0)),
            cache_read_tokens=int(usage.get("cacheReadTokens", 0)),
            cache_write_tokens=int(usage.get("cacheWriteTokens", 0)),
        ),
        stop_reason=data.get("stop") if isinstance(data.get("stop"), str) else None,  # type: ignore[arg-type]
    )


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
