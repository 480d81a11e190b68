"""What a per-agent `model=` may be: a runtime, or a `"<provider>:<model>"` string.

Checked when a class is decorated, so a typo fails at import; the string becomes a runtime only
when the host starts (`runtimes.resolve.runtime_from_ref`), with the app's settings.
"""

from __future__ import annotations

from .base import AgentRuntime

MODEL_PROVIDERS = ("openai", "anthropic", "scripted")
"""The providers a `"<provider>:<model>"` string may name."""


def check_model_ref(ref: object) -> None:
    """Raise `ValueError` (at decoration time) for a model that can never resolve."""
    if isinstance(ref, AgentRuntime):
        return
    if not isinstance(ref, str):
        raise TypeError(f"a model is an AgentRuntime or a '<provider>:<model>' string, got {ref!r}")
    provider, sep, model = ref.partition(":")
    if not sep or provider not in MODEL_PROVIDERS or not model.strip():
        raise ValueError(
            f"invalid model {ref!r}: expected 'openai:<model>', 'anthropic:<model>' or "
            "'scripted:demo'"
        )
    if provider == "scripted" and model.strip() != "demo":
        raise ValueError(f"invalid model {ref!r}: the only scripted model is 'scripted:demo'")
