"""Context windows of well-known model families, for `token-window` compaction.

`token-window` keeps the newest history that fits the model's context budget. A provider runtime
knows its model's name, so it looks the window up here; a model this table does not know (a local
Ollama or vLLM model, an Azure deployment name) and the scripted runtime have none, and the
`context_window_tokens` setting applies instead. An explicitly set `context_window_tokens` always
wins over the table.

Matching is by the longest name prefix, case-insensitive, after any `provider/` routing prefix
(`openai/gpt-4o` through LiteLLM or OpenRouter is `gpt-4o`). The figures are the providers'
published context windows (input and output together), in tokens.
"""

from __future__ import annotations

from typing import Final

MODEL_CONTEXT_WINDOWS: Final[tuple[tuple[str, int], ...]] = (
    # OpenAI
    ("gpt-5", 400_000),
    ("gpt-5-chat", 128_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-3.5-turbo", 16_385),
    ("o1", 200_000),
    ("o1-mini", 128_000),
    ("o1-preview", 128_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    # Anthropic: every Claude 3, 3.5, 3.7, 4 and 4.5 model (the 1M-token beta of some Sonnet
    # models needs a beta header this runtime does not send).
    ("claude-", 200_000),
)
"""`(model-name prefix, context window in tokens)`; the longest matching prefix wins."""


def model_context_window(model: str | None) -> int | None:
    """The context window of `model` in tokens, or `None` when the table does not know it.

    Example:
        ```python
        model_context_window("claude-sonnet-4-5")  # 200_000
        model_context_window("gpt-4o-mini")  # 128_000
        model_context_window("llama3.1")  # None: the setting applies
        ```
    """
    if not model:
        return None
    name = model.strip().lower().rsplit("/", 1)[-1]
    best: tuple[str, int] | None = None
    for prefix, window in MODEL_CONTEXT_WINDOWS:
        if name.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, window)
    return best[1] if best is not None else None
