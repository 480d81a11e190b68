"""State backends: every piece of state N replicas would have to share, chosen in one place.

`resolve_backends(settings)` is the only place that decides which implementation holds each kind
of shared state (for history and long-term memory, `None` is that decision: the embedded SQLite
file, below); the kernel and the primitives only see the protocols:

| state | protocol | embedded implementation (one process) |
|---|---|---|
| conversation locks | `contracts.ConversationLocks` | `kernel.locks.InProcessConversationLocks` |
| conversation owners | `contracts.ConversationOwners` | `SqliteConversationOwners` (SQLite file) |
| live runs, frames | `contracts.RunJournal` | `kernel.live.LiveRuns` (durable: `DurableRuns`) |
| run status, cancel requests | `contracts.RunRegistry` | `kernel.control.InProcessRunRegistry` |
| plans | `planning.PlanStore` | `planning.FilePlanStore` (JSON files under the owner root) |
| plan updates fan-out | `planning.PlanEventBus` | `planning.InProcessPlanBus` |
| approvals | `governance.approvals.ApprovalStore` | `ApprovalRegistry` (memory) |
| conversation history | `memory.history.HistoryBackend` | SQLite under `workspace_root` |
| long-term memory | `memory.LongTermMemory` | SQLite under `workspace_root` |
| workspace usage | `filesystem.usage.WorkspaceUsage` | `SharedVolumeWorkspaceUsage` (flock) |
| workspace files | `filesystem.stores.WorkspaceStores` | `None`: directories under the owner root |
| `prefix=<backend>:` routes | `route_stores`, by backend name | none |
| each user's tokens per day | `contracts.UserTokens` | `kernel.budget.InProcessUserTokens` |

For history and long-term memory, `None` here means "the embedded SQLite file": the memory
primitive opens it under `workspace_root` when it starts (and an entry-point provider or an
explicit `long_term_memory=` still wins over it). A PostgreSQL or Redis backend fills every
field with its own classes; no primitive changes. Workspace files move to a backend only when
`ATMOSPHERE_AI_WORKSPACE_BACKEND` asks for it (`workspaces`); its stores are offered to
composite routes (`route_stores`) whenever the backend is configured.
"""

from __future__ import annotations

from .._durable import DurableRuns, SqliteRunStore
from .._errors import BackendMisconfigured, BackendMissing
from .._settings import HarnessSettings, WorkspaceBackend
from .owners import SqliteConversationOwners
from .state import StateBackends, shared_runs

__all__ = [
    "BackendMisconfigured",
    "BackendMissing",
    "SqliteConversationOwners",
    "StateBackends",
    "resolve_backends",
    "shared_runs",
]


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
    owners = SqliteConversationOwners.under(settings.groups.filesystem.workspace_root)
    backends = StateBackends(
        state="sqlite", events="local", owners=owners, resources=[owners], scrubbers=[owners]
    )
    if group.durable_runs:
        backends.runs = DurableRuns(
            SqliteRunStore.under(settings.groups.filesystem.workspace_root),
            lease_seconds=group.durable_runs_lease_seconds,
            keep_seconds=group.durable_runs_keep_seconds,
        )
    return backends


def _missing(extra: str, variable: str, error: ImportError) -> BackendMissing:
    return BackendMissing(
        f"{variable} is set but the {extra} backend cannot load ({error}): install "
        f"atmosphere-harness[{extra}]"
    )
