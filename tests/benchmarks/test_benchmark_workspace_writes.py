"""The cross-process cost benchmark runs end to end on a tiny workload and reports both ledgers."""

from __future__ import annotations

from tests.benchmarks.support import run_benchmark


def test_the_benchmark_compares_the_two_ledgers_and_two_processes() -> None:
    result = run_benchmark("workspace_writes.py", "--rounds", "2", "--ops", "20", "--contended")
    assert set(result["alone"]) == {"new_1k", "overwrite_1k", "edit"}
    for figures in result["alone"].values():
        assert figures["shared_volume_us"] > 0
        assert figures["in_process_us"] > 0
        assert [len(rounds) for rounds in figures["per_round_us"].values()] == [2, 2]
    assert len(result["contended"]["two_processes_overwrite_1k_us"]) == 2
