"""`DurableWriter`: a durable run's frames and checkpoints written to its `RunStore`.

It groups writes as every `kernel.writer.StoreWriter` does (what comes while a write is in
flight goes in the next one), and adds what a durable journal needs:

- checkpoints, in order with the frames: a model turn or a call's result is written with the
  frame the kernel publishes right after it (`FOLLOWED`); the others (an approval, its answer,
  the history mark, `ENDED`) at once; a call's `started` mark with the next write, and not at
  all if the call's result comes first (`_moot`);
- a `tool-start` frame whose arguments are the model's own refers to the model turn's
  checkpoint instead of repeating them (`kernel.remote.REFERENCE`): a large argument is
  stored once;
- with a store that can write on the event loop (`contracts.RunStore.now`), writes are made
  right there, synchronously, at most once per `GROUP_SECONDS`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from json.encoder import encode_basestring_ascii
from typing import Any, TypeGuard

from .. import _events as events
from .._contracts import RunStoreNow
from .._events import Frame
from .._kernel.remote import REFERENCE
from .._kernel.writer import StoreWriter, encode
from .log import payload_size

FOLLOWED = ("model:", "result:")
"""Checkpoints the kernel publishes right before a frame: a model turn (then its calls'
`tool-start` or the run's end), a call's result (then its `tool-result`)."""
GROUP_SECONDS = 0.002
"""With a `RunStoreNow`, the least time between two writes of one run's frames: a burst of them
(an instant model, a batch of fast tools) shares writes; a frame waits at most this long."""
GROUP_BYTES = 128 * 1024
"""With a `RunStoreNow`, what waits for a write is written at once when its payloads reach this
size: a group of large payloads (50 KiB tool-call arguments, fast turns one after another) stays
within what the store writes on the event loop (the embedded one takes 256 KiB there). A larger
group went to the database thread, whose write waited for the GIL while the run went on (2 to
11 ms on a 2-core VM), with the frames behind it, the run's last one included."""
STARTED = "started:"
"""A call's mark that its handler is about to run: it matters on a restart only for a tool that
must not run twice, whose executor waits until it is stored (`flushed`); the others run again
either way, so theirs goes with the run's next write, and not at all if the call's result comes
before that write (`_StoreWriter.checkpoint`)."""
RESULT = "result:"
"""A call's result (`result:<turn>:<call>`, its `started:<turn>:<call>` mark before it)."""


def _writes_now(store: object) -> TypeGuard[RunStoreNow]:
    """Whether `store` is a `RunStoreNow`, asked once per class (an `isinstance` of a runtime
    protocol walks its members: once per run otherwise)."""
    kind = type(store)
    known = _NOW_KINDS.get(kind)
    if known is None:
        known = _NOW_KINDS[kind] = isinstance(store, RunStoreNow)
    return known


_NOW_KINDS: dict[type, bool] = {}

_BASE_TIME = asyncio.BaseEventLoop.time
"""asyncio's loop clock, `time.monotonic()` (unless a loop's class or the loop replaces it)."""

_STRING: Callable[[str], str] = encode_basestring_ascii
"""`encode` of a string: the JSON encoder's own string function (C in CPython), called
directly."""
_REFERENCE_KEY = _STRING(REFERENCE)


class DurableWriter(StoreWriter):
    """One durable run's writes to its store, grouped: what comes while a write is in flight
    goes in the next one. Readers are told each stored seq (`on_stored`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        store = self.store
        self._now = store if _writes_now(store) else None
        """The store, if it can write on the event loop (see `_kick`)."""
        self._encode = self._now.encode if self._now is not None else encode
        """How payloads are encoded for the store (JSON text, or the store's own form of it)."""
        self._true = self._encode(True)
        """`True` encoded once: a call's `started` mark when it runs with the model's own
        arguments (most calls)."""
        self._soon: asyncio.Handle | None = None
        """The write of what waits for a later one, while one is due (see `_kick`)."""
        self._next_write = 0.0
        """Loop time before which a publish waits for a later write (see `_kick`)."""
        self._bytes = 0
        """The size of the payloads waiting for a write (`GROUP_BYTES`)."""
        self._calls: dict[str, tuple[str, Any]] = {}
        """The last model turn's calls: id -> (its checkpoint key, its arguments)."""
        self._result: tuple[Any, str] | None = None
        """The last call result journalled, and its payload (see `_tool_result`)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The run's loop, once known (`asyncio.get_running_loop` costs a `getpid()` call)."""
        self._time: Callable[[], float] = time.monotonic
        """The run's loop's clock, once known (read only while a timer is armed)."""

    # The calls below run several times per model turn of every durable run: each costs what
    # its lines do (about 0.2 us a line inside a real turn), so they are kept short. Payloads
    # are encoded now, when published: what is journalled is what was sent, whatever changes
    # later.

    def frame(self, frame: Frame) -> None:
        event = frame.event
        if event == events.TOOL_START:
            payload = self._tool_start(frame.data)
        elif event == events.TOOL_RESULT:
            payload = self._tool_result(frame.data)
        else:
            payload = self._encode(frame.data)
        self._frames.append((frame.seq, event, payload))
        self._bytes += len(payload) if type(payload) is str else payload_size(payload)
        if event in events.TERMINAL or self._bytes >= GROUP_BYTES:
            self._kick(now=True)
        elif self._soon is None or self._time() >= self._next_write:
            self._kick()  # (else the armed timer, or the next publish past it, writes it)

    def checkpoint(self, key: str, value: Any) -> None:
        payload = self._true if value is True else self._encode(value)
        self._checkpoints.append((key, payload))
        self._bytes += len(payload) if type(payload) is str else payload_size(payload)
        if key.startswith(FOLLOWED):
            if key[0] == "m":  # `model:`
                if type(value) is dict or isinstance(value, Mapping):  # (no ABC check: a dict)
                    calls: dict[str, tuple[str, Any]] = {}
                    for call in value.get("calls") or ():  # (a loop: a comprehension is a call)
                        if len(call) == 3:
                            calls[str(call[0])] = (key, call[2])
                    self._calls = calls
            else:  # `result:`
                pending = self._checkpoints
                if len(pending) > 1:
                    started = STARTED + key[len(RESULT) :]
                    if pending[-2][0] == started:  # (most often: `_moot` without its call)
                        del pending[-2]
                    else:
                        self._moot(started)
                self._result = (value, payload)
            if self._bytes >= GROUP_BYTES:
                self._kick(now=True)
            elif self._soon is None:
                self._kick(hold=True)
        elif not key.startswith(STARTED):
            # A `started` mark goes with the next write (`flushed` writes it now for a caller
            # that waits). The others (an approval, its answer, the history mark, `ENDED`) are
            # written at once: `ENDED`, for one, must be stored before the stopped run unwinds
            # and writes anything.
            self._kick(now=True)

    def _tool_start(self, data: Mapping[str, Any]) -> str:
        """A `tool-start` frame's payload. When its arguments are the model's own, they refer
        to the model turn's checkpoint (`REFERENCE`) instead of repeating them. The kernel's
        shape of such a frame (call id, tool, arguments) is spelled out around its strings,
        each encoded alone: plain JSON, which every store takes, for under half the cost of
        building the referring dict and encoding it (once per call of every durable run)."""
        call_id, tool = data.get("toolCallId"), data.get("tool")
        known = self._calls.get(str(call_id))
        if known is None or data.get("arguments") != known[1]:
            return self._encode(data)
        if len(data) == 3 and type(call_id) is str and type(tool) is str:
            return (
                f'{{"toolCallId":{_STRING(call_id)},"tool":{_STRING(tool)},'
                f'"arguments":{{{_REFERENCE_KEY}:{_STRING(known[0])}}}}}'
            )
        return self._encode({**data, "arguments": {REFERENCE: known[0]}})

    def _tool_result(self, data: Mapping[str, Any]) -> str:
        """A `tool-result` frame's payload: the kernel's shape of it (call id, tool, result)
        spelled out around the JSON its result checkpoint got just before, when that is plain
        JSON text (a long result is in the store's own form, `RunStoreNow.encode`: encoded
        again here)."""
        call_id, tool = data.get("toolCallId"), data.get("tool")
        last = self._result
        if (
            last is not None
            and len(data) == 3
            and data.get("result") is last[0]
            and type(call_id) is str
            and type(tool) is str
            and last[1][:1] == '"'
        ):
            return f'{{"toolCallId":{_STRING(call_id)},"tool":{_STRING(tool)},"result":{last[1]}}}'
        return self._encode(data)

    def _moot(self, started: str) -> None:
        """Leave out the `started` mark still waiting for a write when its call's result is
        journalled: the result goes in the same write (one record, whole or not at all), and a
        restart that finds a result replays it without ever reading the mark. A mark someone
        waited for (a tool that must not run twice) was written before its tool ran. One
        payload fewer per model turn: a built-in's calls (most of them) finish within the
        group's time (`GROUP_SECONDS`)."""
        pending = self._checkpoints
        for index in range(len(pending) - 2, -1, -1):  # (the last one is the result)
            if pending[index][0] == started:
                del pending[index]
                return

    def _kick(self, *, hold: bool = False, now: bool = False) -> None:
        """Start writing what is pending, unless a write is in flight (it takes it next).

        With a `RunStoreNow`, the write is made right here on the loop, synchronously (one
        left for later runs while the run waits for something, often a tool in a worker
        thread, and the two fight over the GIL). Frames are written at most once per
        `GROUP_SECONDS`: one that comes sooner waits for the next publish past it (or a timer,
        if the run goes quiet). A `hold` (a checkpoint the kernel publishes right before a
        frame) waits for that frame, at the latest until the end of this step of the event
        loop (or the group's time); `now` writes at once.

        The timer is never cancelled: a write leaves it armed, and when it fires it writes
        what waits by then, arms the next group's if that is not due yet, or does nothing."""
        if self.lost:
            self._frames.clear()
            self._checkpoints.clear()
            return
        task = self._task
        if task is not None and not task.done():
            return
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            # asyncio's own clock is `time.monotonic`: read directly, it costs no Python call
            # (a publish reads it while a timer is armed); another loop's (uvloop's) is its own.
            base = type(loop).time is _BASE_TIME and "time" not in vars(loop)
            self._time = time.monotonic if base else loop.time
        if self._now is not None:
            if not now and (hold or self._time() < self._next_write):
                if self._soon is None:
                    self._soon = loop.call_at(self._next_write, self._drain_soon)
                return
            if self._write_now():
                self._next_write = self._time() + GROUP_SECONDS
                return
        self._bytes = 0  # (the task takes what waits)
        self._task = loop.create_task(self._drain(), name=f"journal:{self.run_id}")

    def _drain_soon(self) -> None:
        self._soon = None
        if not (self._frames or self._checkpoints or self._create is not None):
            return
        loop = self._loop
        assert loop is not None
        if self._time() < self._next_write:
            self._soon = loop.call_at(self._next_write, self._drain_soon)
            return
        self._kick(now=True)

    def _write_now(self) -> bool:
        """Write what is pending right here through `RunStoreNow`; `False` if the store
        could not (nothing written)."""
        if self._now is None:
            return False
        frames, checkpoints, create = self._frames, self._checkpoints, self._create
        try:
            if not self._now.append_now(
                self.run_id,
                frames,
                checkpoints,
                create=create,
                owner=self.owner,
                lease_seconds=self.lease_seconds,
            ):
                return False
        except Exception:
            return False  # `append` says it (and logs it) the usual way
        self._frames, self._checkpoints, self._create = [], [], None
        self._bytes = 0
        self.stored(frames)
        return True
