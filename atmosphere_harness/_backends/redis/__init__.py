"""The Redis backend (`ATMOSPHERE_REDIS_URL`, extra `[redis]`): N replicas on one Redis.

`redis_backends(settings)` is Redis alone: it holds every piece of shared state (conversation
locks, history, long-term memory, plans, approvals) and carries the live fan-out (plan updates
on Streams, approval answers routed to the replica whose run waits). `with_redis_events(backends,
settings)` keeps another backend's state (PostgreSQL) and moves the live fan-out to Redis: plan
updates and, with durable runs off, the run frame feed.

One `RedisConnection` (pool + key prefix) is shared by every part and listed in
`StateBackends.resources`: the host pings it at start-up, so an unreachable URL fails there, and
closes it last. With durable runs on, the run journal is `RedisRunStore` behind
`durable.DurableRuns` (a resumed run's approvals are reopened under their id); with them
off, the same store is the frame feed (any replica follows a run another one executes).

Needs a standalone Redis 7 or later (Sentinel works; Cluster does not: the scripts touch keys
they compute).
"""

from __future__ import annotations

import dataclasses

from ..._errors import RedisUnavailable
from ..._settings import HarnessSettings
from ..state import StateBackends, shared_runs
from .approvals import RedisApprovalStore
from .bus import RedisPlanBus
from .connection import RedisConnection
from .control import RedisRunRegistry
from .history import RedisHistory
from .locks import RedisConversationLocks
from .long_term import RedisLongTermMemory
from .plans import RedisPlanStore
from .prompt_keys import RedisPromptKeys
from .runs import RedisRunStore

__all__ = [
    "RedisApprovalStore",
    "RedisConnection",
    "RedisConversationLocks",
    "RedisHistory",
    "RedisLongTermMemory",
    "RedisPlanBus",
    "RedisPlanStore",
    "RedisRunRegistry",
    "RedisRunStore",
    "RedisUnavailable",
    "redis_backends",
    "with_redis_events",
]


def _connection(settings: HarnessSettings) -> RedisConnection:
    url = settings.groups.backends.redis_url
    if not url:
        raise ValueError("ATMOSPHERE_REDIS_URL is not set")
    return RedisConnection(url)


def redis_backends(settings: HarnessSettings) -> StateBackends:
    """Every piece of shared state in the Redis of `ATMOSPHERE_REDIS_URL`."""
    connection = _connection(settings)
    bus = RedisPlanBus(connection)
    connection.on_close(bus.aclose)
    backends = StateBackends(
        state="redis",
        events="redis",
        # A dead replica's locks lapse within a lease, as its runs' leases do.
        locks=RedisConversationLocks(
            connection, ttl=settings.groups.backends.durable_runs_lease_seconds
        ),
        plan_stores=lambda root: RedisPlanStore.for_root(connection, root),
        plan_bus=bus,
        approvals=RedisApprovalStore(connection),
        run_registry=RedisRunRegistry(connection),
        history=RedisHistory(connection),
        long_term_memory=RedisLongTermMemory(
            connection, max_facts_per_user=settings.groups.memory.max_facts
        ),
        prompt_keys=RedisPromptKeys(connection),
        resources=[connection],
    )
    backends.runs = shared_runs(RedisRunStore(connection), settings)
    return backends


def with_redis_events(backends: StateBackends, settings: HarnessSettings) -> StateBackends:
    """`backends` with its live fan-out on Redis (`events="redis"`); its state stays.

    Redis carries the plan updates and, with durable runs off, the run frame feed (a Redis
    write adds next to nothing to a turn, where a feed write to PostgreSQL is a statement per
    group). With durable runs on, the journal stays with `backends`: it is state, and the
    system of record holds it. Approvals stay with `backends` too: their answer and its wake-up
    commit in one PostgreSQL transaction, so no wake-up can be lost between two systems. The
    Redis pool joins its resources, opened after theirs.
    """
    connection = _connection(settings)
    bus = RedisPlanBus(connection)
    connection.on_close(bus.aclose)
    durable = settings.groups.backends.durable_runs
    return dataclasses.replace(
        backends,
        events="redis",
        plan_bus=bus,
        runs=backends.runs if durable else shared_runs(RedisRunStore(connection), settings),
        resources=[*backends.resources, connection],
    )
