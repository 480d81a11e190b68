"""Durable runs: the embedded `RunStore` (SQLite) behind a durable run journal.

The journal itself (`kernel.journal.LiveRuns`) and the replay rules (`kernel.run`, `kernel.loop`,
`kernel.executor`) are the kernel's; this package only stores. `backends.resolve_backends`
chooses the store; see `docs/durable-runs.md` for what is guaranteed.
"""

from __future__ import annotations

from .sqlite import SqliteRunStore

__all__ = ["SqliteRunStore"]
