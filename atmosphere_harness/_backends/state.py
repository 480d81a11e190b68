"""The set of state backends one app uses (`StateBackends`), and the run journal a shared
store gives (`shared_runs`). `backends.resolve_backends` fills it; the PostgreSQL and Redis
backends build theirs here without importing the package that chooses between them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._contracts import (
    ConversationLocks,
    ConversationOwners,
    PromptKeys,
    Resource,
    RunJournal,
    RunRegistry,
    RunStore,
    Scrubber,
    UserTokens,
)
from .._durable import DurableRuns
from .._filesystem.stores import WorkspaceStores
from .._filesystem.usage import PROCESS_USAGE, WorkspaceUsage
from .._governance.approvals import ApprovalRegistry, ApprovalStore
from .._kernel.budget import InProcessUserTokens
from .._kernel.control import InProcessRunRegistry
from .._kernel.live import LiveRuns
from .._kernel.locks import InProcessConversationLocks
from .._kernel.owners import InMemoryConversationOwners
from .._kernel.prompt_keys import InProcessPromptKeys
from .._memory.history import HistoryBackend
from .._memory.long_term import LongTermMemory
from .._planning.bus import InProcessPlanBus, PlanEventBus
from .._planning.store import FilePlanStore, PlanStore
from .._settings import HarnessSettings


@dataclass
class StateBackends:
    """The implementations one app uses for its shared state (see the module docstring)."""

    state: str
    """What holds durable state: `sqlite` (embedded), later `postgres` or `redis`."""
    events: str
    """What carries live fan-out: `local` (this process), later `postgres` or `redis`."""
    locks: ConversationLocks = field(default_factory=InProcessConversationLocks)
    runs: RunJournal = field(default_factory=LiveRuns)
    prompt_keys: PromptKeys = field(default_factory=InProcessPromptKeys)
    """Each prompt's `Idempotency-Key`: in the shared store when there is one."""
    run_registry: RunRegistry = field(default_factory=InProcessRunRegistry)
    """Every run's status and cancel requests (`GET P/runs/{runId}`, `.../cancel`)."""
    plan_stores: Callable[[Path], PlanStore] = FilePlanStore
    plan_bus: PlanEventBus = field(default_factory=InProcessPlanBus)
    approvals: ApprovalStore = field(default_factory=ApprovalRegistry)
    owners: ConversationOwners = field(default_factory=InMemoryConversationOwners)
    """Who owns each conversation (`resolve_backends` gives the embedded ones a SQLite table)."""
    workspace_usage: WorkspaceUsage = PROCESS_USAGE
    workspaces: WorkspaceStores | None = None
    """Where conversation workspaces and memory stores live; `None`: directories (`files`)."""
    route_stores: Mapping[str, WorkspaceStores] = field(default_factory=dict)
    """Stores a composite route may name as `prefix=<name>:` (`postgres`)."""
    history: HistoryBackend | None = None
    long_term_memory: LongTermMemory | None = None
    user_tokens: UserTokens = field(default_factory=InProcessUserTokens)
    """Each user's tokens per UTC day (`ATMOSPHERE_AI_USER_DAILY_TOKEN_LIMIT`)."""
    resources: list[Resource] = field(default_factory=list)
    """Pools and listeners the host opens at start-up (a bad URL fails there) and closes last."""
    scrubbers: list[Scrubber] = field(default_factory=list)
    """Stores whose files keep deleted rows' bytes, wiped after each deletion (the embedded
    SQLite file)."""

    def describe(self) -> dict[str, str]:
        """The `backends` block of `GET /api/console/info`."""
        workspace = "files" if self.workspaces is None else self.workspaces.name
        return {"state": self.state, "events": self.events, "workspace": workspace}


def shared_runs(store: RunStore, settings: HarnessSettings) -> LiveRuns:
    """The run journal of a scale-out backend whose run store is `store`.

    Durable runs journal every run there (resumed by any replica); without them the same store
    is the frame feed: other replicas follow a run from it (re-attaching anywhere), nothing is
    resumed.
    """
    group = settings.groups.backends
    if group.durable_runs:
        return DurableRuns(
            store,
            lease_seconds=group.durable_runs_lease_seconds,
            keep_seconds=group.durable_runs_keep_seconds,
        )
    return LiveRuns(
        feed=store,
        lease_seconds=group.durable_runs_lease_seconds,
        keep_seconds=group.durable_runs_keep_seconds,
    )
