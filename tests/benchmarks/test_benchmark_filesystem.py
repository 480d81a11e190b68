"""The filesystem benchmark runs end to end on a tiny workload and reports what it compared."""

from __future__ import annotations

import importlib.util

from tests.benchmarks.support import run_benchmark


def test_the_benchmark_runs_and_says_whether_the_peer_was_measured() -> None:
    result = run_benchmark("filesystem.py", "--files", "20", "--size-kib", "4", "--repeats", "1")
    assert result["workload"]["files"] == 20
    assert set(result["ours"]) >= {"write_all", "grep_rare", "edit_once", "write_all_fsync"}
    on_loop = result["ours_on_loop"]
    assert set(on_loop) == {"cool_downs", "hiccups", "spare_files_used"}
    # How many spares were used is the machine's business, not this test's: the first ones are
    # made by a worker thread when the first write asks, and on a busy machine (the suite in
    # parallel) 20 writes can be over before it ran, or the breaker can send them all to the
    # workers. tests/filesystem/test_filesystem_spares.py tests the spares themselves.
    assert all(isinstance(count, int) for count in on_loop.values())
    if importlib.util.find_spec("deepagents") is None:
        assert result["peer"] is None
        assert "deepagents is not installed" in result["peer_reason"]
        assert result["goals"]["no_op_slower_than_deepagents"] is None
    else:
        assert result["peer"]["edit_once"]["n"] == 1
        assert "vs_deepagents" in result["ratios"]["grep_rare"]
