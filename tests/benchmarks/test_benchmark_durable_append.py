"""The durable append benchmark measures every append it makes, on both payload sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "durable_append.py"


def test_the_benchmark_times_each_append_of_both_sizes() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--turns", "40"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(done.stdout)
    for size in ("1k", "50k"):
        entry = result[size]
        assert entry["appends"] == 80
        assert 0 <= entry["refused"] <= entry["appends"]
        for figure in ("wall", "cpu", "os_write_1kib"):
            assert 0 < entry[figure]["p50_us"] <= entry[figure]["p99_us"] <= entry[figure]["max_us"]
