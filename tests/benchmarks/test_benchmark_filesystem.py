"""The filesystem benchmark runs end to end on a tiny workload and reports what it compared."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

from tests.benchmarks.support import run_benchmark
from tests.fs_support import makes_tmpfiles


def test_the_benchmark_runs_and_says_whether_the_peer_was_measured() -> None:
    result = run_benchmark("filesystem.py", "--files", "20", "--size-kib", "4", "--repeats", "1")
    assert result["workload"]["files"] == 20
    assert set(result["ours"]) >= {"write_all", "grep_rare", "edit_once", "write_all_fsync"}
    on_loop = result["ours_on_loop"]
    assert set(on_loop) == {"cool_downs", "spare_files_used"}
    if sys.platform == "linux" and makes_tmpfiles(Path(tempfile.gettempdir())):
        assert on_loop["spare_files_used"] > 0, "writes on the loop filled spare files"
    if importlib.util.find_spec("deepagents") is None:
        assert result["peer"] is None
        assert "deepagents is not installed" in result["peer_reason"]
        assert result["goals"]["no_op_slower_than_deepagents"] is None
    else:
        assert result["peer"]["edit_once"]["n"] == 1
        assert "vs_deepagents" in result["ratios"]["grep_rare"]
