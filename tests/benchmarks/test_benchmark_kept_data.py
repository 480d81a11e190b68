"""The kept-data benchmark runs end to end on tiny levels (no figures asserted)."""

from __future__ import annotations

from tests.benchmarks.support import run_benchmark
from tests.support import require_service

UPKEEP = {"heartbeat", "claim", "expire", "abandon", "idle"}


def test_turns_and_upkeep_are_measured_at_every_level_of_kept_records() -> None:
    result = run_benchmark("kept_data.py", "--smoke")
    assert result["workload"]["levels"] == [100, 1000]
    for kind, measured in result["backends"].items():
        if "skipped" in measured:
            require_service(kind, measured["skipped"])
            continue
        assert set(measured["levels"]) == {"100", "1000"}
        for level in measured["levels"].values():
            assert level["turn_ms"]["n"] == 10
            assert level["turn_ms"]["p50"] > 0
            assert set(level["upkeep_ms"]) == UPKEEP
        assert measured["flat"]["turn_p50_x"] > 0
    postgres = result["backends"]["postgres"]
    if "levels" in postgres:
        for level in postgres["levels"].values():
            assert set(level["seq_scans_during_turns"]) == {
                "atmosphere_runs",
                "atmosphere_conversations",
            }
