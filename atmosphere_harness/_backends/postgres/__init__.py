"""The PostgreSQL state backend (`ATMOSPHERE_POSTGRES_URL`, extra `[postgres]`).

PostgreSQL becomes the system of record every replica shares: conversation history, long-term
memory, plans, approvals and conversation locks; alone, it also carries the live fan-out (plan
updates and approval answers by `LISTEN/NOTIFY`). One `PostgresDatabase` (pool, schema, LISTEN
connection) serves every store; the host opens it before the primitives start.

| state | class |
|---|---|
| conversation locks | `PostgresConversationLocks` (advisory locks on one dedicated connection) |
| plans | `PostgresPlanStore` (one per owner root) |
| plan updates fan-out | `PostgresPlanBus` (events table + `LISTEN/NOTIFY`) |
| approvals | `PostgresApprovalStore` (answers wake the waiting replica by `NOTIFY`) |
| conversation history | `PostgresHistory` |
| long-term memory | `PostgresLongTermMemory` (`tsvector` search, unique facts) |
| workspace files | `PostgresWorkspaceStores` (rows, `PostgresAgentFileSystem`) |
| durable runs, or the frame feed | `PostgresRunStore` behind `durable.DurableRuns` |
| run status, cancel requests | `PostgresRunRegistry` (a row per run, `LISTEN/NOTIFY`) |

The workspace stores hold conversation workspaces and `/memories` when
`ATMOSPHERE_AI_WORKSPACE_BACKEND=postgres`, and `prefix=postgres:` composite routes always.

Without durable runs the same `PostgresRunStore` is the frame feed (`kernel.feed`): a run's
frames are shared, not journalled, so any replica can follow a run another one executes.
"""

from __future__ import annotations

from pathlib import Path

from ..._errors import BackendUnavailable, LeaseLost
from ..._settings import HarnessSettings, WorkspaceBackend
from ..state import StateBackends, shared_runs
from .approvals import PostgresApprovalStore
from .bus import PostgresPlanBus
from .control import PostgresRunRegistry
from .database import PostgresDatabase, redact
from .history import PostgresHistory
from .locks import PostgresConversationLocks
from .long_term import PostgresLongTermMemory
from .plans import PROTECT_SECONDS, PostgresPlanStore
from .prompt_keys import PostgresPromptKeys
from .runs import PostgresRunStore
from .stores import PostgresWorkspaceStores, owner_key
from .workspace import PostgresAgentFileSystem

# Runtime truth (`long-term-memory`) and reprs show the import path users know.
for _public in (
    PostgresLongTermMemory,
    PostgresHistory,
    PostgresPlanStore,
    PostgresAgentFileSystem,
    PostgresWorkspaceStores,
    PostgresRunStore,
):
    _public.__module__ = __name__


def postgres_backends(settings: HarnessSettings) -> StateBackends:
    """Every shared store on the PostgreSQL database `settings` name."""
    url = settings.groups.backends.postgres_url
    if not url:
        raise ValueError("postgres_backends needs settings with a postgres_url")
    database = PostgresDatabase(url)
    locks = PostgresConversationLocks(
        database, lease_seconds=settings.groups.backends.durable_runs_lease_seconds
    )
    workspace_root = settings.groups.filesystem.workspace_root
    idle = settings.groups.memory.idle_timeout
    protect = idle if idle > 0 else PROTECT_SECONDS

    def plan_store(root: Path) -> PostgresPlanStore:
        return PostgresPlanStore(
            database,
            owner_key(root, workspace_root),
            protect_seconds=protect,
        )

    files = PostgresWorkspaceStores(database, workspace_root, protect_seconds=protect)
    in_postgres = settings.groups.backends.workspace_backend is WorkspaceBackend.POSTGRES
    backends = StateBackends(
        state="postgres",
        events="postgres",
        locks=locks,
        plan_stores=plan_store,
        plan_bus=PostgresPlanBus(database),
        approvals=PostgresApprovalStore(database),
        run_registry=PostgresRunRegistry(database),
        history=PostgresHistory(database),
        long_term_memory=PostgresLongTermMemory(
            database, max_facts_per_user=settings.groups.memory.max_facts
        ),
        workspaces=files if in_postgres else None,
        route_stores={files.name: files},
        prompt_keys=PostgresPromptKeys(database),
        resources=[database, locks],
    )
    backends.runs = shared_runs(PostgresRunStore(database), settings)
    return backends


__all__ = [
    "BackendUnavailable",
    "LeaseLost",
    "PostgresAgentFileSystem",
    "PostgresApprovalStore",
    "PostgresConversationLocks",
    "PostgresDatabase",
    "PostgresHistory",
    "PostgresLongTermMemory",
    "PostgresPlanBus",
    "PostgresPlanStore",
    "PostgresRunRegistry",
    "PostgresRunStore",
    "PostgresWorkspaceStores",
    "owner_key",
    "postgres_backends",
    "redact",
]
