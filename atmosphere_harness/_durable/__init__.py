"""Durable runs: the run journal that outlives the process, and how a resumed run replays.

- `journal.DurableRuns`: the kernel's live-run journal (`kernel.live`) written to a
  `contracts.RunStore` (`writer.DurableWriter`), resuming the runs a dead process left;
- `replay.DurableReplay`: the `contracts.RunHooks` that make a resumed run take what its first
  life journalled instead of redoing it (the kernel's loop knows nothing of it);
- `sqlite.SqliteRunStore` (with `log`): the embedded store.

`backends.resolve_backends` builds the journal on the chosen store and the assembly installs
its hooks; see `docs/durable-runs.md` for what is guaranteed.
"""

from __future__ import annotations

from .journal import DurableRuns
from .sqlite import SqliteRunStore

__all__ = ["DurableRuns", "SqliteRunStore"]
