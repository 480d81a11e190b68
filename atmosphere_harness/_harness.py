"""The `Harness` feature enum: the five primitives a harness can attach, plus `ALL`."""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Harness(enum.Enum):
    """One harness feature. `ALL` is a sentinel that expands to the five concrete features."""

    MEMORY = "memory"
    CACHE = "cache"
    DELEGATION = "delegation"
    PLANNING = "planning"
    FILESYSTEM = "filesystem"
    ALL = "all"

    @classmethod
    def concrete(cls) -> tuple[Harness, ...]:
        """The five real features, in declaration order (everything but `ALL`)."""
        return tuple(member for member in cls if member is not cls.ALL)

    @classmethod
    def expand(cls, declared: Iterable[Harness] | None) -> frozenset[Harness]:
        """Resolve a declared feature list: `ALL` becomes every concrete feature.

        `None` or an empty iterable gives the empty set; duplicates collapse; the result never
        contains `ALL`.
        """
        if not declared:
            return frozenset()
        features: set[Harness] = set()
        for value in declared:
            if not isinstance(value, Harness):
                raise TypeError(f"harness entries must be Harness members, got {value!r}")
            if value is cls.ALL:
                features.update(cls.concrete())
            else:
                features.add(value)
        return frozenset(features)

    @classmethod
    def ordered(cls, features: Iterable[Harness]) -> list[Harness]:
        """Features sorted in declaration order, for stable output."""
        chosen = set(features)
        return [member for member in cls.concrete() if member in chosen]
