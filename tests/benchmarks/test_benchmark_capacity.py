"""The capacity benchmark runs end to end on a tiny workload (no figures asserted)."""

from __future__ import annotations

from tests.benchmarks.support import run_benchmark
from tests.support import require_service


def test_per_run_and_per_token_costs_with_and_without_followers_and_the_model_checked() -> None:
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
        for name in ("stream_1", "stream_2_followed"):
            stream = measured[name]
            assert stream["outcomes"] == {"complete": 4}, (kind, name)
            assert stream["tokens_in_window"] > 0, (kind, name)
            assert stream["cpu_us_per_token"]["server"] > 0, (kind, name)
        # Runs nobody follows from another replica put nothing of their tokens in the store.
        alone = measured["stream_1"]
        assert not alone["followed"]
        if kind == "postgres":
            assert alone["postgres_frame_rows_per_token"] == 0
        else:
            # (a feed write publishes each of its runs' frames; the leases' upkeep goes on)
            assert alone["redis_commands_by_name_per_token"].get("publish", 0) == 0
        # Each run followed by a reader on the other replica: that reader got the run to its
        # end, and the feed wrote its tokens (a frame row each on PostgreSQL).
        followed = measured["stream_2_followed"]
        assert followed["followed"]
        assert followed["follower_outcomes"] == {"complete": 4}, kind
        assert followed["follower_tokens_in_window"] > 0, kind
        if kind == "postgres":
            assert followed["postgres_frame_rows_per_token"] > 0
            assert followed["postgres_xacts_per_token"] > 0
        else:
            assert followed["feed_writes_per_token"] > 0
            assert followed["redis_commands_per_token"] > alone["redis_commands_per_token"]
        # Both replicas serve clients: the runs' own streams and their followers.
        assert all(
            replica["clients"] > 0 for replica in followed["connections_mid_window"]["per_replica"]
        )
        for name in ("turns_1", "turns_2"):
            predicted = measured["model"][name]
            assert predicted["runs_per_s"] > 0
            assert predicted["bound_by"] in predicted["bounds"]
        assert set(result["sizing"][kind]) == {"10000", "100000"}
        for entry in result["sizing"][kind].values():
            # The store's load grows with the share of runs followed from another replica.
            assert entry["followed_share"] == 0.1
            assert entry["server_cores_all_followed"] >= entry["server_cores"] > 0
            if kind == "postgres":
                assert entry["postgres_xacts_per_s_all_followed"] >= entry["postgres_xacts_per_s"]
            else:
                assert entry["redis_commands_per_s_all_followed"] >= entry["redis_commands_per_s"]
    postgres = result["backends"]["postgres"]["turns_1"]
    # Each statement of a turn is a transaction of its own: a turn commits several.
    assert postgres["postgres_per_run"]["xact_commit"] >= 1
    redis = result["backends"]["redis"]["turns_1"]
    assert redis["redis_commands_per_run"] >= 1
    assert "evalsha" in redis["redis_commands_by_name_per_run"]
