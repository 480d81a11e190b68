"""State backends: every piece of state N replicas would have to share, chosen in one place.

`resolve_backends(settings)` is the only place that decides which implementation holds each kind
of shared state; the kernel and the primitives only see the protocols:

| state | protocol | embedded implementation (one process) |
|---|---|---|
| conversation locks | `contracts.ConversationLocks` | `kernel.locks.InProcessConversationLocks` |
| live runs, frames | `contracts.RunJournal` | `kernel.journal.LiveRuns` (+ `SqliteRunStore`) |
| plans | `planning.PlanStore` | `planning.FilePlanStore` (JSON files under the owner root) |
| plan updates fan-out | `planning.PlanEventBus` | `planning.InProcessPlanBus` |
| approvals | `governance.approvals.ApprovalStore` | `ApprovalRegistry` (memory) |
| conversation history | `memory.history.HistoryBackend` | SQLite under `workspace_root` |
| long-term memory | `memory.LongTermMemory` | SQLite under `workspace_root` |
| workspace usage | `filesystem.usage.WorkspaceUsage` | `SharedVolumeWorkspaceUsage` (flock) |
| workspace files | `filesystem.stores.WorkspaceStores` | `None`: directories under the owner root |
| `prefix=<backend>:` routes | `route_stores`, by backend name | none |

For history and long-term memory, `None` here means "the embedded SQLite file": the memory
primitive opens it under `workspace_root` when it starts (and an entry-point provider or an
explicit `long_term_memory=` still wins over it). A PostgreSQL or Redis backend fills every
field with its own classes; no primitive changes. Workspace files move to a backend only when
`ATMOSPHERE_AI_WORKSPACE_BACKEND` asks for it (`workspaces`); its stores are offered to
composite routes (`route_stores`) whenever the backend is configured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._contracts import ConversationLocks, Resource, RunJournal, RunStore
from .._durable import SqliteRunStore
from .._errors import BackendMisconfigured, BackendMissing
from .._filesystem.stores import WorkspaceStores
from .._filesystem.usage import PROCESS_USAGE, WorkspaceUsage
from .._governance.approvals import ApprovalRegistry, ApprovalStore
from .._kernel.journal import LiveRuns
from .._kernel.locks import InProcessConversationLocks
from .._memory.history import HistoryBackend
from .._memory.long_term import LongTermMemory
from .._planning.bus import InProcessPlanBus, PlanEventBus
from .._planning.store import FilePlanStore, PlanStore
from .._settings import HarnessSettings, WorkspaceBackend


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
    workspaces: WorkspaceStores | None = None
    """Where conversation workspaces and memory stores live; `None`: directories (`files`)."""
    route_stores: Mapping[str, WorkspaceStores] = field(default_factory=dict)
    """Stores a composite route may name as `prefix=<name>:` (`postgres`)."""
    history: HistoryBackend | None = None
    long_term_memory: LongTermMemory | None = None
    resources: list[Resource] = field(default_factory=list)
    """Pools and listeners the host opens at start-up (a bad URL fails there) and closes last."""

    def describe(self) -> dict[str, str]:
        """The `backends` block of `GET /api/console/info`."""
        workspace = "files" if self.workspaces is None else self.workspaces.name
        return {"state": self.state, "events": self.events, "workspace": workspace}


def resolve_backends(settings: HarnessSettings) -> StateBackends:
    """The backends `settings` ask for: PostgreSQL and/or Redis when their URL is set.

    | `postgres_url` | `redis_url` | state | events |
    |---|---|---|---|
    | set | unset | postgres | postgres (`LISTEN/NOTIFY`) |
    | set | set | postgres | redis |
    | unset | set | redis | redis |
    | unset | unset | sqlite (embedded) | local (this process) |
    """
    group = settings.groups.backends
    if group.workspace_backend is WorkspaceBackend.POSTGRES and not group.postgres_url:
        raise BackendMisconfigured(
            "ATMOSPHERE_AI_WORKSPACE_BACKEND=postgres keeps workspace files in PostgreSQL, but "
            "ATMOSPHERE_POSTGRES_URL is not set: set it, or use "
            "ATMOSPHERE_AI_WORKSPACE_BACKEND=files"
        )
    if group.postgres_url:
        try:
            from .postgres import postgres_backends
        except ImportError as exc:
            raise _missing("postgres", "ATMOSPHERE_POSTGRES_URL", exc) from None
        backends = postgres_backends(settings)
        if group.redis_url:
            try:
                from .redis import with_redis_events
            except ImportError as exc:
                raise _missing("redis", "ATMOSPHERE_REDIS_URL", exc) from None
            backends = with_redis_events(backends, settings)
        return backends
    if group.redis_url:
        try:
            from .redis import redis_backends
        except ImportError as exc:
            raise _missing("redis", "ATMOSPHERE_REDIS_URL", exc) from None
        return redis_backends(settings)
    backends = StateBackends(state="sqlite", events="local")
    if group.durable_runs:
        backends.runs = LiveRuns(
            SqliteRunStore.under(settings.groups.filesystem.workspace_root),
            lease_seconds=group.durable_runs_lease_seconds,
            keep_seconds=group.durable_runs_keep_seconds,
        )
    return backends


def shared_runs(store: RunStore, settings: HarnessSettings) -> LiveRuns:
    """The run journal of a scale-out backend whose run store is `store`.

    Durable runs journal every run there (resumed by any replica); without them the same store
    is the frame feed: other replicas follow a run from it (re-attaching anywhere), nothing is
    resumed.
    """
    group = settings.groups.backends
    return LiveRuns(
        store if group.durable_runs else None,
        feed=None if group.durable_runs else store,
        lease_seconds=group.durable_runs_lease_seconds,
        keep_seconds=group.durable_runs_keep_seconds,
    )


def _missing(extra: str, variable: str, error: ImportError) -> BackendMissing:
    return BackendMissing(
        f"{variable} is set but the {extra} backend cannot load ({error}): install "
        f"atmosphere-harness[{extra}]"
    )
