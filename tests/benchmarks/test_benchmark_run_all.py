"""`make bench`'s aggregator writes results.json in its documented shape, shows progress,
draws its charts, and never dirties the tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "run_all.py"
PNG = b"\x89PNG\r\n\x1a\n"
NAMES = [
    "turn_overhead_1k",
    "turn_overhead_50k",
    "batch_write_per_call",
    "batch_read_per_call",
    "storage_amplification",
    "storage_amplification_durable",
    "durable_overhead_1k",
    "durable_overhead_50k",
    "grep_common_all",
    "grep_rare",
    "plan_fanout_p99",
    "turn_overhead_10k_conversations",
    "durable_added_50k",
    "backend_added_per_turn_postgres",
    "backend_added_per_turn_redis",
    "backend_floor_postgres",
    "backend_floor_redis",
    "follower_lag_p50_postgres",
    "follower_lag_p99_postgres",
    "follower_lag_p50_redis",
    "follower_lag_p99_redis",
]

UNITS = {
    "storage_amplification": "x",
    "storage_amplification_durable": "x",
    "durable_overhead_1k": "%",
    "durable_overhead_50k": "%",
    "durable_added_50k": "us",
}


def test_results_json_has_every_name_and_the_figures_of_what_ran(tmp_path: Path) -> None:
    done = subprocess.run(
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
        assert figure["unit"] == UNITS.get(name, "ms")
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
    # Progress on stderr: which benchmark, i/N, elapsed, and the ETA (none known on a first run).
    assert "[1/2] scale" in done.stderr
    assert "[2/2] plan_fanout" in done.stderr
    assert "ETA unknown (no previous timing)" in done.stderr
    assert "elapsed" in done.stderr
    # The seconds per script are kept for the next run's ETA, and the scale chart is drawn.
    timings = json.loads((tmp_path / "timings.json").read_text())
    assert set(timings["quick"]) == {"scale", "plan_fanout"}
    assert (tmp_path / "charts" / "bench-scale.png").read_bytes().startswith(PNG)
    assert not (tmp_path / "charts" / "bench-headlines.png").exists(), "no peer figure ran"


def test_the_next_run_has_an_eta_from_the_previous_timings(tmp_path: Path) -> None:
    (tmp_path / "timings.json").write_text(json.dumps({"quick": {"scale": 125.0}}))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--only", "scale", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "[1/1] scale 0:00 | elapsed 0:00 | ETA 2:05" in done.stderr
    timings = json.loads((tmp_path / "timings.json").read_text())
    assert timings["quick"]["scale"] < 125.0


def test_a_full_run_is_refused_under_pytest(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "scale", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTEST_CURRENT_TEST": os.environ.get("PYTEST_CURRENT_TEST", "x")},
    )
    assert done.returncode == 2
    assert "pass --quick" in done.stderr
    assert not (tmp_path / "results").exists()


def test_the_charts_of_the_reference_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from charts import draw
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    written = draw(ROOT / "benchmarks" / "reference", tmp_path)
    assert [path.name for path in written] == ["bench-headlines.png", "bench-scale.png"]
    for path in written:
        assert path.read_bytes().startswith(PNG)
        # docs/images holds the same charts (`make bench-charts` draws them from the committed run).
        assert (ROOT / "docs" / "images" / path.name).read_bytes().startswith(PNG)


def test_what_a_run_writes_is_ignored_and_the_reference_is_committed() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    written = [
        "benchmarks/results.json",
        "benchmarks/results/turns.json",
        "benchmarks/timings.json",
        "benchmarks/charts/bench-scale.png",
    ]
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", *written],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ignored.stdout.split() == written
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "benchmarks/reference", "docs/images"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "benchmarks/reference/results.json" in tracked
    assert "benchmarks/reference/results/scale.json" in tracked
    assert "docs/images/bench-headlines.png" in tracked


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
