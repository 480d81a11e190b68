"""`FallbackRuntime`: one model call tried on a chain of runtimes, in order.

A call that fails with a transient error (HTTP 429 or 5xx, a timeout, a lost connection, each
after the provider SDK's own retries) is made again, with the same request, on the next runtime
of the chain. A rejected request (400, 401, 403, 404...) never falls back: another model would
be sent the same bad request or the same bad key, and the error names what to fix.

A stream that already sent text to the client and then breaks is not restarted on another
model either: the client has shown part of an answer, and a second model's answer after it
would read as one garbled reply. The run ends with an `error` frame instead, after the text
that did arrive (the same as without a fallback chain).
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from dataclasses import replace

from .._errors import ModelError
from .base import AgentRuntime, AiCapability, ModelRequest, ModelResponse, TextSink
from .scripted import demo_turn

FallbackReporter = Callable[[str, str, str], Awaitable[None]]
"""Told `(from, to, reason)` each time a call moves on to the next runtime of a chain."""

MAX_REASON_CHARS = 300


def model_label(runtime: AgentRuntime) -> str:
    """`<provider>:<model>` for a runtime (just the provider's name when it has no model); a
    chain's is its primary's."""
    if isinstance(runtime, FallbackRuntime):
        return runtime.model
    model = getattr(runtime, "model", None)
    if isinstance(model, str) and model:
        return f"{runtime.name}:{model}"
    if runtime.name == "scripted":
        demo = getattr(runtime, "default", None) is demo_turn
        return "scripted:demo" if demo else "scripted"
    return runtime.name


def model_chain(runtime: AgentRuntime) -> list[str]:
    """The labels of the runtimes a call may reach, in order (no URL, no key)."""
    if isinstance(runtime, FallbackRuntime):
        return [label for member in runtime.runtimes for label in model_chain(member)]
    return [model_label(runtime)]


def is_transient(exc: BaseException) -> bool:
    """Whether another runtime may answer the same request: a `ModelError` that says so, or a
    bare timeout or connection error from a runtime of the application's own."""
    if isinstance(exc, ModelError):
        return exc.transient
    return isinstance(exc, TimeoutError | ConnectionError)


class FallbackRuntime:
    """A chain of runtimes: the first answers, the next ones stand in on transient failures.

    Example:
        ```python
        runtime = FallbackRuntime(
            OpenAIRuntime("gpt-4.1-mini"),
            AnthropicRuntime("claude-sonnet-4-5"),
        )
        app.include_router(create_harness_router(runtime=runtime))
        ```

    Each runtime keeps its own retries (`max_retries`): the chain moves on once they are spent.
    In a harness run, every move sends a `model-fallback` frame `{"from", "to", "reason"}`. The
    capabilities are those every runtime of the chain has, so a surface is never chosen that a
    fallback could not serve.
    """

    name = "fallback"

    def __init__(self, primary: AgentRuntime, *fallbacks: AgentRuntime) -> None:
        members = (primary, *fallbacks)
        for member in members:
            if not isinstance(member, AgentRuntime):
                raise TypeError(f"FallbackRuntime takes runtimes, got {member!r}")
        self.runtimes: tuple[AgentRuntime, ...] = members
        self.capabilities: frozenset[AiCapability] = frozenset.intersection(
            *(member.capabilities for member in members)
        )
        self.model = model_label(primary)
        """The primary's label (what answers when nothing fails)."""
        self._reporter: FallbackReporter | None = None

    @property
    def context_window(self) -> int | None:
        """The smallest known context window of the chain (a fallback must fit the history)."""
        windows = [getattr(member, "context_window", None) for member in self.runtimes]
        known = [window for window in windows if isinstance(window, int)]
        return min(known) if known else None

    def reporting(self, reporter: FallbackReporter) -> FallbackRuntime:
        """The same chain, telling `reporter` about each fallback (a run's frames)."""
        view = copy.copy(self)
        view._reporter = reporter
        return view

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        """The first runtime's answer, or the next one's after a transient failure."""
        last = len(self.runtimes) - 1
        for index, runtime in enumerate(self.runtimes):
            streamed = False

            async def relay(text: str) -> None:
                nonlocal streamed
                streamed = True
                if on_text is not None:
                    await on_text(text)

            try:
                response = await runtime.complete(request, on_text=relay)
            except Exception as exc:
                if index == last or streamed or not is_transient(exc):
                    raise
                following = self.runtimes[index + 1]
                if self._reporter is not None:
                    reason = (str(exc) or type(exc).__name__)[:MAX_REASON_CHARS]
                    await self._reporter(model_label(runtime), model_label(following), reason)
                continue
            if response.model is None:
                response = replace(response, model=model_label(runtime))
            return response
        raise AssertionError("unreachable: the chain has at least one runtime")

    async def aclose(self) -> None:
        """Close every runtime of the chain that can be closed (each closes only its own)."""
        for runtime in self.runtimes:
            close = getattr(runtime, "aclose", None)
            if close is not None:
                await close()
