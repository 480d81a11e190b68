"""The one tool executor every model turn goes through.

Each call first passes the endpoint's `RunHooks` (`around_tool`, outermost first), then, unless
a hook answered it, the gates in this order, the same for every tool and every runtime:

1. a call the loop's bounds refused (`tools.bounds`) -> answered with its refusal;
2. unknown tool -> `unknown_tool` result;
3. argument validation against the schema -> `invalid_arguments` result;
4. admission hooks (governance) -> may answer instead of the tool (a denial), or replace the
   arguments (a policy's `Transform`; the new ones are validated again);
5. `tool-start` frame (refused and unknown calls, invalid arguments and denied calls get their
   start and result frames too, so a client sees every call the model made and what it was
   told);
6. approval hook -> may answer instead of the tool, or replace the arguments: replaced ones are
   validated and pass the admission hooks again (step 3, then 4), so an approver's edit cannot
   slip past a policy; a denial then answers the call;
7. the step's `before_handler` (the run's `BEFORE_HANDLER`: a durable run journals that the
   call started), then the handler, bounded by the tool's timeout; an exception becomes an
   error result;
8. result hooks (tool-output offload) reshape the text the model gets;
9. once the `around_tool` hooks returned: the `tool-result` frame carrying exactly that text.

A hook may skip the gates (`ToolStep.admitted`) or the handler (`ToolStep.answer`). Nothing a
tool does can crash the run: only cancellation of the run (or a hook that raises to end it)
propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import _events as events
from .._contracts import (
    BEFORE_HANDLER,
    ProceedTool,
    Run,
    RunHooks,
    ToolOutcome,
    ToolStatus,
    ToolStep,
)
from .._errors import ToolArgumentError
from .._log import get_logger
from .._runtimes.base import ToolCall
from .._tools.base import Tool, ToolContext, render_result
from .._tools.results import invalid_arguments, json_result
from .._tools.validation import validate_arguments

if TYPE_CHECKING:
    from collections.abc import Awaitable

log = get_logger(__name__)

Ran = tuple[str, ToolStatus]
"""A handler's text for the model, and how it ended."""
Handler = Callable[[Tool, ToolStep, dict[str, Any]], "Awaitable[Ran]"]


async def execute_calls(
    calls: Sequence[ToolCall],
    run: Run,
    refusals: Mapping[str, str] | None = None,
    turn: int = 0,
) -> list[str]:
    """Run one model message's tool calls; results come back in the order of `calls`.

    Calls run one after another in the model's order, so a `read_file` sees the `write_file`
    before it. Consecutive calls to tools marked `concurrent` (sub-agent spawns, delegations) run
    together, and one failing never cancels the others. Consecutive calls to a tool with a
    `prefetch` (`read_file`) still run one after another, after one prefetch for all of them.
    Consecutive calls to a tool with a `batch` (`write_file`) each pass every gate in order
    (their `tool-start` frames come first), then run together in the model's order, and then
    get their results (and `tool-result` frames) in that order.
    A call whose id is in `refusals` (the loop's bounds, `tools.bounds`) never runs: it gets
    its start and result frames with that answer, like any rejected call.
    """
    tools = run.endpoint.tools
    refusals = refusals or {}
    before = run.state.get(BEFORE_HANDLER)
    steps = [
        ToolStep(
            run, call, tools.get(call.name), turn, refusals.get(call.id), before_handler=before
        )
        for call in calls
    ]
    results: list[str] = [""] * len(calls)
    index = 0
    while index < len(steps):
        first = steps[index]
        tool = first.tool if first.refusal is None else None
        end = index + 1
        while end < len(steps) and tool is not None and _groups(tool, steps[end]):
            end += 1
        group = steps[index:end]
        if tool is None or len(group) == 1:
            results[index] = await _execute(first)
        elif tool.concurrent:
            results[index:end] = await asyncio.gather(*(_execute(step) for step in group))
        elif tool.batch is not None:
            results[index:end] = await _execute_batch(tool, group)
        else:
            release = await _prefetch(tool, group)
            try:
                for position, step in enumerate(group, start=index):
                    results[position] = await _execute(step)
            finally:
                if release is not None:
                    release()
        index = end
    return results


def _groups(tool: Tool, step: ToolStep) -> bool:
    """Whether `step` joins the group of calls to `tool` that precedes it."""
    if step.refusal is not None or step.tool is None:
        return False
    if tool.concurrent:
        return step.tool.concurrent
    return (tool.prefetch is not None or tool.batch is not None) and step.tool is tool


async def _prefetch(tool: Tool, steps: Sequence[ToolStep]) -> Callable[[], None] | None:
    """The tool's prefetch for `steps`, or `None` when it failed (the calls then run without)."""
    if tool.prefetch is None:
        return None
    try:
        return await tool.prefetch([step.call.arguments for step in steps], steps[0].run)
    except Exception:
        log.warning("tool prefetch failed; the calls run without it", tool=tool.name, exc_info=True)
        return None


async def execute_call(call: ToolCall, run: Run, turn: int = 0) -> str:
    """Run one tool call through the hooks and every gate; returns the model-facing text."""
    tool = run.endpoint.tools.get(call.name)
    return await _execute(
        ToolStep(run, call, tool, turn, before_handler=run.state.get(BEFORE_HANDLER))
    )


async def _execute(step: ToolStep) -> str:
    outcome = await call_tool(step, _invoke)
    await _announce(step, outcome)
    return outcome.result


async def call_tool(step: ToolStep, handler: Handler) -> ToolOutcome:
    """`step` through every hook's `around_tool`, outermost first, then the gates and `handler`."""
    return await _next_tool(step.run.endpoint.hooks, 0, handler, step)


async def _next_tool(
    hooks: Sequence[RunHooks], index: int, handler: Handler, step: ToolStep
) -> ToolOutcome:
    if index == len(hooks):
        return await _gated(step, handler)
    # The innermost hook proceeds to the gates themselves: a coroutine fewer a tool call.
    proceed: ProceedTool = (
        partial(_gated, handler=handler)
        if index + 1 == len(hooks)
        else partial(_next_tool, hooks, index + 1, handler)
    )
    return await hooks[index].around_tool(step, proceed)


async def _gated(step: ToolStep, handler: Handler) -> ToolOutcome:
    """The innermost tool step: every gate (module docstring), the handler, the result hooks."""
    tool = step.tool
    if step.refusal is not None:
        return ToolOutcome(step.refusal, "refused", frames="start")
    if tool is None:
        return _unknown(step)
    if step.answer is not None:
        return await _finish(step, tool, step.answer, "interrupted")
    if step.admitted is not None:
        text, status = await handler(tool, step, dict(step.admitted))
        return await _finish(step, tool, text, status)
    arguments, problems = validate_arguments(tool.parameters, step.call.arguments)
    if problems:
        return ToolOutcome(invalid_arguments(tool.name, problems), "invalid", frames="start")
    arguments, answer, status = await _admit(step, tool, arguments)
    if answer is not None:
        return ToolOutcome(answer, status, frames="start", arguments=arguments)
    await step.run.session.emit(
        events.TOOL_START, {"toolCallId": step.call.id, "tool": tool.name, "arguments": arguments}
    )
    approval = step.run.endpoint.approval_hook
    if approval is not None:
        verdict = await approval(step.call, tool, arguments, step.run)
        if verdict is not None:
            if verdict.result is not None:
                return await _finish(step, tool, verdict.result, "denied")
            if verdict.arguments is not None:
                arguments, problems = validate_arguments(tool.parameters, verdict.arguments)
                if problems:
                    return await _finish(
                        step, tool, invalid_arguments(tool.name, problems), "invalid"
                    )
                arguments, answer, status = await _admit(step, tool, arguments)
                if answer is not None:
                    return await _finish(step, tool, answer, status)
    if step.before_handler is not None:
        waiting = step.before_handler(step, arguments)
        if waiting is not None:
            await waiting
    text, status = await handler(tool, step, arguments)
    return await _finish(step, tool, text, status)


def _unknown(step: ToolStep) -> ToolOutcome:
    tools = step.run.endpoint.tools
    available = ", ".join(sorted(tools)) or "none"
    text = json_result(
        error="unknown_tool",
        tool=step.call.name,
        message=f"Unknown tool '{step.call.name}'. Available tools: {available}",
    )
    return ToolOutcome(text, "unknown", frames="start")


async def _admit(
    step: ToolStep, tool: Tool, arguments: dict[str, Any]
) -> tuple[dict[str, Any], str | None, ToolStatus]:
    """Every admission hook in turn: `(arguments to run with, None, "ok")`, or `(arguments,
    answer, status)` when a hook answers instead of the tool or rewrites the arguments into
    invalid ones."""
    for admit in step.run.endpoint.admission_hooks:
        answer = await admit(step.call, tool, arguments, step.run)
        if isinstance(answer, str):
            return arguments, answer, "denied"
        if answer is not None:
            rewritten, problems = validate_arguments(tool.parameters, answer)
            if problems:
                return arguments, invalid_arguments(tool.name, problems), "invalid"
            arguments = rewritten
    return arguments, None, "ok"


async def _finish(step: ToolStep, tool: Tool, result: str, status: ToolStatus) -> ToolOutcome:
    """The result hooks reshape what the model gets."""
    for reshape in step.run.endpoint.result_hooks:
        try:
            result = await reshape(step.call, tool, result, step.run)
        except Exception:
            log.exception("result hook failed; returning the result unchanged", tool=tool.name)
    return ToolOutcome(result, status)


async def _announce(step: ToolStep, outcome: ToolOutcome) -> None:
    """The frames the call still owes its client (`ToolOutcome.frames`)."""
    if outcome.frames == "none":
        return
    call = step.call
    session = step.run.session
    name = step.tool.name if step.tool is not None else call.name
    if outcome.frames == "start":
        arguments = outcome.arguments
        if arguments is None:
            raw = call.arguments
            arguments = dict(raw) if isinstance(raw, Mapping) else raw
        await session.emit(
            events.TOOL_START, {"toolCallId": call.id, "tool": call.name, "arguments": arguments}
        )
        name = call.name
    await session.emit(
        events.TOOL_RESULT, {"toolCallId": call.id, "tool": name, "result": outcome.result}
    )


async def _invoke(tool: Tool, step: ToolStep, arguments: dict[str, Any]) -> Ran:
    """The handler, bounded by the tool's timeout."""
    call = step.call
    timeout = tool.timeout if tool.timeout is not None else step.run.endpoint.tool_timeout
    context = ToolContext(ToolCall(call.name, arguments, call.id), step.run)
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            value = await tool.handler(arguments, context)
        return render_result(value), "ok"
    except TimeoutError as exc:
        if not deadline.expired():
            return _error_result(tool, exc), "error"
        return _timed_out(tool, timeout), "timeout"
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return _outcome(tool, exc)


async def _execute_batch(tool: Tool, steps: Sequence[ToolStep]) -> list[str]:
    """Calls to a tool with a `batch`: each passes its hooks and gates in order (its
    `tool-start` first; a call that ends there gets its result at once, as any call), then the
    handlers of those that reached them run as one batch, then each of those finishes (result
    hooks, the rest of its hooks, its `tool-result`) in order."""
    batch = _Batch()
    results: list[str] = [""] * len(steps)
    parked: list[tuple[int, asyncio.Task[ToolOutcome]]] = []
    try:
        for position, step in enumerate(steps):
            task = asyncio.ensure_future(call_tool(step, batch.handler))
            if await batch.parked_at_handler(task):
                parked.append((position, task))
            else:
                results[position] = await _announced(step, task.result())
        await batch.run(tool, steps[0].run)
        for position, task in parked:
            batch.release_next()
            results[position] = await _announced(steps[position], await task)
        return results
    finally:
        for _, task in parked:
            task.cancel()


async def _announced(step: ToolStep, outcome: ToolOutcome) -> str:
    await _announce(step, outcome)
    return outcome.result


class _Batch:
    """Where the calls of one batch wait for each other: each call's `handler` parks its
    arguments (calls park one at a time, in order), the batch runs once every call parked or
    ended, and each parked call gets its own text when it is released (in the same order)."""

    def __init__(self) -> None:
        self.arguments: list[dict[str, Any]] = []
        self.texts: list[asyncio.Future[Ran]] = []
        self.gates: list[asyncio.Event] = []
        self._released = 0
        self._arrived = asyncio.Event()

    async def handler(self, tool: Tool, step: ToolStep, arguments: dict[str, Any]) -> Ran:
        text: asyncio.Future[Ran] = asyncio.get_running_loop().create_future()
        gate = asyncio.Event()
        self.arguments.append(arguments)
        self.texts.append(text)
        self.gates.append(gate)
        self._arrived.set()
        await gate.wait()
        return await text

    async def parked_at_handler(self, task: asyncio.Task[ToolOutcome]) -> bool:
        """Wait until the call parks at its handler (`True`) or ends without reaching it."""
        self._arrived.clear()
        arrived = asyncio.ensure_future(self._arrived.wait())
        try:
            await asyncio.wait({task, arrived}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            arrived.cancel()
        return not task.done()

    async def run(self, tool: Tool, run: Run) -> None:
        if not self.arguments:
            return
        texts = await _invoke_batch(tool, self.arguments, run)
        for future, text in zip(self.texts, texts, strict=True):
            future.set_result(text)

    def release_next(self) -> None:
        self.gates[self._released].set()
        self._released += 1


async def _invoke_batch(tool: Tool, arguments: Sequence[dict[str, Any]], run: Run) -> list[Ran]:
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
        failed = (
            (_timed_out(tool, timeout), "timeout")
            if deadline.expired()
            else (_error_result(tool, exc), "error")
        )
        return [failed] * len(arguments)  # type: ignore[list-item]
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return [(_error_result(tool, exc), "error")] * len(arguments)
    return [_outcome(tool, value) for value in values]


def _outcome(tool: Tool, value: Any) -> Ran:
    """The text of what a handler returned, or of the exception it raised."""
    if isinstance(value, ToolArgumentError):
        return invalid_arguments(tool.name, value.details), "invalid"
    if isinstance(value, Exception):
        return _error_result(tool, value), "error"
    return render_result(value), "ok"


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
