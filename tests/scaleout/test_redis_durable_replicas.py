"""Durable runs on Redis over two real replicas: the PostgreSQL takeover tests, on Redis alone.

Replica A is SIGKILLed inside a tool / while its run waits for an approval, and replica B takes
the run over once A's lease ran out (measured on Redis's clock) and completes it, the model
never asked again for a journalled turn; B also replays and follows a run executing on A. The
tests are `test_postgres_durable_replicas`'s, run with `ATMOSPHERE_REDIS_URL` (db 13, a random
key prefix deleted afterwards) instead of a PostgreSQL database.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
import redis

from tests.durable.support import WAIT, wait_for
from tests.scaleout.redis_app import PATH as SCRIBE
from tests.scaleout.replicas import USER, two_replicas
from tests.scaleout.test_postgres_durable_replicas import (  # noqa: F401
    LEASE_SECONDS,
    Replicas,
    test_a_prompt_holding_a_nul_is_journalled_and_resumed_whole,
    test_a_superseded_run_closes_its_shared_approval,
    test_an_approval_answered_on_b_while_a_is_dead_is_taken_over_with_the_run,
    test_events_on_b_replay_and_follow_a_run_executing_on_a,
    test_replica_b_takes_over_a_run_of_killed_replica_a,
)

from .redis_service import HOST, PORT, TEST_DB, url_for

pytestmark = pytest.mark.services


@pytest.fixture
def replicas(tmp_path: Path, redis_prefix: str) -> Iterator[Replicas]:
    pair = Replicas(tmp_path, url_for(redis_prefix), backend="redis")
    try:
        yield pair
    finally:
        pair.close()


@pytest.fixture
def shared(tmp_path: Path, redis_prefix: str) -> tuple[Path, str, str]:
    return tmp_path, url_for(redis_prefix), "redis"


TAKEN_OVER = 3
"""Runs replica B takes over before it is stopped (each run's cancellation is one chance for
the driver to swallow it, which the old shutdown did not survive)."""
STOP_SECONDS = 8.0
"""Hang guard on B's graceful stop (it takes well under a second; a run or loop that ignores
its cancellation made it take 10 s, or never end)."""


def test_a_replica_stopped_while_its_taken_over_runs_wait_for_their_locks_exits(
    tmp_path: Path, redis_prefix: str
) -> None:
    """SIGTERM on replica B while the runs it took over from SIGKILLed replica A wait for their
    conversations' locks (held by another replica): B stops cleanly and at once, leaving the
    runs unfinished in the store for the next replica. (The scale-out app: `slow <ms>` keeps
    the model busy that long.)"""
    env = {
        "ATMOSPHERE_REDIS_URL": url_for(redis_prefix),
        "ATMOSPHERE_DURABLE_RUNS_ENABLED": "true",
        "ATMOSPHERE_DURABLE_RUNS_LEASE_SECONDS": LEASE_SECONDS,
        "TEST_SERVER_LOG_LEVEL": "INFO",
    }
    client = redis.Redis(host=HOST, port=PORT, db=TEST_DB)
    leases = f"{redis_prefix}runs:leases"
    conversations = [f"cut-{n}" for n in range(TAKEN_OVER)]
    with two_replicas("redis", tmp_path / "workspace", tmp_path, env) as (a, b):
        try:
            with contextlib.ExitStack() as streams:
                for conversation in conversations:
                    # Kept open until the kill: a run whose client left is over (journalled
                    # as ended), and rightly not taken over.
                    streams.enter_context(
                        httpx2.stream(
                            "POST",
                            a.url + SCRIBE,
                            json={"message": "slow 600000 hi", "conversationId": conversation},
                            headers=USER,
                            timeout=WAIT,
                        )
                    )
                wait_for(lambda: client.zcard(leases) == TAKEN_OVER, "the runs to be journalled")
                a.kill()
            # Another replica holds the conversations now (what a prompt there would do).
            for conversation in conversations:
                client.set(_lock_key(redis_prefix, conversation), "replica-c", px=120_000)
            wait_for(
                lambda: b.log_tail(200).count("resuming a durable run") == TAKEN_OVER,
                "replica B to take the runs over",
            )
            started = time.monotonic()
            code = b.stop()
            stopped = time.monotonic() - started
            assert code == -signal.SIGTERM, b.log_tail()
            assert stopped < STOP_SECONDS, f"B took {stopped:.1f} s to stop"
            assert client.zcard(leases) == TAKEN_OVER  # unfinished, for the next replica
        finally:
            client.close()


def _lock_key(prefix: str, conversation: str) -> str:
    from atmosphere_harness._backends.redis.connection import digest

    return f"{prefix}lock:{digest(SCRIBE, conversation)}"
