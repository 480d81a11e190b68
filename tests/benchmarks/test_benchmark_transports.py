"""The transport benchmark runs end to end on a tiny workload and reports what it compared."""

from __future__ import annotations

import importlib.util

from tests.benchmarks.support import run_benchmark


def test_the_benchmark_runs_and_says_whether_the_peer_was_measured() -> None:
    result = run_benchmark("transports.py", "--runs", "1", "--repeats", "1")
    assert set(result["ours"]) == {"ours_agui", "ours_sse", "ours_websocket"}
    for figures in result["ours"].values():
        assert figures["wall_ms_per_run"] > 0
    peer_installed = all(
        importlib.util.find_spec(name) is not None for name in ("deepagents", "ag_ui_langgraph")
    )
    if peer_installed:
        assert result["peer"]["wall_ms_per_run"] > 0
        assert set(result["ratios"]["agui_peer_over_ours"]) == set(result["peer"])
    else:
        assert result["peer"] is None
        assert "not installed" in result["peer_reason"]
