"""The turn benchmark runs end to end on a tiny workload and reports what it compared."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from tests.benchmarks.support import run_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "turns.py"
FIGURES = {
    "turn_overhead_1k",
    "turn_overhead_50k",
    "batch_write_per_call",
    "batch_read_per_call",
    "storage_amplification",
    "storage_amplification_durable",
    "durable_overhead_1k",
    "durable_overhead_50k",
    "durable_turn_1k",
    "durable_turn_50k",
    "durable_added_50k",
    "tracing_noop_overhead",
    "tracing_sdk_overhead",
}
OVERHEADS = {
    "durable_overhead_1k",
    "durable_overhead_50k",
    "durable_added_50k",
    "tracing_noop_overhead",
    "tracing_sdk_overhead",
}
"""Durable on vs off (percent, microseconds): noise can make it negative, so only its presence is
checked."""


def test_the_benchmark_runs_and_says_whether_the_peer_was_measured() -> None:
    result = run_benchmark("turns.py", "--repeats", "1", "--turns", "3", "--batch", "4")
    assert result["workload"] == {"turns": 3, "batch": 4, "repeats": 1}
    assert set(result["figures"]) == FIGURES
    for name, figure in result["figures"].items():
        assert isinstance(figure["ours"], float)
        assert name in OVERHEADS or figure["ours"] > 0
    assert set(result["durable"]) == {"1k", "50k"}
    assert set(result["tracing"]) == {"1k", "50k", "hook_us_per_turn"}
    assert result["tracing"]["hook_us_per_turn"]["sdk"] > 0
    assert set(result["tracing"]["1k"]) >= {"off", "noop", "sdk", "sdk_overhead_pct"}
    assert set(result["http"]) == {"1k", "50k"}
    for size, storage in result["storage"].items():
        assert storage["written_bytes"] == 3 * int(size.split("k")[0]) * 1024
        files = storage["ours"]["bytes_after_shutdown"]["workspace_files"]
        assert files == storage["written_bytes"]
    if importlib.util.find_spec("deepagents") is None:
        assert "deepagents is not installed" in result["peer_reason"]
        assert all(figure["peer"] is None for figure in result["figures"].values())
        assert set(result["batch"]) == {"ours"}
    else:
        assert result["peer_reason"] is None
        assert all(
            figure["ratio"] > 0
            for name, figure in result["figures"].items()
            if name not in OVERHEADS
        )


def test_sections_runs_only_what_is_named_and_says_what_is_unknown() -> None:
    result = run_benchmark("turns.py", "--repeats", "1", "--turns", "2", "--sections", "durable")
    assert result["turns"] == result["http"] == result["batch"] == result["storage"] == {}
    assert result["tracing"] == {}
    assert set(result["durable"]) == {"1k", "50k"}
    assert isinstance(result["figures"]["durable_turn_1k"]["ours"], float)
    # Both goals in their own units, from the paired repeats: 1 KiB in %, 50 KiB in us.
    for size in ("1k", "50k"):
        entry = result["durable"][size]
        assert isinstance(entry["overhead_pct"], float)
        assert isinstance(entry["added_us"], float)
    figures = result["figures"]
    assert figures["durable_overhead_1k"] == {
        "ours": result["durable"]["1k"]["overhead_pct"],
        "peer": None,
        "unit": "%",
        "ratio": None,
    }
    assert figures["durable_added_50k"] == {
        "ours": result["durable"]["50k"]["added_us"],
        "peer": None,
        "unit": "us",
        "ratio": None,
    }
    assert result["figures"]["turn_overhead_1k"]["ours"] is None
    wrong = subprocess.run(
        [sys.executable, str(SCRIPT), "--sections", "durable,nope"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert wrong.returncode != 0
    assert "unknown sections: ['nope']" in wrong.stderr
