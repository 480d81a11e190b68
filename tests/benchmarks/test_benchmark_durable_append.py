"""The durable append benchmark measures every append it makes, on both payload sizes."""

from __future__ import annotations

from tests.benchmarks.support import run_benchmark


def test_the_benchmark_times_each_append_of_both_sizes() -> None:
    result = run_benchmark("durable_append.py", "--turns", "40")
    for size in ("1k", "50k"):
        entry = result[size]
        assert entry["appends"] == 80
        assert 0 <= entry["refused"] <= entry["appends"]
        for figure in ("wall", "cpu", "os_write_1kib"):
            assert 0 < entry[figure]["p50_us"] <= entry[figure]["p99_us"] <= entry[figure]["max_us"]
