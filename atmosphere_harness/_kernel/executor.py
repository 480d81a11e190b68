"""The one tool executor every model turn goes through.

Order of work for one call, the same for every tool and every runtime:

1. unknown tool -> `unknown_tool` result;
2. argument validation against the schema -> `invalid_arguments` result;
3. admission hooks (governance) -> may answer instead of the tool (a denial), or replace the
   arguments (a policy's `Transform`; the new ones are validated again);
4. `tool-start` frame (unknown tools, invalid arguments and denied calls get their start and
   result frames too, so a client sees every call the model made and what it was told);
5. approval hook -> may answer instead of the tool, or replace the arguments: replaced ones are
   validated and pass the admission hooks again (step 2, then 3), so an approver's edit cannot
   slip past a policy; a denial then answers the call;
6. the handler, bounded by the tool's timeout; an exception becomes an error result;
7. result hooks (tool-output offload) reshape the text the model gets;
8. `tool-result` frame carrying exactly that text.

Nothing a tool does can crash the run: only cancellation of the run itself propagates.

Durable runs (a top-level run with a durable journal): every call's result is journalled before
its `tool-result` frame (`result`), and a call about to reach its handler first journals its
final arguments (`started`: `true` when they are the model's own, the common case, so a large
argument is not stored twice; for a user tool that is not `idempotent`, the executor waits
until that is stored, so the tool never runs twice). A resumed run replays journalled results
without running anything; a call that had `started` skips the gates (it was admitted and
approved) and runs again if it is a built-in or idempotent tool, or else gets `INTERRUPTED`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import _events as events
from .._errors import ToolArgumentError
from .._log import get_logger
from .._runtimes.base import ToolCall
from .._tools.base import Tool, ToolContext, render_result
from .._tools.results import invalid_arguments, json_result
from .._tools.validation import validate_arguments

if TYPE_CHECKING:
    from .run import RunContext

log = get_logger(__name__)

INTERRUPTED = json_result(
    status="interrupted",
    message="the server restarted while this tool ran; call it again if it is still needed",
)
"""What a user tool's call gets when a restart cut it off (it is never run twice)."""


async def execute_calls(
    calls: Sequence[ToolCall], run: RunContext, answers: Mapping[str, str] | None = None
) -> list[str]:
    """Run one model message's tool calls; results come back in the order of `calls`.

    Calls run one after another in the model's order, so a `read_file` sees the `write_file`
    before it. Consecutive calls to tools marked `concurrent` (sub-agent spawns, delegations) run
    together, and one failing never cancels the others. Consecutive calls to a tool with a
    `prefetch` (`read_file`) still run one after another, after one prefetch for all of them.
    Consecutive calls to a tool with a `batch` (`write_file`) each pass every gate in order
    (their `tool-start` frames come first), then run together in the model's order, and then
    get their results (and `tool-result` frames) in that order.
    A call whose id is in `answers` (the loop's bounds, `tools.bounds`) never runs: it gets its
    start and result frames with that answer, like any rejected call.
    """
    tools = run.endpoint.tools
    answers = answers or {}
    results: list[str] = [""] * len(calls)
    index = 0
    while index < len(calls):
        replayed = run.recall(calls[index], "result")
        if replayed is not None:
            results[index] = str(replayed)  # a resumed run: its first life had this result
            index += 1
            continue
        run.go_live()
        answer = answers.get(calls[index].id)
        if answer is not None:
            results[index] = await _rejected(run, calls[index], answer)
            index += 1
            continue
        tool = tools.get(calls[index].name)
        if tool is not None and tool.concurrent:
            end = index
            while end < len(calls):
                candidate = tools.get(calls[end].name)
                if candidate is None or not candidate.concurrent or calls[end].id in answers:
                    break
                if end > index and run.recall(calls[end], "result") is not None:
                    break
                end += 1
            batch = await asyncio.gather(*(execute_call(call, run) for call in calls[index:end]))
            results[index:end] = batch
            index = end
        elif tool is not None and (tool.prefetch is not None or tool.batch is not None):
            end = index + 1
            while end < len(calls) and calls[end].name == tool.name:
                if calls[end].id in answers or run.recall(calls[end], "result") is not None:
                    break
                end += 1
            if tool.batch is not None and end - index > 1:
                results[index:end] = await _execute_batch(tool, calls[index:end], run)
                index = end
                continue
            release = await _prefetch(tool, calls[index:end], run) if end - index > 1 else None
            try:
                for position in range(index, end):
                    results[position] = await execute_call(calls[position], run)
            finally:
                if release is not None:
                    release()
            index = end
        else:
            results[index] = await execute_call(calls[index], run)
            index += 1
    return results


async def _prefetch(
    tool: Tool, calls: Sequence[ToolCall], run: RunContext
) -> Callable[[], None] | None:
    """The tool's prefetch for `calls`, or `None` when it failed (the calls then run without)."""
    assert tool.prefetch is not None
    try:
        return await tool.prefetch([call.arguments for call in calls], run)
    except Exception:
        log.warning("tool prefetch failed; the calls run without it", tool=tool.name, exc_info=True)
        return None


async def execute_call(call: ToolCall, run: RunContext) -> str:
    """Run one tool call through every gate; always returns the model-facing text."""
    gated = await _gate(call, run)
    if isinstance(gated, str):
        return gated
    tool, arguments = gated
    return await _finish(tool, call, await _invoke(tool, call, arguments, run), run)


async def _execute_batch(tool: Tool, calls: Sequence[ToolCall], run: RunContext) -> list[str]:
    """Calls to a tool with a `batch`: every gate in order, one batch, then results in order."""
    results: list[str] = [""] * len(calls)
    ready: list[tuple[int, dict[str, Any]]] = []
    for position, call in enumerate(calls):
        gated = await _gate(call, run)
        if isinstance(gated, str):
            results[position] = gated
        else:
            ready.append((position, gated[1]))
    if ready:
        outcomes = await _invoke_batch(tool, [arguments for _, arguments in ready], run)
        for (position, _), outcome in zip(ready, outcomes, strict=True):
            results[position] = await _finish(tool, calls[position], outcome, run)
    return results


async def _gate(call: ToolCall, run: RunContext) -> str | tuple[Tool, dict[str, Any]]:
    """Every gate up to the handler: the tool and the arguments to run it with (the call's
    start is emitted and journalled), or the call's final text when it never reaches it."""
    endpoint = run.endpoint
    session = run.session
    tool = endpoint.tools.get(call.name)
    if tool is None:
        available = ", ".join(sorted(endpoint.tools)) or "none"
        rejected = json_result(
            error="unknown_tool",
            tool=call.name,
            message=f"Unknown tool '{call.name}'. Available tools: {available}",
        )
        return await _rejected(run, call, rejected)
    started = run.recall(call, "started")
    if started is not None:
        if isinstance(started, Mapping):
            return await _restarted(tool, call, dict(started), run)
        arguments, problems = validate_arguments(tool.parameters, call.arguments)
        if not problems:
            return await _restarted(tool, call, arguments, run)
    arguments, problems = validate_arguments(tool.parameters, call.arguments)
    if problems:
        return await _rejected(run, call, invalid_arguments(tool.name, problems))
    arguments, answer = await _admit(call, tool, arguments, run)
    if answer is not None:
        return await _rejected(run, call, answer, arguments)
    await session.emit(
        events.TOOL_START, {"toolCallId": call.id, "tool": tool.name, "arguments": arguments}
    )
    result: str | None = None
    if endpoint.approval_hook is not None:
        verdict = await endpoint.approval_hook(call, tool, arguments, run)
        if verdict is not None:
            if verdict.result is not None:
                result = verdict.result
            elif verdict.arguments is not None:
                arguments, problems = validate_arguments(tool.parameters, verdict.arguments)
                if problems:
                    result = invalid_arguments(tool.name, problems)
                else:
                    arguments, result = await _admit(call, tool, arguments, run)
    if result is not None:
        return await _finish(tool, call, result, run)
    # Journalled before the handler runs; for a tool that must not run twice, stored first.
    own = isinstance(call.arguments, Mapping) and arguments == call.arguments
    await run.checkpoint(call, "started", True if own else arguments, wait=_at_most_once(tool))
    return tool, arguments


def _at_most_once(tool: Tool) -> bool:
    # Built-ins (origin = their primitive) re-run; user and MCP tools (`mcp:<server>`) act
    # outside the harness, so a restart answers them `interrupted` unless they are idempotent.
    return (tool.origin == "user" or tool.origin.startswith("mcp:")) and not tool.idempotent


async def _restarted(
    tool: Tool, call: ToolCall, arguments: dict[str, Any], run: RunContext
) -> str | tuple[Tool, dict[str, Any]]:
    """A call a restart cut off while it ran: run it again, or answer `INTERRUPTED`."""
    if _at_most_once(tool):
        log.info("a user tool was cut off by a restart; answering interrupted", tool=tool.name)
        return await _finish(tool, call, INTERRUPTED, run)
    return tool, arguments


async def _finish(tool: Tool, call: ToolCall, result: str, run: RunContext) -> str:
    """Result hooks, then the journal, then the `tool-result` frame."""
    for reshape in run.endpoint.result_hooks:
        try:
            result = await reshape(call, tool, result, run)
        except Exception:
            log.exception("result hook failed; returning the result unchanged", tool=tool.name)
    await run.checkpoint(call, "result", result)
    await run.session.emit(
        events.TOOL_RESULT, {"toolCallId": call.id, "tool": tool.name, "result": result}
    )
    return result


async def _admit(
    call: ToolCall, tool: Tool, arguments: dict[str, Any], run: RunContext
) -> tuple[dict[str, Any], str | None]:
    """Every admission hook in turn: `(arguments to run with, None)`, or `(arguments, answer)`
    when a hook answers instead of the tool or rewrites the arguments into invalid ones."""
    for admit in run.endpoint.admission_hooks:
        answer = await admit(call, tool, arguments, run)
        if isinstance(answer, str):
            return arguments, answer
        if answer is not None:
            rewritten, problems = validate_arguments(tool.parameters, answer)
            if problems:
                return arguments, invalid_arguments(tool.name, problems)
            arguments = rewritten
    return arguments, None


async def _rejected(run: RunContext, call: ToolCall, result: str, arguments: Any = None) -> str:
    """Frames for a call that never reached its tool: the client sees what the model got.

    `arguments` are the ones the call was judged on (default: the model's, as it sent them)."""
    session = run.session
    if arguments is None:
        raw = call.arguments
        arguments = dict(raw) if isinstance(raw, Mapping) else raw
    await run.checkpoint(call, "result", result)
    await session.emit(
        events.TOOL_START, {"toolCallId": call.id, "tool": call.name, "arguments": arguments}
    )
    await session.emit(
        events.TOOL_RESULT, {"toolCallId": call.id, "tool": call.name, "result": result}
    )
    return result


async def _invoke(tool: Tool, call: ToolCall, arguments: dict[str, Any], run: RunContext) -> str:
    timeout = tool.timeout if tool.timeout is not None else run.endpoint.tool_timeout
    context = ToolContext(ToolCall(call.name, arguments, call.id), run)
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            value = await tool.handler(arguments, context)
        return render_result(value)
    except TimeoutError as exc:
        if not deadline.expired():
            return _error_result(tool, exc)
        return _timed_out(tool, timeout)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return _outcome(tool, exc)


async def _invoke_batch(
    tool: Tool, arguments: Sequence[dict[str, Any]], run: RunContext
) -> list[str]:
    """The tool's `batch` for calls that passed their gates: one text per call, in order."""
    assert tool.batch is not None
    timeout = tool.timeout if tool.timeout is not None else run.endpoint.tool_timeout
    deadline = asyncio.timeout(timeout * len(arguments))
    try:
        async with deadline:
            values = await tool.batch(arguments, run)
        if len(values) != len(arguments):
            raise RuntimeError(f"batch returned {len(values)} results for {len(arguments)} calls")
    except TimeoutError as exc:
        failed = _timed_out(tool, timeout) if deadline.expired() else _error_result(tool, exc)
        return [failed] * len(arguments)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return [_error_result(tool, exc)] * len(arguments)
    return [_outcome(tool, value) for value in values]


def _outcome(tool: Tool, value: Any) -> str:
    """The text of what a handler returned, or of the exception it raised."""
    if isinstance(value, ToolArgumentError):
        return invalid_arguments(tool.name, value.details)
    if isinstance(value, Exception):
        return _error_result(tool, value)
    return render_result(value)


def _timed_out(tool: Tool, timeout: float) -> str:
    seconds = int(timeout) if float(timeout).is_integer() else timeout
    return json_result(
        error="tool_timeout",
        tool=tool.name,
        timeoutSeconds=seconds,
        message=f"Tool execution exceeded the {seconds}s deadline and was cancelled",
    )


def _error_result(tool: Tool, exc: Exception) -> str:
    log.warning("tool raised; returning an error result", tool=tool.name, exc_info=exc)
    return json_result(error="tool_error", tool=tool.name, message=str(exc) or type(exc).__name__)
