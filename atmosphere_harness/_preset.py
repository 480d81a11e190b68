"""Harness resolution (which features an endpoint gets) and runtime truth (what really attached).

`HarnessPreset.features_for` applies the precedence of Atmosphere's Java harness exactly:

1. kill switch (the app-wide flag present and not `true`) -> nothing;
2. an excluded path (exact match) -> nothing;
3. a non-empty annotation value -> that value, `ALL` expanded;
4. app-wide `true` upgrades a bare `ai_endpoint` (never an `agent(harness=())` opt-down);
5. otherwise nothing.

`RuntimeTruth` holds the per-primitive state strings shown at `GET /api/console/info`: one
app-wide map (seeded as Atmosphere seeds it) and one map per endpoint. States only move up:
an attach engine reports what it really attached, and a later endpoint that attached nothing never
overwrites an `ACTIVE` state another endpoint earned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._cache import PromptCache
from ._harness import Harness
from ._settings import HarnessSettings

CONVERSATION_MEMORY = "conversation-memory"
LONG_TERM_MEMORY = "long-term-memory"
PROMPT_CACHE_DEFAULT = "prompt-cache-default"
COMPACTION = "compaction"
DELEGATION = "delegation"
PLANNING = "planning"
FILESYSTEM = "filesystem"
SKILLS = "skills"
MCP = "mcp"
"""Per endpoint only: `{server: "ACTIVE(<n> tools)" | "INACTIVE(<reason>)"}`."""
DURABLE_RUNS = "durable-runs"
TRACING = "tracing"
IDENTITY = "identity"
"""Per endpoint only (the app-wide block keeps Atmosphere's keys): where the user comes from."""
MODEL = "model"
"""Per endpoint only: the model chain, `["<provider>:<model>", ...]`, the first asked first."""

DISABLED = "INACTIVE(disabled)"
NO_ENDPOINT = "INACTIVE(no-endpoint)"
NO_COORDINATOR = "INACTIVE(no-coordinator)"
NOT_ATTACHED = "INACTIVE(not-attached)"
ACTIVE = "ACTIVE"
IDENTITY_NONE = "NONE"
"""No identity source: every request is anonymous, so long-term memory keeps no facts."""
IDENTITY_CUSTOM = "CUSTOM"
"""The app overrides `get_user_id` (it wins over `user_id_header`)."""

FEATURE_KEYS: Mapping[Harness, tuple[str, ...]] = {
    Harness.MEMORY: (CONVERSATION_MEMORY, LONG_TERM_MEMORY),
    Harness.DELEGATION: (DELEGATION,),
    Harness.PLANNING: (PLANNING,),
    Harness.FILESYSTEM: (FILESYSTEM,),
}
"""The truth keys each feature owns (CACHE reports through `prompt-cache-default`)."""


def identity_of(settings: HarnessSettings) -> str:
    """The identity state the settings alone give: `HEADER(<name>)` or `NONE`."""
    header = settings.groups.admin.user_id_header
    return f"HEADER({header})" if header else IDENTITY_NONE


def is_active(state: str) -> bool:
    return state == ACTIVE or state.startswith(ACTIVE + "(")


class HarnessPreset:
    """Resolves each endpoint's feature set from the app-wide flag, exclusions and annotations."""

    def __init__(self, settings: HarnessSettings) -> None:
        self.settings = settings
        self.enabled = settings.groups.harness.enabled
        self.exclude_paths = frozenset(settings.groups.harness.exclude_paths)
        self.truth = RuntimeTruth(settings)

    @property
    def kill_switch(self) -> bool:
        return self.enabled is False

    def features_for(
        self,
        path: str | None,
        declared: Iterable[Harness] | None,
        is_agent_default: bool,
    ) -> frozenset[Harness]:
        """The resolved features for one endpoint; see the module docstring for the order."""
        if self.kill_switch:
            return frozenset()
        if path is None or path in self.exclude_paths:
            return frozenset()
        features = Harness.expand(declared)
        if features:
            return features
        if not is_agent_default and self.enabled is True:
            return Harness.expand((Harness.ALL,))
        return frozenset()


class RuntimeTruth:
    """The live app-wide and per-endpoint primitive states."""

    def __init__(self, settings: HarnessSettings) -> None:
        app_wide_on = settings.groups.harness.enabled is True
        feature_seed = NO_ENDPOINT if app_wide_on else DISABLED
        cache_seed = effective_cache_policy(None, settings, cache_feature=app_wide_on)
        self._app: dict[str, str] = {
            CONVERSATION_MEMORY: feature_seed,
            LONG_TERM_MEMORY: feature_seed,
            PROMPT_CACHE_DEFAULT: cache_seed.value,
            COMPACTION: settings.groups.memory.compaction.value,
            DELEGATION: NO_COORDINATOR if app_wide_on else DISABLED,
            PLANNING: feature_seed,
            FILESYSTEM: feature_seed,
            SKILLS: "CONVENTION",
            # The embedded journal; a scale-out backend reports its own store (`set_durable`).
            DURABLE_RUNS: "ACTIVE(sqlite)" if settings.groups.backends.durable_runs else DISABLED,
            # What the assembly installed (`set_tracing`); a host built by hand has none.
            TRACING: NOT_ATTACHED if settings.groups.tracing.enabled else DISABLED,
        }
        self._endpoints: dict[str, dict[str, str]] = {}
        self._details: dict[str, dict[str, dict[str, str]]] = {}
        self._models: dict[str, list[str]] = {}
        self._identity = identity_of(settings)
        self.resolved_any = False

    def app_wide(self) -> dict[str, str]:
        return dict(self._app)

    def endpoint(self, path: str) -> dict[str, Any]:
        state: dict[str, Any] = dict(self._endpoints.get(path, {}))
        for key, states in self._details.get(path, {}).items():
            state[key] = dict(states)
        if path in self._models:
            state[MODEL] = list(self._models[path])
        return state

    def seed_endpoint(
        self,
        path: str,
        features: frozenset[Harness],
        *,
        compaction: str,
        cache_policy: PromptCache,
        coordinator: bool,
    ) -> None:
        """Start an endpoint's own map: resolved features wait for their engine to report."""
        self.resolved_any = True
        state: dict[str, str] = {}
        for feature, keys in FEATURE_KEYS.items():
            for key in keys:
                if feature not in features:
                    state[key] = DISABLED
                elif feature is Harness.DELEGATION and not coordinator:
                    state[key] = NO_COORDINATOR
                else:
                    state[key] = NOT_ATTACHED
        state[PROMPT_CACHE_DEFAULT] = cache_policy.value
        state[COMPACTION] = compaction
        state[SKILLS] = self._app[SKILLS]
        state[DURABLE_RUNS] = self._app[DURABLE_RUNS]
        state[IDENTITY] = self._identity
        self._endpoints[path] = state
        if cache_policy is not PromptCache.NONE:
            self._app[PROMPT_CACHE_DEFAULT] = cache_policy.value

    def set_identity(self, state: str) -> None:
        """Where the user comes from (`identity`), on every endpoint's map.

        Only the web layer can tell (an app's `get_user_id` override lives on the app), so it
        sets this when the app starts and again when the truth is read.
        """
        self._identity = state
        for endpoint in self._endpoints.values():
            endpoint[IDENTITY] = state

    def set_durable(self, state: str) -> None:
        """What really journals runs (`durable-runs`), app-wide and on every endpoint's map."""
        self._app[DURABLE_RUNS] = state
        for endpoint in self._endpoints.values():
            endpoint[DURABLE_RUNS] = state

    def set_tracing(self, state: str) -> None:
        """Whether runs are traced (`tracing`: `ACTIVE(otel)`, `INACTIVE(no-opentelemetry)`,
        `INACTIVE(disabled)`); app-wide only: every endpoint of a host is traced alike."""
        self._app[TRACING] = state

    def report(self, path: str, key: str, state: str) -> None:
        """An attach engine reports what it really attached for the endpoint at `path`."""
        self._endpoints.setdefault(path, {})[key] = state
        self._report_app(key, state)

    def report_detail(self, path: str, key: str, states: Mapping[str, str]) -> None:
        """A per-endpoint map of states (e.g. `mcp`: one per server); never app-wide."""
        self._details.setdefault(path, {})[key] = dict(states)

    def report_models(self, path: str, chain: Sequence[str]) -> None:
        """The endpoint's model chain, `<provider>:<model>` each, the first asked first (per
        endpoint only; never a URL or a key)."""
        self._models[path] = list(chain)

    def _report_app(self, key: str, state: str) -> None:
        current = self._app.get(key)
        if current is not None and is_active(current) and not is_active(state):
            return
        if key == SKILLS and current is not None and _count(current) > _count(state):
            return  # app-wide: the most skills any endpoint has
        self._app[key] = state


def _count(state: str) -> int:
    """The number in `ACTIVE(<n>)`, else -1."""
    inner = state[len(ACTIVE) + 1 : -1] if state.startswith(ACTIVE + "(") else ""
    return int(inner) if inner.isdigit() else -1


def effective_cache_policy(
    annotation: PromptCache | None,
    settings: HarnessSettings,
    *,
    cache_feature: bool,
) -> PromptCache:
    """Effective prompt-cache policy: annotation -> setting (`none` suppresses) -> CACHE -> none.

    The `prompt_cache_default` setting is independent of the kill switch, as in Atmosphere.
    """
    if annotation is not None and annotation is not PromptCache.NONE:
        return annotation
    if settings.groups.harness.prompt_cache_default is not None:
        return settings.groups.harness.prompt_cache_default
    if cache_feature:
        return PromptCache.CONSERVATIVE
    return PromptCache.NONE
