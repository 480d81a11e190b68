"""Pick the model runtime from the settings (`LLM_RUNTIME`, `LLM_MODEL`, `LLM_BASE_URL`)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from urllib.parse import urlsplit

from .._log import get_logger
from .._settings import HarnessSettings, RuntimeChoice
from .base import AgentRuntime
from .refs import check_model_ref
from .scripted import ScriptedRuntime

log = get_logger(__name__)

RuntimeFactory = Callable[[HarnessSettings], AgentRuntime]

FACTORIES: dict[RuntimeChoice, RuntimeFactory] = {
    RuntimeChoice.SCRIPTED: lambda settings: ScriptedRuntime.demo(),
}
"""Runtime factories by choice; provider runtimes register themselves here when importable."""


def _openai(settings: HarnessSettings) -> AgentRuntime:
    from .openai import OpenAIRuntime

    return OpenAIRuntime.from_settings(settings)


def _anthropic(settings: HarnessSettings) -> AgentRuntime:
    from .anthropic import AnthropicRuntime

    return AnthropicRuntime.from_settings(settings)


# A provider runtime is registered only when its SDK is installed (the `openai` / `anthropic`
# extras), and imported only when chosen: the SDKs take a while to import.
if importlib.util.find_spec("openai") is not None:
    FACTORIES[RuntimeChoice.OPENAI] = _openai
if importlib.util.find_spec("anthropic") is not None:
    FACTORIES[RuntimeChoice.ANTHROPIC] = _anthropic


def configured_provider(settings: HarnessSettings) -> RuntimeChoice | None:
    """The provider a configured model points at, if any (`auto` mode).

    A base URL decides when there is one (a `claude-*` model behind an OpenAI-compatible proxy
    such as LiteLLM is still spoken to as OpenAI); otherwise the model name does.
    """
    if not (settings.groups.runtime.model or settings.groups.runtime.base_url):
        return None
    if settings.groups.runtime.base_url:
        host = (
            urlsplit(settings.groups.runtime.base_url.strip()).hostname
            or settings.groups.runtime.base_url
        )
        return RuntimeChoice.ANTHROPIC if "anthropic" in host.lower() else RuntimeChoice.OPENAI
    model = (settings.groups.runtime.model or "").lower()
    return RuntimeChoice.ANTHROPIC if "claude" in model else RuntimeChoice.OPENAI


def resolve_runtime(settings: HarnessSettings) -> AgentRuntime:
    choice = settings.groups.runtime.choice
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


def runtime_from_ref(ref: AgentRuntime | str, settings: HarnessSettings) -> AgentRuntime:
    """The runtime a per-agent `model=` names.

    A string's connection comes from the app's settings (`LLM_BASE_URL`, `LLM_API_KEY`,
    `LLM_TIMEOUT`, `LLM_MAX_RETRIES`, `LLM_MAX_TOKENS`) where they are set; unset ones leave
    the provider SDK to its own environment variables (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`...).
    """
    if isinstance(ref, AgentRuntime):
        return ref
    check_model_ref(ref)
    provider, _, model = ref.partition(":")
    model = model.strip()
    if provider == "scripted":
        return ScriptedRuntime.demo()
    choice = RuntimeChoice(provider)
    if choice not in FACTORIES:
        raise RuntimeError(
            f"model {ref!r} needs its provider SDK: pip install 'atmosphere-harness[{provider}]'"
        )
    group = settings.groups.runtime
    if choice is RuntimeChoice.OPENAI:
        from .openai import OpenAIRuntime

        return OpenAIRuntime(
            model,
            base_url=group.base_url,
            api_key=group.api_key,
            max_retries=group.max_retries,
            timeout=group.timeout,
            max_tokens=group.max_tokens,
            prompt_cache_key=group.prompt_cache_key,
            max_connections=group.max_connections,
        )
    from .anthropic import DEFAULT_MAX_TOKENS, AnthropicRuntime

    return AnthropicRuntime(
        model,
        base_url=group.base_url,
        api_key=group.api_key,
        max_retries=group.max_retries,
        timeout=group.timeout,
        max_tokens=group.max_tokens or DEFAULT_MAX_TOKENS,
        max_connections=group.max_connections,
    )
