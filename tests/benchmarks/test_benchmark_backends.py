"""The PostgreSQL and Redis backend benchmarks run end to end on a tiny workload (no figures
asserted): each is a headline of `make bench`, and a change of the routes they drive (a plan
stream of an unused conversation answers 404) must not leave them broken."""

from __future__ import annotations

from tests.benchmarks.support import run_benchmark
from tests.support import require_service


def test_the_postgres_benchmark_runs_turns_plan_updates_and_counts_round_trips() -> None:
    result = run_benchmark(
        "scaleout_postgres.py",
        *("--turns", "6", "--updates", "3", "--rounds", "1", "--floor-turns", "5"),
    )
    if "skipped" in result:
        require_service("postgres", result["skipped"])
        return
    assert result["turn_ms"]["postgres"]["n"] == 6
    assert result["round_trips"]["round_trips_per_turn"] > 0
    # The floor: the turn's waits from a bare client, beside the added cost it bounds.
    floor = result["floor"]
    assert floor["iterations"] == 5
    assert floor["median_ms"] > 0
    assert floor["synchronous_commit"]  # the server's own setting, reported as is
    assert floor["added_median_ms"] == result["turn_ms"]["added_median_ms_postgres"]
    assert floor["added_over_floor_ms"] == round(floor["added_median_ms"] - floor["median_ms"], 3)


def test_the_redis_benchmark_runs_turns_over_http() -> None:
    result = run_benchmark(
        "redis_backend.py",
        *("--turns", "4", "--rounds", "1", "--updates", "3", "--floor-turns", "5"),
    )
    if "skipped" in result:
        require_service("redis", result["skipped"])
        return
    assert result["per_turn_http"]["redis"]["turns"] > 0
    floor = result["floor"]
    assert floor["iterations"] == 5
    assert floor["hiredis"] is True
    assert floor["median_ms"] > 0
    assert floor["added_median_ms"] == result["per_turn_http"]["added_median_ms"]
    assert floor["added_over_floor_ms"] == round(floor["added_median_ms"] - floor["median_ms"], 3)
