"""The on-loop benchmark runs end to end on a tiny workload and reports every way it compared."""

from __future__ import annotations

from tests.benchmarks.support import run_benchmark


def test_the_benchmark_compares_the_hop_and_the_loop() -> None:
    arguments = ["--rounds", "2", "--turns", "3", "--edits", "2", "--files", "12"]
    result = run_benchmark("on_loop.py", *arguments)
    for size in ("1k", "50k"):
        assert set(result["turns"][size]) == {"hop", "loop", "loop_breaker"}
        for figures in result["turns"][size].values():
            assert figures["per_turn_ms"] > 0
            assert figures["cpu_per_turn_ms"] > 0
    assert result["turns"]["on_loop_us"]["wall"]["count"] > 0, "the loop mode ran on the loop"
    assert {"hop", "loop"} <= set(result["edit"])
    assert ("deepagents" in result["edit"]) == (result["peer_reason"] is None)
