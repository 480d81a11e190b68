"""The scale benchmark runs end to end on a tiny population and reports every level."""

from __future__ import annotations

from tests.benchmarks.support import run_benchmark


def test_the_benchmark_grows_the_population_and_measures_each_level() -> None:
    result = run_benchmark("scale.py", "--levels", "2,5", "--prompts", "2")
    assert result["workload"]["levels"] == [2, 5]
    assert result["peer"] is None
    assert result["peer_reason"]
    first, last = result["levels"]["2"], result["levels"]["5"]
    assert first["on_disk"] == {**first["on_disk"], "histories": 2, "plans": 2, "workspaces": 2}
    # The first level's prompts (a warm-up and two new conversations) stay on disk too.
    assert last["on_disk"]["histories"] == 5 + 3
    assert last["on_disk"]["plans"] == last["on_disk"]["workspaces"] == 5 + 3
    for level in (first, last):
        assert level["ms_per_turn"] > 0
        assert level["server_rss_kib"]["after_prompts"] > 0
        assert level["existing_sampled_with"]["plan"] <= 2
