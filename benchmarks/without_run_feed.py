"""A replica without the run frame feed: the "before" side of the feed's per-turn cost.

With a PostgreSQL or Redis backend and durable runs off, every run shares its frames in the
backend (the frame feed, `atmosphere_harness._kernel.feed`) so any replica can follow it.
The benchmarks measure what that costs a turn by running, beside the normal server, one whose
run journal is built without the feed, as it was before the feed existed (in-memory only):

    python -m benchmarks.without_run_feed KIND    # tests.reliability.server KIND, minus the feed

`disable()` does the same inside a process that builds its own app (`scaleout_postgres.py`).
Benchmark-only: nothing in the library turns the feed off.
"""

from __future__ import annotations

import sys
from typing import Any

from atmosphere_harness._kernel import live as journal


def disable() -> None:
    """Every `LiveRuns` built from now on drops its frame feed (a durable store stays)."""
    original = journal.LiveRuns.__init__

    def without_feed(self: journal.LiveRuns, *args: Any, feed: Any = None, **kwargs: Any) -> None:
        original(self, *args, **kwargs)

    journal.LiveRuns.__init__ = without_feed  # type: ignore[method-assign]


if __name__ == "__main__":
    from tests.reliability.server import _serve

    disable()
    _serve(sys.argv[1])
