"""`make bench`'s aggregator writes results.json in the shape issue 9 fixes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "run_all.py"
NAMES = [
    "turn_overhead_1k",
    "turn_overhead_50k",
    "batch_write_per_call",
    "batch_read_per_call",
    "storage_amplification",
    "grep_common_all",
    "grep_rare",
    "plan_fanout_p99",
    "turn_overhead_10k_conversations",
]


def test_results_json_has_every_name_and_the_figures_of_what_ran(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--only",
            "scale,plan_fanout",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    results = json.loads((tmp_path / "results.json").read_text())
    assert list(results) == NAMES
    for name, figure in results.items():
        assert set(figure) == {"ours", "peer", "unit", "ratio"}
        assert figure["unit"] == ("x" if name == "storage_amplification" else "ms")
    scaled = results["turn_overhead_10k_conversations"]
    assert scaled["ours"] > 0
    assert scaled["peer"] is None
    assert scaled["ratio"] is None
    assert results["turn_overhead_1k"]["ours"] is None, "turns did not run"
    fanout = json.loads((tmp_path / "results" / "plan_fanout.json").read_text())
    assert results["plan_fanout_p99"]["ours"] > 0
    assert results["plan_fanout_p99"]["peer"] is None
    # Every viewer got every update (the benchmark's own delivered/expected count).
    assert fanout["median"]["delivered_ratio"] == 1.0, fanout["median"]
    detail = json.loads((tmp_path / "results" / "scale.json").read_text())
    assert detail["levels"]["5"]["ms_per_turn"] == scaled["ours"]


def test_an_unknown_benchmark_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "nope", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "unknown benchmarks: nope" in done.stderr
    assert not (tmp_path / "results.json").exists()
