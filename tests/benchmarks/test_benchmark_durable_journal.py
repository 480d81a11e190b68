"""The journal replay benchmark replays a recorded durable prompt without and with the store."""

from __future__ import annotations

from tests.benchmarks.support import run_benchmark


def test_the_benchmark_replays_a_recorded_prompt_on_both_sides() -> None:
    result = run_benchmark("durable_journal.py", "--turns", "4", "--repeats", "2")
    for size, payload in (("1k", 1024), ("50k", 50 * 1024)):
        entry = result[size]
        assert entry["model_turns"] == 5  # (four write_file turns, then the answer)
        # Per turn: the model's answer, tool-start, started, result, tool-result; then the
        # prompt's own (the history mark, its since: mark, the answer and its frames).
        assert entry["journal_calls"] >= 5 * 4
        for side in ("off", "on"):
            assert entry[side]["wall_us"] > 0
            assert entry[side]["cpu_us"] >= 0
        assert entry["on"]["log_writes"] > 0
        assert entry["on"]["log_bytes"] >= payload  # each turn's argument, written once
        assert set(entry["added_us"]) == {"wall", "cpu"}
        # The added CPU time split: the journal's encoding alone, with packing, with the write.
        parts = entry["parts_cpu_us"]
        assert list(parts) == ["encode", "pack", "write"]
        assert all(isinstance(value, float) for value in parts.values())
        assert parts["write"] == entry["added_us"]["cpu"]
