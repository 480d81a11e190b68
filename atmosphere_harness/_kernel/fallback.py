"""The "model fallback" run hook: a `FallbackRuntime`'s moves become `model-fallback` frames.

The chain itself is the runtime (`runtimes.fallback.FallbackRuntime`), so it works the same
inside and outside a harness run; this hook only lends it the run's stream. It is the innermost
hook: durable replay, usage limits and tracing outside it see one model call with one answer,
whichever runtime of the chain gave it, so a durable run journals exactly one completed model
turn per turn.
"""

from __future__ import annotations

from dataclasses import replace

from .. import _events as events
from .._contracts import ModelStep, ProceedModel, RunHooks
from .._log import get_logger
from .._runtimes.base import ModelResponse
from .._runtimes.fallback import FallbackRuntime

log = get_logger(__name__)


class ModelFallbackHook(RunHooks):
    """Tells the client (and the log) each time a call moves on to the next model."""

    async def around_model(self, step: ModelStep, proceed: ProceedModel) -> ModelResponse:
        runtime = step.runtime
        if not isinstance(runtime, FallbackRuntime):
            return await proceed(step)
        run = step.run

        async def report(source: str, target: str, reason: str) -> None:
            log.warning(
                "model call failed; trying the next model of the chain",
                endpoint=run.endpoint.path,
                model=source,
                next=target,
                reason=reason,
            )
            await run.session.emit(
                events.MODEL_FALLBACK, {"from": source, "to": target, "reason": reason}
            )

        return await proceed(replace(step, runtime=runtime.reporting(report)))
