"""Provider resolution: priority, availability, failures."""

from __future__ import annotations

import pytest

from atmosphere_harness import HarnessSettings, InMemoryLongTermMemory, LongTermMemory
from atmosphere_harness._memory.providers import resolve_provider


class Provider:
    def __init__(
        self,
        name: str,
        priority: int,
        *,
        available: bool | Exception = True,
        store: LongTermMemory | Exception | None = None,
    ) -> None:
        self.name = name
        self.priority = priority
        self._available = available
        self._store = store if store is not None else InMemoryLongTermMemory()
        self.created = False

    def available(self, settings: HarnessSettings) -> bool:
        if isinstance(self._available, Exception):
            raise self._available
        return self._available

    def create(self, settings: HarnessSettings) -> LongTermMemory | None:
        self.created = True
        if isinstance(self._store, Exception):
            raise self._store
        return self._store


SETTINGS = HarnessSettings()


def test_no_provider_means_none() -> None:
    assert resolve_provider(SETTINGS, []) is None


def test_the_highest_priority_available_provider_wins() -> None:
    low, high, off = Provider("low", 10), Provider("high", 20), Provider("off", 99, available=False)
    found = resolve_provider(SETTINGS, [low, off, high])
    assert found is not None
    assert found[0] is high
    assert not low.created
    assert not off.created


def test_a_raising_availability_check_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    broken = Provider("broken", 99, available=RuntimeError("no idea"))
    fine = Provider("fine", 1)
    found = resolve_provider(SETTINGS, [broken, fine])
    assert found is not None
    assert found[0] is fine
    assert "availability check failed" in caplog.text


@pytest.mark.parametrize("failure", [RuntimeError("cannot connect"), "none"])
def test_a_failing_factory_falls_through(failure: object) -> None:
    bad = Provider("bad", 99)
    bad._store = failure if isinstance(failure, Exception) else None  # type: ignore[assignment]
    fine = Provider("fine", 1)
    found = resolve_provider(SETTINGS, [bad, fine])
    assert bad.created
    assert found is not None
    assert found[0] is fine
