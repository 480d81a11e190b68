"""HarnessPreset.features_for: Atmosphere's precedence, cell by cell, and truth seeding."""

from __future__ import annotations

import pytest

from atmosphere_harness import Harness, HarnessSettings, PromptCache
from atmosphere_harness._preset import HarnessPreset, RuntimeTruth, effective_cache_policy

ALL = Harness.expand([Harness.ALL])
NONE: frozenset[Harness] = frozenset()
X = (Harness.MEMORY, Harness.PLANNING)
AGENT_PATH = "/atmosphere/agent/a"
ENDPOINT_PATH = "/atmosphere/chat"

# columns: agent default {ALL}, agent(harness=()), bare ai_endpoint, ai_endpoint(harness=X)
COLUMNS = [
    ("agent-default", AGENT_PATH, (Harness.ALL,), True),
    ("agent-empty", AGENT_PATH, (), True),
    ("endpoint-bare", ENDPOINT_PATH, (), False),
    ("endpoint-x", ENDPOINT_PATH, X, False),
]
TABLE = {
    None: [ALL, NONE, NONE, set(X)],
    True: [ALL, NONE, ALL, set(X)],
    False: [NONE, NONE, NONE, NONE],
}
CELLS = [
    (flag, column, expected)
    for flag, row in TABLE.items()
    for column, expected in zip(COLUMNS, row, strict=True)
]


@pytest.mark.parametrize(
    ("flag", "column", "expected"),
    CELLS,
    # Ids from the flag and the column's name only: a set's repr changes with hash order, and
    # pytest-xdist needs every worker to collect the same ids.
    ids=[f"{flag}-{column[0]}" for flag, column, _ in CELLS],
)
def test_flag_by_annotation_table(flag, column, expected) -> None:
    _, path, declared, is_agent = column
    preset = HarnessPreset(HarnessSettings(enabled=flag))
    assert preset.features_for(path, declared, is_agent) == expected


@pytest.mark.parametrize("flag", [None, True, False])
@pytest.mark.parametrize("column", COLUMNS, ids=lambda c: c[0])
def test_excluded_path_gets_nothing_whatever_the_flag(flag, column) -> None:
    _, path, declared, is_agent = column
    preset = HarnessPreset(HarnessSettings(enabled=flag, exclude_paths={path}))
    assert preset.features_for(path, declared, is_agent) == NONE


def test_exclude_paths_are_exact_and_trimmed(monkeypatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_HARNESS_EXCLUDE_PATHS", f"  {AGENT_PATH}  ")
    preset = HarnessPreset(HarnessSettings())
    assert preset.features_for(AGENT_PATH, (Harness.ALL,), True) == NONE
    assert preset.features_for(AGENT_PATH + "/", (Harness.ALL,), True) == ALL
    assert preset.features_for(AGENT_PATH.upper(), (Harness.ALL,), True) == ALL
    assert preset.features_for("/atmosphere/agent", (Harness.ALL,), True) == ALL


def test_null_path_gets_nothing() -> None:
    assert HarnessPreset(HarnessSettings()).features_for(None, (Harness.ALL,), True) == NONE


def test_kill_switch_beats_every_annotation() -> None:
    preset = HarnessPreset(HarnessSettings(enabled=False))
    for declared in [(Harness.ALL,), (Harness.MEMORY,), X]:
        assert preset.features_for(ENDPOINT_PATH, declared, False) == NONE
        assert preset.features_for(AGENT_PATH, declared, True) == NONE


@pytest.mark.parametrize("raw", ["yes", "1", "on", "nope"])
def test_unrecognized_flag_values_are_the_kill_switch(monkeypatch, raw) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_HARNESS_ENABLED", raw)
    preset = HarnessPreset(HarnessSettings())
    assert preset.kill_switch
    assert preset.features_for(AGENT_PATH, (Harness.ALL,), True) == NONE


@pytest.mark.parametrize("raw", ["", "  "])
def test_blank_flag_is_unset(monkeypatch, raw) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_HARNESS_ENABLED", raw)
    preset = HarnessPreset(HarnessSettings())
    assert not preset.kill_switch
    assert preset.features_for(ENDPOINT_PATH, (), False) == NONE
    assert preset.features_for(AGENT_PATH, (Harness.ALL,), True) == ALL


def test_truth_seed_when_enabled() -> None:
    truth = RuntimeTruth(HarnessSettings(enabled=True))
    state = truth.app_wide()
    assert state["conversation-memory"] == "INACTIVE(no-endpoint)"
    assert state["long-term-memory"] == "INACTIVE(no-endpoint)"
    assert state["planning"] == "INACTIVE(no-endpoint)"
    assert state["filesystem"] == "INACTIVE(no-endpoint)"
    assert state["delegation"] == "INACTIVE(no-coordinator)"
    assert state["compaction"] == "sliding-window"
    assert state["prompt-cache-default"] == "conservative"
    assert state["skills"] == "CONVENTION"


def test_truth_seed_when_unset_and_independent_seams() -> None:
    state = RuntimeTruth(HarnessSettings()).app_wide()
    assert {state[k] for k in ("conversation-memory", "planning", "filesystem", "delegation")} == {
        "INACTIVE(disabled)"
    }
    assert state["prompt-cache-default"] == "none"
    seams = RuntimeTruth(
        HarnessSettings(enabled=False, compaction="summarizing", prompt_cache_default="aggressive")
    ).app_wide()
    assert seams["compaction"] == "summarizing"
    assert seams["prompt-cache-default"] == "aggressive"
    assert seams["planning"] == "INACTIVE(disabled)"


def test_truth_only_moves_up() -> None:
    truth = RuntimeTruth(HarnessSettings())
    truth.report("/a", "planning", "ACTIVE(builtin)")
    truth.report("/b", "planning", "INACTIVE(native-unavailable)")
    assert truth.app_wide()["planning"] == "ACTIVE(builtin)"
    assert truth.endpoint("/b")["planning"] == "INACTIVE(native-unavailable)"
    truth.report("/c", "planning", "ACTIVE(user-tool)")
    assert truth.app_wide()["planning"] == "ACTIVE(user-tool)", "last ACTIVE writer wins"


def test_endpoint_seed_marks_unresolved_features_disabled() -> None:
    truth = RuntimeTruth(HarnessSettings())
    truth.seed_endpoint(
        "/x",
        frozenset({Harness.PLANNING, Harness.DELEGATION}),
        compaction="sliding-window",
        cache_policy=PromptCache.NONE,
        coordinator=False,
    )
    state = truth.endpoint("/x")
    assert state["filesystem"] == "INACTIVE(disabled)"
    assert state["conversation-memory"] == "INACTIVE(disabled)"
    assert state["planning"] == "INACTIVE(not-attached)"
    assert state["delegation"] == "INACTIVE(no-coordinator)"
    assert truth.app_wide()["delegation"] == "INACTIVE(disabled)"


@pytest.mark.parametrize(
    ("annotation", "setting", "cache_feature", "expected"),
    [
        (PromptCache.AGGRESSIVE, "none", True, PromptCache.AGGRESSIVE),
        (PromptCache.NONE, "aggressive", False, PromptCache.AGGRESSIVE),
        (None, "none", True, PromptCache.NONE),
        (None, None, True, PromptCache.CONSERVATIVE),
        (PromptCache.NONE, None, False, PromptCache.NONE),
    ],
)
def test_effective_cache_policy(annotation, setting, cache_feature, expected) -> None:
    settings = HarnessSettings(prompt_cache_default=setting)
    assert effective_cache_policy(annotation, settings, cache_feature=cache_feature) is expected
