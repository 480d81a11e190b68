"""Prompt-cache policy names shared by the decorators, the settings and the runtimes.

A `CacheHint` is provider-neutral: "cache the stable prefix, this hard, under this key, for about
this long". Each runtime translates it to its wire (OpenAI `prompt_cache_key`, Anthropic
`cache_control` breakpoints); `cache_key_host_allowed` is the default-deny host gate for the
OpenAI-compatible field, which servers outside the allow-list may reject as unknown.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from urllib.parse import urlsplit

LONG_TTL_SECONDS = 3600.0
"""A hint whose ttl reaches this asks Anthropic for its one-hour cache."""


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
    """A per-request caching request: policy, optional bucketing key, optional ttl (seconds).

    Example:
        ```python
        await session.stream(message, cache_hint=CacheHint.aggressive(key="tenant-42"))
        ```
    """

    policy: PromptCache
    key: str | None = None
    ttl: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.policy, PromptCache):
            raise TypeError(f"CacheHint policy must be a PromptCache, got {self.policy!r}")
        if self.ttl is not None and not (math.isfinite(self.ttl) and self.ttl > 0):
            raise ValueError(f"CacheHint ttl must be a positive number of seconds, got {self.ttl}")

    @classmethod
    def none(cls) -> CacheHint:
        """Explicitly no caching (a caller hint that switches the endpoint default off)."""
        return cls(PromptCache.NONE)

    @classmethod
    def conservative(cls, *, key: str | None = None, ttl: float | None = None) -> CacheHint:
        return cls(PromptCache.CONSERVATIVE, key, ttl)

    @classmethod
    def aggressive(cls, *, key: str | None = None, ttl: float | None = None) -> CacheHint:
        return cls(PromptCache.AGGRESSIVE, key, ttl)

    @property
    def enabled(self) -> bool:
        return self.policy is not PromptCache.NONE

    @property
    def long_lived(self) -> bool:
        """AGGRESSIVE, or a ttl of an hour or more: ask for the provider's long cache."""
        if not self.enabled:
            return False
        return self.policy is PromptCache.AGGRESSIVE or (self.ttl or 0) >= LONG_TTL_SECONDS

    def resolved_key(self, conversation_id: str | None) -> str | None:
        """The explicit key, else the conversation id; `None` when caching is off."""
        if not self.enabled:
            return None
        if self.key and self.key.strip():
            return self.key
        return conversation_id or None


CACHE_KEY_HOSTS = frozenset({"api.openai.com", "localhost", "127.0.0.1"})
CACHE_KEY_HOST_SUFFIXES = (".openai.azure.com",)


def cache_key_host_allowed(base_url: str | None) -> bool:
    """The `auto` allow-list for `prompt_cache_key`: OpenAI, Azure OpenAI and loopback only.

    The host is parsed, not searched for: `https://evil.example/?localhost` or
    `https://api.openai.com.evil.example` are denied, where a substring match would allow them.
    """
    if not base_url or not base_url.strip():
        return False
    text = base_url.strip()
    try:
        host = urlsplit(text if "//" in text else "//" + text).hostname
    except ValueError:
        return False
    if not host:
        return False
    host = host.rstrip(".").lower()
    return host in CACHE_KEY_HOSTS or host.endswith(CACHE_KEY_HOST_SUFFIXES)
