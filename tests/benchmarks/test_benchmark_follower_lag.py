"""The follower-lag benchmark runs end to end on a tiny workload (no figures asserted)."""

from __future__ import annotations

from tests.benchmarks.support import run_benchmark
from tests.support import require_service


def test_a_run_on_one_replica_is_followed_frame_by_frame_from_the_other() -> None:
    result = run_benchmark("follower_lag.py", "--runs", "2", "--seconds", "1")
    assert set(result["backends"]) == {"postgres", "redis"}
    for kind, measured in result["backends"].items():
        if "skipped" in measured:
            require_service(kind, measured["skipped"])
            continue
        assert measured["follower_outcomes"] == {"complete": 2}
        assert measured["same_replica_ms"]["n"] == 2 * 20
        assert 0 < measured["follower_ms"]["n"] <= 2 * 20
        assert measured["follower_ms"]["p50"] > 0
