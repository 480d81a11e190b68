"""State backends: every piece of state N replicas would have to share, chosen in one place.

`resolve_backends(settings)` is the only place that decides which implementation holds each kind
of shared state; the kernel and the primitives only see the protocols:

| state | protocol | embedded implementation (one process) |
|---|---|---|
| conversation locks | `contracts.ConversationLocks` | `kernel.locks.InProcessConversationLocks` |
| live runs and their frames | `contracts.RunJournal` | `kernel.journal.LiveRuns` (memory) |
| plans | `planning.PlanStore` | `planning.FilePlanStore` (JSON files under the owner root) |
| plan updates fan-out | `planning.PlanEventBus` | `planning.InProcessPlanBus` |
| approvals | `governance.approvals.ApprovalStore` | `ApprovalRegistry` (memory) |
| conversation history | `memory.history.HistoryBackend` | SQLite under `workspace_root` |
| long-term memory | `memory.LongTermMemory` | SQLite under `workspace_root` |
| workspace usage | `filesystem.usage.WorkspaceUsage` | `InProcessWorkspaceUsage` (this process) |

For history and long-term memory, `None` here means "the embedded SQLite file": the memory
primitive opens it under `workspace_root` when it starts (and an entry-point provider or an
explicit `long_term_memory=` still wins over it). A PostgreSQL or Redis backend fills every
field with its own classes; no primitive changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contracts import ConversationLocks, Resource, RunJournal
from ..errors import HarnessError
from ..filesystem.usage import PROCESS_USAGE, WorkspaceUsage
from ..governance.approvals import ApprovalRegistry, ApprovalStore
from ..kernel.journal import LiveRuns
from ..kernel.locks import InProcessConversationLocks
from ..log import get_logger
from ..memory.history import HistoryBackend
from ..memory.long_term import LongTermMemory
from ..planning.bus import InProcessPlanBus, PlanEventBus
from ..planning.store import FilePlanStore, PlanStore
from ..settings import HarnessSettings

log = get_logger(__name__)


@dataclass
class StateBackends:
    """The implementations one app uses for its shared state (see the module docstring)."""

    state: str
    """What holds durable state: `sqlite` (embedded), later `postgres` or `redis`."""
    events: str
    """What carries live fan-out: `local` (this process), later `postgres` or `redis`."""
    locks: ConversationLocks = field(default_factory=InProcessConversationLocks)
    runs: RunJournal = field(default_factory=LiveRuns)
    plan_stores: Callable[[Path], PlanStore] = FilePlanStore
    plan_bus: PlanEventBus = field(default_factory=InProcessPlanBus)
    approvals: ApprovalStore = field(default_factory=ApprovalRegistry)
    workspace_usage: WorkspaceUsage = PROCESS_USAGE
    history: HistoryBackend | None = None
    long_term_memory: LongTermMemory | None = None
    resources: list[Resource] = field(default_factory=list)
    """Pools and listeners the host opens at start-up (a bad URL fails there) and closes last."""

    def describe(self) -> dict[str, str]:
        """The `backends` block of `GET /api/console/info`."""
        return {"state": self.state, "events": self.events}


def resolve_backends(settings: HarnessSettings) -> StateBackends:
    """The backends `settings` ask for: PostgreSQL and/or Redis when their URL is set, else
    the embedded ones (see the module docstring)."""
    group = settings.groups.backends
    if group.postgres_url:
        try:
            from .postgres import postgres_backends  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            raise HarnessError(
                "ATMOSPHERE_POSTGRES_URL is set but the PostgreSQL backend is not available "
                f"({exc}); install atmosphere-harness[postgres]"
            ) from None
        backends: StateBackends = postgres_backends(settings)  # state="postgres", events="postgres"
        if group.redis_url:
            with_redis_events = _redis().with_redis_events
            backends = with_redis_events(backends, settings)  # events="redis"
        return backends
    if group.redis_url:
        redis_backends = _redis().redis_backends
        resolved: StateBackends = redis_backends(settings)  # state="redis", events="redis"
        return resolved
    return StateBackends(state="sqlite", events="local")


def _redis() -> Any:
    """The Redis backend module, or a start-up error naming the extra to install."""
    try:
        from . import redis
    except ImportError as exc:
        raise HarnessError(
            f"ATMOSPHERE_REDIS_URL is set but the Redis backend cannot load ({exc}); "
            "install atmosphere-harness[redis]"
        ) from None
    return redis
