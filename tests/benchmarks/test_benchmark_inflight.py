"""The long-runs-in-flight benchmark runs end to end on a tiny workload (no figures asserted)."""

from __future__ import annotations

from tests.benchmarks.support import run_benchmark


def test_every_stamped_token_reaches_its_client_through_a_tool_call() -> None:
    result = run_benchmark(
        "inflight.py", "--smoke", "--levels", "3", "--variants", "embedded_tool_call"
    )
    tokens = result["workload"]["tokens_per_run"]
    # Whether 3 runs are "held" (p99 frame delay under 100 ms) depends on how busy the machine
    # is: only that the level was judged is checked here.
    assert result["held"]["embedded_tool_call"] in (0, 3)
    level = result["variants"]["embedded_tool_call"]["levels"]["3"]
    assert level["outcomes"] == {"complete": 3}
    assert level["errors"] == 0
    # Half the answer, the `ls` call, its result, the other half: every token once.
    assert level["frame_delay_ms_whole_run"]["n"] == 3 * tokens
    assert 0 < level["frame_delay_ms"]["n"] <= 3 * tokens
    assert level["frame_delay_ms"]["p50"] >= 0
    assert level["server_cpu_us_per_token"] > 0
    assert 0 <= level["server_kernel_cpu_us_per_token"] <= level["server_cpu_us_per_token"]
    assert level["rss_mib_server"] > 0
    assert level["loop_lag_ms"]["n"] > 0


def test_heap_at_gives_what_a_run_in_flight_holds_by_source_line() -> None:
    result = run_benchmark(
        "inflight.py", "--smoke", "--levels", "3", "--variants", "embedded", "--heap-at", "3"
    )
    heap = result["variants"]["embedded"]["levels"]["3"]["heap"]
    assert heap["traced_kib_per_run"] > 0
    assert heap["top_bytes_per_run"]
    assert all(":" in line for line in heap["top_bytes_per_run"])


def test_pin_gives_the_server_a_core_of_its_own_and_the_runs_a_core_holds() -> None:
    result = run_benchmark(
        "inflight.py", "--smoke", "--levels", "3", "--variants", "embedded", "--pin"
    )
    pinned = result["workload"]["pinned"]
    assert len(pinned["server_cores"]) == 1
    assert pinned["load_cores"]
    assert not set(pinned["server_cores"]) & set(pinned["load_cores"])
    level = result["variants"]["embedded"]["levels"]["3"]
    assert level["outcomes"] == {"complete": 3}
    # One core's worth of runs at the level's cost: 10^6 / (µs a token x tokens a second).
    expected = 1e6 / level["server_cpu_us_per_token"] / result["workload"]["tokens_per_s"]
    assert abs(level["runs_a_core_at_this_cost"] - expected) <= 0.01 * expected + 1


def test_census_at_gives_the_objects_a_run_in_flight_keeps_tracked_and_a_full_pause() -> None:
    result = run_benchmark(
        "inflight.py", "--smoke", "--levels", "3", "--variants", "embedded", "--census-at", "3"
    )
    census = result["variants"]["embedded"]["levels"]["3"]["census"]
    # Every run in flight is at least its task, its coroutines, its journal and its response.
    assert census["tracked_objects_per_run"] > 20
    assert census["full_gc_ms"] > 0
    assert census["types_per_run"]["coroutine"] >= 1
    assert any("execute_prompt" in name for name in census["coroutines_per_run"])
    assert census["tracked_at_n"] > 3 * census["tracked_objects_per_run"]
