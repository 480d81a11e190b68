"""Durable runs on Redis over two real replicas: the PostgreSQL takeover tests, on Redis alone.

Replica A is SIGKILLed inside a tool / while its run waits for an approval, and replica B takes
the run over once A's lease ran out (measured on Redis's clock) and completes it, the model
never asked again for a journalled turn; B also replays and follows a run executing on A. The
tests are `test_postgres_durable_replicas`'s, run with `ATMOSPHERE_REDIS_URL` (db 13, a random
key prefix deleted afterwards) instead of a PostgreSQL database.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.scaleout.test_postgres_durable_replicas import (  # noqa: F401
    Replicas,
    test_a_prompt_holding_a_nul_is_journalled_and_resumed_whole,
    test_a_superseded_run_closes_its_shared_approval,
    test_an_approval_answered_on_b_while_a_is_dead_is_taken_over_with_the_run,
    test_events_on_b_replay_and_follow_a_run_executing_on_a,
    test_replica_b_takes_over_a_run_of_killed_replica_a,
)

from .redis_service import url_for

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
