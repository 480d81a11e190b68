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


def tune_collector(process: ProcessSettings) -> None:
    """Apply `process` to this process's collector (the freeze happens once per process)."""
    global _frozen
    if process.gc_full_threshold is not None:
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, process.gc_full_threshold)
    if process.gc_freeze and not _frozen:
        _frozen = True
        gc.collect()  # start-up's garbage goes now, not into the permanent generation
        gc.freeze()
