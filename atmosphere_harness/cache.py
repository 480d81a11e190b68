"""Prompt-cache policy names shared by the decorators, the settings and the runtimes."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class PromptCache(enum.Enum):
    """How hard a runtime should ask its provider to cache the stable prompt prefix."""

    NONE = "none"
    CONSERVATIVE = "conservative"
    AGGRESSIVE = "aggressive"

    @classmethod
    def parse(cls, value: str | PromptCache | None) -> PromptCache | None:
        """Case-insensitive parse; `None` for a missing or unknown value."""
        if value is None or isinstance(value, PromptCache):
            return value
        try:
            return cls(value.strip().lower())
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class CacheHint:
    """A per-request caching request: policy, optional bucketing key, optional ttl (seconds)."""

    policy: PromptCache
    key: str | None = None
    ttl: float | None = None

    @property
    def enabled(self) -> bool:
        return self.policy is not PromptCache.NONE

    def resolved_key(self, conversation_id: str | None) -> str | None:
        """The explicit key, else the conversation id; `None` when caching is off."""
        if not self.enabled:
            return None
        if self.key and self.key.strip():
            return self.key
        return conversation_id or None
