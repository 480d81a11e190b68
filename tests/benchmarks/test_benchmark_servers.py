"""The agent-server benchmark runs end to end on a tiny workload, ours only (no peer installed)."""

from __future__ import annotations

from tests.benchmarks.support import run_benchmark


def test_ours_on_every_backend_side_by_side_and_the_peers_said_skipped() -> None:
    result = run_benchmark("servers.py", "--smoke", "--no-peers")
    ours = {"ours_embedded", "ours_postgres", "ours_redis"}
    assert result["skipped"] == {"aegra": "--no-peers", "langgraph_dev": "--no-peers"}
    for kind in ("echo", "tool"):
        assert set(result["latency_ms"][kind]) == ours
        assert all(figure["p50"] > 0 for figure in result["latency_ms"][kind].values())
    assert set(result["throughput"]) == ours
    for name, figure in result["throughput"].items():
        assert figure["runs"] > 0, name
        assert figure["cpu_ms_per_run"] > 0, name
    assert result["throughput"]["ours_postgres"]["postgres_cpu_ms_per_run"] >= 0
    assert set(result["follower_lag_ms"]) == {"ours_postgres", "ours_redis"}
    for measured in result["follower_lag_ms"].values():
        assert measured["follower_outcomes"] == {"complete": 1}, measured.get("server_warnings")
