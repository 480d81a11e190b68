"""Durable replay: a resumed run takes what its first life journalled instead of redoing it.

`DurableReplay` is the `contracts.RunHooks` the assembly installs when durable runs are on. It
acts only in a top-level run started on a durable journal (`DurableRun.bind` puts the run's
`Replay` in its state); sub-agents' and fleet members' runs pass through (their parent's call
is the unit that runs again).

What is journalled, by key (`<turn>` is the run's model turn, `<loop>` its `session.stream`):

- `model:<turn>`: each model answer, as soon as it is complete (in order with the frames);
- `started:<turn>:<call>`: a call about to reach its handler, with its final arguments (`true`
  when they are the model's own); for a tool that must not run twice it is stored before the
  handler runs;
- `result:<turn>:<call>`: each call's result, before its `tool-result` frame;
- `approval:` / `answer:<turn>:<call>`: an approval raised and its answer (the governance
  primitive, through the run's `contracts.CALL_JOURNAL`);
- `since:<loop>`: where the conversation's history stood as the loop loaded it;
  `history:<loop>`: that the loop's turn is in the history;
- `ended`: the run was stopped (its client left) or superseded: it is not resumed.
- `note:<key>`: a hook's own note on the run (`contracts.RUN_CHECKPOINTS`: tracing keeps the
  run's span there); notes alone do not make a resumed run replay.

A resumed run replays: a journalled model answer is returned without calling the runtime; a
journalled result without running anything (its frames are not sent again); a call that had
`started` skips the gates (it was admitted and approved) and runs again if it is a built-in or
an idempotent tool, or is answered `INTERRUPTED`. Frames of the replayed part are left out
until the run does the first thing its first life had not finished; the new ones continue the
first life's seq numbering.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from .. import _events as events
from .._contracts import (
    BEFORE_HANDLER,
    CALL_JOURNAL,
    PENDING_APPROVALS,
    RUN_CHECKPOINTS,
    FrameSink,
    HistoryMark,
    HistoryStore,
    Key,
    ModelStep,
    ProceedModel,
    ProceedTool,
    Run,
    RunHooks,
    ToolOutcome,
    ToolStep,
)
from .._errors import RunSuperseded
from .._events import Frame
from .._log import get_logger
from .._runtimes.base import Message, ModelResponse, ToolCall, Usage
from .._tools.results import json_result
from .._tools.validation import validate_arguments

if TYPE_CHECKING:
    from .._tools.base import Tool

log = get_logger(__name__)

ENDED = "ended"
"""Checkpoint key: the run's client stopped it, or it was superseded (it is not resumed)."""
STARTED = "started:"
RESULT = "result:"
NOTE = "note:"

INTERRUPTED = json_result(
    status="interrupted",
    message="the server restarted while this tool ran; call it again if it is still needed",
)
"""What a user tool's call gets when a restart cut it off (it is never run twice)."""

SUPERSEDED = "superseded: the conversation went on without this run; it was not resumed"


class Journalled(Protocol):
    """A durable run's journal as replay uses it (`durable.journal.DurableRun`)."""

    @property
    def checkpoints(self) -> Mapping[str, Any]:
        """What a resumed run's first life journalled, by key (empty in a first life)."""
        ...

    @property
    def start_seq(self) -> int:
        """The seq of the last frame the first life journalled (0 for a new run)."""
        ...

    async def checkpoint(self, key: str, value: Any, *, wait: bool = False) -> None: ...

    def note(self, key: str, value: Any) -> None:
        """`checkpoint` without waiting, as a plain call (no coroutine: a model turn makes
        two or three)."""
        ...

    async def publish(self, frame: Frame) -> None: ...


class Replay:
    """One durable run's journal as its hooks use it (the run's `contracts.CallJournal`)."""

    def __init__(self, run: Run, live: Journalled) -> None:
        self.run = run
        self.live = live
        self.checkpoints: Mapping[str, Any] = live.checkpoints
        """What the first life journalled (empty in a first life)."""
        self.replaying = any(not key.startswith(NOTE) for key in self.checkpoints)
        """A resumed run replays its first life (its frames are not sent again) until it does
        the first thing that life had not finished (`go_live`)."""
        self.turn = 0
        """The model turn whose tool calls run now."""
        self.loops = 0
        """The run's `session.stream` loops so far (their history marks)."""
        self.superseded = False
        self._seq = live.start_seq
        """The last seq sent: a resumed run's new frames continue its first life's numbering."""
        self.note = live.note
        """Journal a key and value in order with the frames, without waiting for the write."""

    def recalled(self, key: str) -> Any | None:
        return self.checkpoints.get(key) if self.checkpoints else None

    async def journal(self, key: str, value: Any, *, wait: bool = False) -> None:
        await self.live.checkpoint(key, value, wait=wait)

    def go_live(self) -> None:
        """The replay is over: from here on the run's frames are new and sent."""
        if self.replaying:
            self.replaying = False
            log.info(
                "resumed run caught up with its journal",
                endpoint=self.run.endpoint.path,
                conversation=self.run.conversation_id,
            )

    async def publish(self, frame: Frame) -> None:
        """A resumed run's frame sink: the replayed part's frames were sent by its first life."""
        if self.replaying:
            if frame.event not in events.TERMINAL:
                return
            self.go_live()
        self._seq += 1
        if frame.seq != self._seq:
            frame = Frame(
                frame.event, frame.data, frame.session_id, frame.conversation_id, self._seq
            )
        await self.live.publish(frame)

    # --- contracts.CallJournal ------------------------------------------------------------

    def recall(self, call: ToolCall, kind: str) -> Any | None:
        return self.recalled(f"{kind}:{self.turn}:{call.id}")

    async def record(self, call: ToolCall, kind: str, value: Any, *, wait: bool = False) -> None:
        await self.journal(f"{kind}:{self.turn}:{call.id}", value, wait=wait)

    # --- contracts.BeforeHandler ----------------------------------------------------------

    def started(self, step: ToolStep, arguments: Mapping[str, Any]) -> Awaitable[None] | None:
        """Journal that `step`'s call passed its gates and its handler runs now, with its final
        arguments (`true` when they are the model's own). For a tool that must not run twice,
        the executor waits until the mark is stored; for the others it goes with the run's
        next write (a plain call: no coroutine)."""
        tool = step.tool
        if tool is None or step.run is not self.run:
            return None
        call = step.call
        given = call.arguments
        # (`type` first: the ABC check of `isinstance` costs more than the rest of the line)
        own = (type(given) is dict or isinstance(given, Mapping)) and arguments == given
        value = True if own else dict(arguments)
        key = f"{STARTED}{step.turn}:{call.id}"
        if _at_most_once(tool):
            return self.journal(key, value, wait=True)
        self.note(key, value)
        return None


class _Notes:
    """A durable run's `contracts.RunCheckpoints`: hooks' notes, under `note:<key>`."""

    __slots__ = ("replay",)

    def __init__(self, replay: Replay) -> None:
        self.replay = replay

    def recall(self, key: str) -> Any | None:
        return self.replay.recalled(NOTE + key)

    async def record(self, key: str, value: Any) -> None:
        await self.replay.journal(NOTE + key, value)


_REPLAY: Key[Replay] = Key("durable.replay")


class DurableReplay(RunHooks):
    """The hooks of durable runs (module docstring); a no-op outside a durable run."""

    def bind(self, run: Run, live: Journalled) -> FrameSink:
        """Start replaying `run` on its journal (`contracts.LiveRunHandle.bind`)."""
        replay = Replay(run, live)
        run.state.set(_REPLAY, replay)
        run.state.set(CALL_JOURNAL, replay)
        run.state.set(RUN_CHECKPOINTS, _Notes(replay))
        run.state.set(BEFORE_HANDLER, replay.started)
        return replay.publish if replay.replaying else live.publish

    # `around_model` and `around_tool` run for every model turn and tool call of a durable
    # run: a first life (no checkpoints) takes the shortest way through them.

    async def around_model(self, step: ModelStep, proceed: ProceedModel) -> ModelResponse:
        replay = step.run.state.get(_REPLAY)
        if replay is None:
            return await proceed(step)
        key = f"model:{step.turn}"
        recalled = replay.checkpoints.get(key) if replay.checkpoints else None
        if recalled is not None:
            response = load_response(recalled)
        else:
            if replay.replaying:
                replay.go_live()
            response = await proceed(step)
            replay.note(key, dump_response(response))
        replay.turn = step.turn
        return response

    async def around_tool(self, step: ToolStep, proceed: ProceedTool) -> ToolOutcome:
        replay = step.run.state.get(_REPLAY)
        if replay is None:
            return await proceed(step)
        key = f"{step.turn}:{step.call.id}"
        if replay.checkpoints:
            replayed = replay.recalled(RESULT + key)
            if replayed is not None:
                return ToolOutcome(str(replayed), "replayed", frames="none")
            replay.go_live()
            tool = step.tool
            if tool is not None and step.refusal is None:
                restarted = _restarted(step, tool, replay.recalled(STARTED + key))
                if restarted is not None:
                    step = restarted
        # The call's `started` mark is the run's `BEFORE_HANDLER` (`Replay.started`), which the
        # executor gives the step: a first life's call passes here without a new step.
        outcome = await proceed(step)
        replay.note(RESULT + key, outcome.result)
        return outcome

    def wrap_history(self, history: HistoryStore) -> HistoryStore:
        return _JournalledHistory(history)


def _at_most_once(tool: Tool) -> bool:
    # Built-ins (origin = their primitive) re-run; user and MCP tools (`mcp:<server>`) act
    # outside the harness, so a restart answers them `interrupted` unless they are idempotent.
    return (tool.origin == "user" or tool.origin.startswith("mcp:")) and not tool.idempotent


def _restarted(step: ToolStep, tool: Tool, started: Any) -> ToolStep | None:
    """A call a restart cut off while it ran: run it again past its gates, or answer it
    `INTERRUPTED`; `None` when it had not started."""
    if started is None:
        return None
    if isinstance(started, Mapping):
        arguments: Mapping[str, Any] = dict(started)
    else:
        arguments, problems = validate_arguments(tool.parameters, step.call.arguments)
        if problems:
            return None
    if _at_most_once(tool):
        log.info("a user tool was cut off by a restart; answering interrupted", tool=tool.name)
        return replace(step, answer=INTERRUPTED)
    return replace(step, admitted=arguments)


class _JournalledHistory:
    """An endpoint's history store in durable runs: a resumed run writes its turn once, and
    is ended instead of resumed when its conversation went on without it."""

    def __init__(self, inner: HistoryStore) -> None:
        self.inner = inner

    async def load(self, run: Run) -> list[Message]:
        replay = run.state.get(_REPLAY)
        if replay is not None:
            replay.loops += 1
            if replay.superseded:
                raise RunSuperseded(SUPERSEDED)  # (a prompt method that caught it and went on)
            mark = run.endpoint.history_mark
            if mark is not None:
                await _check_superseded(run, replay, mark)
        return await self.inner.load(run)

    async def append(self, run: Run, messages: Any) -> None:
        replay = run.state.get(_REPLAY)
        if replay is None:
            await self.inner.append(run, messages)
            return
        written = f"history:{replay.loops}"
        if replay.recalled(written) is not None:
            return
        await self.inner.append(run, messages)
        # Stored before anything else happens: a restart must not write the turn twice.
        await replay.journal(written, 1, wait=True)


async def _check_superseded(run: Run, replay: Replay, history: HistoryMark) -> None:
    """Journal where the history stands as this loop starts, or, in a resumed life, end the
    run (`RunSuperseded`) if it moved since its first life journalled that.

    Read before the history is loaded: a turn another replica stores in between makes the
    mark differ later (the run is ended, conservatively) rather than slip past it. A loop whose
    turn is already written (`history:<n>`) only replays: the history grew by its own turn.
    """
    if replay.recalled(f"history:{replay.loops}") is not None:
        return
    key = f"since:{replay.loops}"
    newest = await history.newest_seq(run)
    was = replay.recalled(key)
    if was is None:
        await replay.journal(key, newest)
        return
    if was == newest:
        return
    replay.superseded = True
    run.discard()
    log.warning(
        "a resumed run's conversation went on without it; it is ended, not resumed",
        endpoint=run.endpoint.path,
        conversation=run.conversation_id,
        history_then=was,
        history_now=newest,
    )
    # Journalled at once: whatever happens next, no later life runs it again.
    await replay.journal(ENDED, "superseded", wait=True)
    closer = run.endpoint.services.get(PENDING_APPROVALS)
    if closer is not None:
        try:
            await closer.close_pending(run, replay.checkpoints)
        except Exception:
            log.warning("could not close a superseded run's approvals", exc_info=True)
    error = RunSuperseded(SUPERSEDED)
    # Closes the stream: a prompt method that catches the exception sends nothing more.
    await run.session.error(error)
    raise error


def dump_response(response: ModelResponse) -> dict[str, object]:
    """A model answer as a durable run journals it (JSON)."""
    data: dict[str, object] = {"text": response.text}
    if response.tool_calls:
        calls: list[list[object]] = []
        for call in response.tool_calls:  # (a loop: a comprehension is a call of its own)
            calls.append([call.id, call.name, call.arguments])
        data["calls"] = calls
    usage = response.usage
    if (
        usage.input_tokens
        or usage.output_tokens
        or usage.cache_read_tokens
        or usage.cache_write_tokens
    ):
        data["usage"] = usage.to_wire()
    if response.stop_reason is not None:
        data["stop"] = response.stop_reason
    if response.model is not None:
        data["model"] = response.model
    if response.refusals:
        data["refused"] = dict(response.refusals)
    return data


def load_response(data: Mapping[str, object]) -> ModelResponse:
    """`dump_response` read back."""
    calls = data.get("calls") or []
    usage = data.get("usage") or {}
    refused = data.get("refused") or {}
    model = data.get("model")
    stop = data.get("stop")
    assert isinstance(calls, list)
    assert isinstance(usage, dict)
    assert isinstance(refused, dict)
    return ModelResponse(
        text=str(data.get("text", "")),
        tool_calls=tuple(ToolCall(name, arguments, call_id) for call_id, name, arguments in calls),
        usage=Usage(
            input_tokens=int(usage.get("inputTokens", 0)),
            output_tokens=int(usage.get("outputTokens", 0)),
            cache_read_tokens=int(usage.get("cacheReadTokens", 0)),
            cache_write_tokens=int(usage.get("cacheWriteTokens", 0)),
        ),
        stop_reason=stop if isinstance(stop, str) else None,
        model=model if isinstance(model, str) else None,
        refusals={str(key): str(value) for key, value in refused.items()},
    )
