"""The memory benchmark runs end to end on a tiny workload and reports every section's shape.

Speed is never asserted here: only that each section ran, measured what it says it measures, and
wrote the same JSON document to stdout and to `--json`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.benchmarks.support import run_benchmark

TURN_KEYS = {
    "per_turn_ms",
    "per_model_call_ms",
    "amplification",
    "written_mib",
    "disk_mib",
    "samples_per_turn_ms",
}
LATENCY_KEYS = {"median_ms", "p95_ms"}


def test_the_benchmark_runs_and_reports_every_section(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    env = {k: v for k, v in os.environ.items() if k != "ATMOSPHERE_BENCH_PEER_PYTHON"}
    tiny = {
        "--repeats": 1,
        "--users": 4,
        "--facts-per-user": 6,
        "--samples": 5,
        "--closes": 2,
        "--extraction-ms": 10,
        "--json": out,
    }
    result = run_benchmark(
        "memory_bench.py", *(str(part) for pair in tiny.items() for part in pair), env=env
    )
    assert json.loads(out.read_text()) == result, "--json writes the printed document"
    assert result["repeats"] == 1
    assert "peer" not in result, "no peer interpreter was given"
    assert "ratio" not in result

    turns = result["turns"]
    assert set(turns) == {
        f"{size}/{shape}/{memory}"
        for size in ("1k", "50k")
        for shape in ("one-prompt", "60-prompts")
        for memory in ("memory", "bare")
    }
    for key, entry in turns.items():
        assert set(entry) == TURN_KEYS, key
        assert len(entry["samples_per_turn_ms"]) == 1
        assert entry["per_turn_ms"] > 0
        # Everything written is on disk (workspace files), plus the history database if any.
        assert entry["disk_mib"] >= entry["written_mib"] > 0, key
        assert entry["amplification"] >= 1, key
    for size in ("1k", "50k"):
        # The memory runs store the history; the bare ones only the files.
        assert (
            turns[f"{size}/60-prompts/memory"]["disk_mib"]
            > turns[f"{size}/60-prompts/bare"]["disk_mib"]
        )

    recall = result["recall"]
    assert (recall["users"], recall["facts"]) == (4, 24)
    for name in ("get_facts_20", "search_fts5_20", "interceptor_recall", "fact_count"):
        assert set(recall[name]) == LATENCY_KEYS, name
        assert 0 <= recall[name]["median_ms"] <= recall[name]["p95_ms"], name

    close = result["close"]
    assert close["closes"] == 2
    assert close["extractions_completed"] == 2, "shutdown drains every background extraction"
    assert close["close_request_median_ms"] > 0
    assert close["extraction_median_ms"] is not None
