"""The cross-process cost benchmark runs end to end on a tiny workload and reports both ledgers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "workspace_writes.py"


def test_the_benchmark_compares_the_two_ledgers_and_two_processes() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "2", "--ops", "20", "--contended"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(done.stdout)
    assert set(result["alone"]) == {"new_1k", "overwrite_1k", "edit"}
    for figures in result["alone"].values():
        assert figures["shared_volume_us"] > 0
        assert figures["in_process_us"] > 0
        assert [len(rounds) for rounds in figures["per_round_us"].values()] == [2, 2]
    assert len(result["contended"]["two_processes_overwrite_1k_us"]) == 2
