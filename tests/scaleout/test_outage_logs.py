"""What a replica logs while its state backend is down: one line per failed request, with the
cause, and a traceback per kind of fault, not per request.

A real server process (the scale-out app, `tests.scaleout.redis_app`) runs on a Redis or a
PostgreSQL of the test's own (never the shared ones), under a small load over HTTP; the test
stops that backend for a few seconds, starts it again, waits until prompts complete again, and
counts what the server logged from the moment it stopped.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.reliability.server import ServerProcess
from tests.scaleout.postgres_service import PrivatePostgres
from tests.scaleout.redis_app import PATH
from tests.scaleout.redis_service import PrivateRedis

pytestmark = pytest.mark.services

CLIENTS = 4
OUTAGE_SECONDS = 3.0
WAIT = 60.0
"""Hang guard for the recovery (not a speed expectation)."""
ONCE_PER_KIND = 25
"""Log records beyond one per failed request: each kind of fault (where it is logged, what
was raised where) says itself once per minute (the run journal's upkeep, a lock release, the
driver's reconnection), whatever the number of requests."""


class Backend:
    """The test's own server of one kind, which it may stop and start."""

    def __init__(self, kind: str, directory: Path) -> None:
        self.kind = kind
        self.redis: PrivateRedis | None = None
        self.postgres: PrivatePostgres | None = None
        if kind == "redis":
            self.redis = PrivateRedis(directory).start()
            self.env = {"ATMOSPHERE_REDIS_URL": self.redis.url("outage:")}
        else:
            self.postgres = PrivatePostgres().start()
            self.env = {"ATMOSPHERE_POSTGRES_URL": self.postgres.url()}

    def stop(self) -> None:
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.stop()

    def start(self) -> None:
        if self.redis is not None:
            self.redis.start()
        if self.postgres is not None:
            self.postgres.start()

    def remove(self) -> None:
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.remove()


@pytest.fixture(params=[("redis", "false"), ("postgres", "true")], ids=["redis", "postgres"])
def replica(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Backend, ServerProcess]]:
    kind, durable = request.param
    backend = Backend(kind, tmp_path)
    try:
        env = {**backend.env, "ATMOSPHERE_DURABLE_RUNS_ENABLED": durable}
        server = ServerProcess("redis", tmp_path / "workspace", tmp_path / "server.log", env)
        server.start()
        try:
            yield backend, server
        finally:
            server.kill()
    finally:
        backend.remove()


async def prompt(client: httpx2.AsyncClient, url: str, conversation: str, n: int) -> str:
    """One prompt's outcome: `complete`, `error` (its stream ended with an error frame) or the
    HTTP status it was refused with."""
    body = {"message": f"hello {n}", "conversationId": conversation}
    try:
        async with client.stream("POST", url + PATH, json=body, headers={"X-User-Id": "u"}) as r:
            if r.status_code != 200:
                await r.aread()
                return str(r.status_code)
            last = ""
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    last = line
            return "complete" if '"complete"' in last else "error"
    except httpx2.TransportError as exc:
        return type(exc).__name__


async def test_an_outage_logs_a_line_per_failed_request_and_a_traceback_per_fault(
    replica: tuple[Backend, ServerProcess],
) -> None:
    backend, server = replica
    outcomes: collections.Counter[str] = collections.Counter()
    counting = False
    stop = asyncio.Event()

    async def load(client_id: int) -> None:
        async with httpx2.AsyncClient(timeout=WAIT) as client:
            for n in range(1_000_000):
                if stop.is_set():
                    return
                outcome = await prompt(client, server.url, f"c{client_id}-{n % 3}", n)
                if counting:
                    outcomes[outcome] += 1
                await asyncio.sleep(0.05)

    clients = [asyncio.create_task(load(n)) for n in range(CLIENTS)]
    try:
        async with httpx2.AsyncClient(timeout=WAIT) as probe:
            assert await prompt(probe, server.url, "probe", 0) == "complete"
            before = len(server.log_path.read_text(encoding="utf-8").splitlines())
            counting = True
            await asyncio.to_thread(backend.stop)
            await asyncio.sleep(OUTAGE_SECONDS)
            await asyncio.to_thread(backend.start)
            async with asyncio.timeout(WAIT):
                n = 1
                while await prompt(probe, server.url, "probe", n) != "complete":
                    n += 1
                    await asyncio.sleep(0.1)
            stop.set()
            await asyncio.gather(*clients)
    finally:
        stop.set()
        for task in clients:
            task.cancel()
    lines = server.log_path.read_text(encoding="utf-8").splitlines()[before:]
    failed = sum(count for outcome, count in outcomes.items() if outcome != "complete")
    assert failed > 0, outcomes  # the outage was felt
    records = [line for line in lines if line.startswith(("WARNING", "ERROR", "CRITICAL"))]
    tracebacks = sum(line.startswith("Traceback (most recent call last)") for line in lines)
    failures = [line for line in records if "prompt run failed" in line]
    assert len(failures) <= failed, "one line per failed request"
    assert all("error=" in line for line in failures), failures[:3]  # with its cause
    assert len(records) <= failed + ONCE_PER_KIND, collections.Counter(r[:90] for r in records)
    assert tracebacks <= ONCE_PER_KIND, f"{tracebacks} tracebacks for {failed} failed requests"
