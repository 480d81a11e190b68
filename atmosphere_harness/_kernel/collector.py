"""The garbage collector of a server process, set when the harness starts (`ProcessSettings`).

A process holding many runs in flight holds many long-lived objects, and Python's full
(generation-2) collection walks every tracked object alive: the pause grows with the runs in
flight and stalls every stream at once, for objects that are almost never garbage. Two settings
shorten or space those pauses: `ATMOSPHERE_GC_FREEZE` moves what was alive at start-up out of
the collector's view, `ATMOSPHERE_GC_FULL_THRESHOLD` makes full collections rarer.
"""

from __future__ import annotations

import gc

from .._settings import ProcessSettings

_frozen = False


def tune_collector(settings: ProcessSettings) -> None:
    """Apply `settings` to this process's collector (the freeze happens once per process)."""
    global _frozen
    if settings.gc_full_threshold is not None:
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, settings.gc_full_threshold)
    if settings.gc_freeze and not _frozen:
        _frozen = True
        gc.collect()  # start-up's garbage goes now, not into the permanent generation
        gc.freeze()
