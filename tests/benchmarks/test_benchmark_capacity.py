"""The capacity benchmark runs end to end on a tiny workload (no figures asserted)."""

from __future__ import annotations

from tests.benchmarks.support import run_benchmark
from tests.support import require_service


def test_per_run_and_per_token_costs_at_one_and_two_replicas_and_the_model_checked() -> None:
    # Eight phases, each starting its own servers: longer than the other smoke runs.
    result = run_benchmark("capacity.py", "--smoke", timeout=600)
    for kind, why in result["skipped"].items():
        require_service(kind, why)
    assert set(result["backends"]) == {"postgres", "redis"}
    assert result["commit"]
    for kind, measured in result["backends"].items():
        for replicas in (1, 2):
            turns = measured[f"turns_{replicas}"]
            assert turns["replicas"] == replicas
            assert turns["runs"] > 0, kind
            assert turns["errors"] == 0, kind
            assert turns["cpu_ms_per_run"]["server"] > 0, kind
            # Every replica served (clients alternate between them) and held its connections.
            sockets = turns["connections_mid_window"]["per_replica"]
            assert len(sockets) == replicas
            assert all(replica["fds"] > 0 and replica[kind] > 0 for replica in sockets), kind
        for name in ("stream_1", "stream_2_one_busy"):
            stream = measured[name]
            assert stream["outcomes"] == {"complete": 4}, (kind, name)
            assert stream["tokens_in_window"] > 0, (kind, name)
            assert stream["cpu_us_per_token"]["server"] > 0, (kind, name)
            assert stream["feed_writes_per_token"] > 0, (kind, name)
        # All runs on the first replica: the second holds no client of them.
        busy, idle = measured["stream_2_one_busy"]["connections_mid_window"]["per_replica"]
        assert busy["clients"] > idle["clients"]
        assert len(measured["stream_2_one_busy"]["idle_replica_cpu_us_per_feed_write"]) == 1
        for name in ("turns_1", "turns_2"):
            predicted = measured["model"][name]
            assert predicted["runs_per_s"] > 0
            assert predicted["bound_by"] in predicted["bounds"]
        assert set(result["sizing"][kind]) == {"10000", "100000"}
    postgres = result["backends"]["postgres"]["turns_1"]
    # Each statement of a turn is a transaction of its own: a turn commits several.
    assert postgres["postgres_per_run"]["xact_commit"] >= 1
    redis = result["backends"]["redis"]["turns_1"]
    assert redis["redis_commands_per_run"] >= 1
    assert "evalsha" in redis["redis_commands_by_name_per_run"]
