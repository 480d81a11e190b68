"""`StreamingSession`: the handle a `@prompt` method uses to talk to its client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _events as events
from .._cache import CacheHint
from .._contracts import FrameSink, Run
from .._errors import UsageLimitExceeded
from .._events import Event, Frame
from .loop import call_run, run_loop


class StreamingSession:
    """One prompt's stream of frames.

    `stream(message)` runs the harness-completed model loop (tools, plan, files, memory) and
    streams its text; `send`, `emit`, `complete` and `error` let a prompt method speak for
    itself. Once `complete` or `error` has been sent, later frames are dropped.
    """

    def __init__(self, run: Run, sink: FrameSink) -> None:
        self._run = run
        self._sink = sink
        self._seq = 0
        """The last seq sent."""
        self._closed = False
        self.last_text: str | None = None

    @property
    def conversation_id(self) -> str:
        return self._run.conversation_id

    @property
    def session_id(self) -> str:
        """The per-prompt id stamped on every frame."""
        return self._run.session_id

    @property
    def user_id(self) -> str | None:
        return self._run.user_id

    @property
    def closed(self) -> bool:
        return self._closed

    async def stream(self, message: str, *, cache_hint: CacheHint | None = None) -> str:
        """Run the model loop on `message`; returns the final answer (also streamed as text).

        `cache_hint` overrides the endpoint's prompt-cache policy for this prompt (its key, ttl,
        or `CacheHint.none()` to switch caching off).
        """
        run = self._run
        if getattr(run, "in_hooks", True):
            self.last_text = await run_loop(run, message, cache_hint=cache_hint)
            return self.last_text
        # A run no prompt method started (a `task` sub-agent's): its loop is the whole run.
        answer: list[str] = []

        async def loop() -> None:
            answer.append(await run_loop(run, message, cache_hint=cache_hint))

        run.in_hooks = True  # type: ignore[attr-defined]
        try:
            await call_run(run.endpoint.hooks, run, loop)
        finally:
            run.in_hooks = False  # type: ignore[attr-defined]
        self.last_text = answer[0]
        return self.last_text

    async def send(self, text: str) -> None:
        """Stream a piece of answer text."""
        if text and not self._closed:
            # `_frame`, written out (one call a token).
            self._seq += 1
            run = self._run
            await self._sink(
                Frame(events.TEXT, {"text": text}, run.session_id, run.conversation_id, self._seq)
            )

    async def emit(self, event: Event | str, data: Mapping[str, Any] | None = None) -> None:
        """Send any frame: an `Event`, or a type plus its data."""
        if isinstance(event, Event):
            await self._frame(event.type, event.data)
        else:
            await self._frame(event, data or {})

    async def complete(self, summary: str | None = None) -> None:
        """End the stream successfully; `usage` totals for the run ride along."""
        if self._closed:
            return
        data: dict[str, Any] = {"usage": self._run.usage.to_wire()}
        text = summary if summary is not None else self.last_text
        if text is not None:
            data["summary"] = text
        await self._frame(events.COMPLETE, data)
        self._closed = True

    async def error(self, exc: BaseException | str) -> None:
        """End the stream with an error the client can show."""
        if self._closed:
            return
        if isinstance(exc, BaseException):
            data = {"message": str(exc) or type(exc).__name__, "type": type(exc).__name__}
            if isinstance(exc, UsageLimitExceeded):
                data["limit"] = exc.limit
        else:
            data = {"message": exc, "type": "Error"}
        await self._frame(events.ERROR, data)
        self._closed = True

    async def _frame(self, kind: str, data: Mapping[str, Any]) -> None:
        if self._closed:
            return
        self._seq += 1
        await self._sink(
            Frame(kind, data, self._run.session_id, self._run.conversation_id, self._seq)
        )
