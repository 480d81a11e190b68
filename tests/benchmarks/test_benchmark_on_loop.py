"""The on-loop benchmark runs end to end on a tiny workload and reports every way it compared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "on_loop.py"


def test_the_benchmark_compares_the_hop_and_the_loop() -> None:
    arguments = ["--rounds", "2", "--turns", "3", "--edits", "2", "--files", "12"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(done.stdout)
    for size in ("1k", "50k"):
        assert set(result["turns"][size]) == {"hop", "loop", "loop_breaker"}
        for figures in result["turns"][size].values():
            assert figures["per_turn_ms"] > 0
            assert figures["cpu_per_turn_ms"] > 0
    assert result["turns"]["on_loop_us"]["wall"]["count"] > 0, "the loop mode ran on the loop"
    assert {"hop", "loop"} <= set(result["edit"])
    assert ("deepagents" in result["edit"]) == (result["peer_reason"] is None)
