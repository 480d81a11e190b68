"""The sub-agent benchmark runs end to end on a tiny workload and reports what it compared."""

from __future__ import annotations

import importlib.util

from tests.benchmarks.support import run_benchmark


def test_the_benchmark_runs_and_says_whether_the_peer_was_measured() -> None:
    result = run_benchmark("subagents.py", "--spawns", "3", "--size-kib", "1", "--repeats", "1")
    assert result["workload"]["spawns"] == 3
    assert result["ours"]["fanout"]["outcome"] == {
        "completed": True,
        "reports": 3,
        "leftover_workspaces": 0,
    }
    assert result["ours"]["containment"]["outcome"]["reports"] == 2
    assert result["goals"]["siblings_survive_a_failing_sub_agent"] is True
    if importlib.util.find_spec("deepagents") is None:
        assert result["peer"] is None
        assert "deepagents is not installed" in result["peer_reason"]
    else:
        assert "ratio_deepagents_async_over_ours" in result["peer"]["fanout"]
