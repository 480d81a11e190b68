"""Pick the model runtime from the settings (`LLM_RUNTIME`, `LLM_MODEL`, `LLM_BASE_URL`)."""

from __future__ import annotations

from collections.abc import Callable

from ..log import get_logger
from ..settings import HarnessSettings, RuntimeChoice
from .base import AgentRuntime
from .scripted import ScriptedRuntime

log = get_logger(__name__)

RuntimeFactory = Callable[[HarnessSettings], AgentRuntime]

FACTORIES: dict[RuntimeChoice, RuntimeFactory] = {
    RuntimeChoice.SCRIPTED: lambda settings: ScriptedRuntime.demo(),
}
"""Runtime factories by choice; provider runtimes register themselves here when importable."""


def configured_provider(settings: HarnessSettings) -> RuntimeChoice | None:
    """The provider a configured model points at, if any (`auto` mode)."""
    if not (settings.llm_model or settings.llm_base_url):
        return None
    hint = f"{settings.llm_base_url or ''} {settings.llm_model or ''}".lower()
    if "anthropic" in hint or "claude" in hint:
        return RuntimeChoice.ANTHROPIC
    return RuntimeChoice.OPENAI


def resolve_runtime(settings: HarnessSettings) -> AgentRuntime:
    choice = settings.llm_runtime
    if choice is RuntimeChoice.AUTO:
        provider = configured_provider(settings)
        if provider is None:
            log.warning(
                "no model configured (LLM_MODEL / LLM_BASE_URL); using the built-in scripted "
                "demo runtime"
            )
            return ScriptedRuntime.demo()
        choice = provider
    factory = FACTORIES.get(choice)
    if factory is None:
        raise RuntimeError(
            f"LLM_RUNTIME={choice.value} needs its provider SDK: "
            f"pip install 'atmosphere-harness[{choice.value}]'"
        )
    return factory(settings)
