"""Long-term memory providers, discovered through the `atmosphere_harness.long_term_memory`
entry-point group.

A package offers a store by declaring an entry point that loads a `LongTermMemoryProvider` (an
instance, or a class the harness instantiates with no arguments):

```toml
[project.entry-points."atmosphere_harness.long_term_memory"]
redis = "my_package.memory:RedisProvider"
```

Resolution, once per app: the store passed to `create_harness_router(long_term_memory=...)`
wins; then the available provider with the highest `priority`; then the built-in SQLite store in
the workspace database. A provider whose availability check or factory raises (or returns
`None`) is logged and skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Protocol, runtime_checkable

from .._log import get_logger
from .._settings import HarnessSettings
from .long_term import LongTermMemory

log = get_logger(__name__)

ENTRY_POINT_GROUP = "atmosphere_harness.long_term_memory"


@runtime_checkable
class LongTermMemoryProvider(Protocol):
    """A pluggable long-term memory backend."""

    name: str
    priority: int

    def available(self, settings: HarnessSettings) -> bool:
        """Whether the backend can run here (e.g. its URL is configured)."""
        ...

    def create(self, settings: HarnessSettings) -> LongTermMemory | None: ...


def load_providers(points: Iterable[EntryPoint] | None = None) -> list[LongTermMemoryProvider]:
    """Every provider the entry points name, skipping (and logging) the ones that fail to load."""
    found: list[LongTermMemoryProvider] = []
    for point in points if points is not None else entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = point.load()
            provider = loaded() if isinstance(loaded, type) else loaded
        except Exception as exc:
            log.warning(
                "long-term memory provider failed to load", entry_point=point.name, error=str(exc)
            )
            continue
        if not isinstance(provider, LongTermMemoryProvider):
            log.warning("entry point is not a long-term memory provider", entry_point=point.name)
            continue
        found.append(provider)
    return found


def resolve_provider(
    settings: HarnessSettings, providers: Iterable[LongTermMemoryProvider]
) -> tuple[LongTermMemoryProvider, LongTermMemory] | None:
    """The store of the highest-priority available provider that produces one."""
    usable: list[LongTermMemoryProvider] = []
    for provider in providers:
        try:
            if provider.available(settings):
                usable.append(provider)
        except Exception as exc:
            log.warning(
                "long-term memory provider availability check failed; skipping it",
                provider=getattr(provider, "name", repr(provider)),
                error=str(exc),
            )
    for provider in sorted(usable, key=lambda p: p.priority, reverse=True):
        try:
            store = provider.create(settings)
        except Exception as exc:
            log.warning(
                "long-term memory provider failed to create its store",
                provider=provider.name,
                error=str(exc),
            )
            continue
        if store is None:
            log.warning("long-term memory provider returned no store", provider=provider.name)
            continue
        return provider, store
    return None
