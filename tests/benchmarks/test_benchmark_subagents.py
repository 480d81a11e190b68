"""The sub-agent benchmark runs end to end on a tiny workload and reports what it compared."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "subagents.py"


def test_the_benchmark_runs_and_says_whether_the_peer_was_measured() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--spawns", "3", "--size-kib", "1", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["workload"]["spawns"] == 3
    assert result["ours"]["fanout"]["outcome"] == {
        "completed": True,
        "reports": 3,
        "leftover_workspaces": 0,
    }
    assert result["ours"]["containment"]["outcome"]["reports"] == 2
    assert result["goals"]["siblings_survive_a_failing_sub_agent"] is True
    if importlib.util.find_spec("deepagents") is None:
        assert result["peer"] is None
        assert "deepagents is not installed" in result["peer_reason"]
    else:
        assert "ratio_deepagents_async_over_ours" in result["peer"]["fanout"]
