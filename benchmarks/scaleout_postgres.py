"""The PostgreSQL state backend beside the embedded default, in one run: what it costs per turn
and how fast a plan update reaches a viewer on another replica.

    python benchmarks/scaleout_postgres.py [--turns 300] [--updates 200] [--rounds 3]
        [--floor-turns 1000]

Servers are uvicorn subprocesses (one worker each) on one workspace root; with PostgreSQL they
share a database this script creates on 127.0.0.1:5432 and drops at the end. The model is
scripted: a turn answers at once (so the figures are the harness's and the backend's), a `plan`
prompt calls `write_todos` once with the server's `time.monotonic_ns()` in the plan's goal
(system-wide on Linux, so the client's clock reads the same time base).

Figures (one JSON document on stdout):

- `turn_ms`: client-side latency of a sequential turn (POST -> `complete`), p50/p90/p99, for
  `embedded`, `postgres` (the server's default `synchronous_commit=on`: each stored turn waits
  for its WAL flush) and `postgres_synchronous_commit_off` (the URL's `?synchronous_commit=off`:
  the embedded SQLite's durability class, see `docs/scale-out.md`) and `postgres_durable_runs`
  (durable runs on: the run journalled in PostgreSQL), measured in rounds so background load
  hits all alike; `added_median_ms_*` is the difference to embedded (no other replica follows
  these runs, so the run frame feed writes nothing);
- `floor`: the turn's two waits from a bare asyncpg client in this process (`--floor-turns`
  times, alone), each a stand-in of the stores' statement on the same kind of connection and
  with the same commit: the claim writes a row without waiting for the WAL flush and takes an
  advisory lock on a connection of its own, the append and the run's end insert a row into a
  scratch table and update another in one statement through a pool and wait for the flush (the
  server's `synchronous_commit`); the unlock follows on the lock connection, not timed (the
  turn does not wait for it); median and p90, `wal_flush_ms` (an append with
  `synchronous_commit` on minus off: the disk's share), `select_1_median_ms` (one bare round
  trip), and `added_over_floor_ms`: the added median minus the floor's, what is ours rather
  than PostgreSQL's protocol and disk;
- `turns_per_s`: 16 concurrent clients, for embedded (1 replica) and PostgreSQL with 1 and 2
  replicas (the load generator shares the machine's cores, so the 2-replica ratio is no goal);
- `round_trips`: the round trips one turn makes to PostgreSQL, counted on the wire by a proxy
  between the server and PostgreSQL (`tests/scaleout/wire.py`), by purpose, with the time
  PostgreSQL took for each as the proxy saw it (`service_median_ms`); the list
  `docs/scale-out-postgres.md` publishes;
- `plan_update_ms`: from `write_todos` in the model to the `plan-update` bytes at a viewer,
  p50/p99: embedded (viewer on the same server) and PostgreSQL (writer on A, viewer on B,
  through `LISTEN/NOTIFY`; target: p99 < 50 ms).

When PostgreSQL is absent the document says so (`"skipped"`) instead of failing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
from common import free_port, machine, wait_until_serving
from fastapi import FastAPI

from atmosphere_harness import (
    ModelRequest,
    ScriptedRuntime,
    StreamingSession,
    ToolCall,
    agent,
    create_harness_router,
    prompt,
)

AGENT = "bench"
PATH = f"/atmosphere/agent/{AGENT}"
PG = "postgresql://postgres@127.0.0.1:5432"


# --- the server subprocess ----------------------------------------------------------------------


@agent(name=AGENT)
class Bench:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


def serve(port: int, workspace: str) -> None:
    def turn(request: ModelRequest) -> str | list[ToolCall]:
        last = request.messages[-1]
        if last.role != "user" or not last.content.startswith("plan"):
            return "ok"
        todos = [{"content": f"step {i}", "status": "pending"} for i in range(5)]
        return [ToolCall("write_todos", {"todos": todos, "goal": str(time.monotonic_ns())})]

    os.environ["ATMOSPHERE_WORKSPACE_ROOT"] = workspace
    os.environ["ATMOSPHERE_AI_CONVERSATION_IDLE_TIMEOUT"] = "0"
    app = FastAPI()
    app.include_router(create_harness_router(agents=[Bench], runtime=ScriptedRuntime(default=turn)))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


class Server:
    def __init__(self, workspace: Path, url: str | None, *, durable: bool = False) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ATMOSPHERE_")}
        if url:
            env["ATMOSPHERE_POSTGRES_URL"] = url
        if durable:
            env["ATMOSPHERE_DURABLE_RUNS_ENABLED"] = "true"
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.port), str(workspace)], env=env
        )
        self.base = f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Server:
        async with httpx2.AsyncClient(base_url=self.base) as http:
            await wait_until_serving(http, self.process)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.process.terminate()
        # Off the loop: a proxy on this loop (`round_trips`) must keep serving the shutdown's
        # last statements, or the server waits on it and this wait on the server.
        await asyncio.to_thread(self.process.wait, 30)


# --- measuring ----------------------------------------------------------------------------------


async def one_turn(http: httpx2.AsyncClient, base: str, message: str, conversation: str) -> None:
    body = {"message": message, "conversationId": conversation}
    async with http.stream("POST", base + PATH, json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:") and '"event":"complete"' in line.replace(" ", ""):
                return
            if line.startswith("data:") and '"event":"error"' in line.replace(" ", ""):
                raise RuntimeError(line)


async def sequential_turns(base: str, turns: int) -> list[float]:
    samples: list[float] = []
    async with httpx2.AsyncClient(timeout=60) as http:
        conversation = ""
        for i in range(turns):
            if i % 10 == 0:
                conversation = f"seq-{uuid.uuid4().hex[:8]}"
            started = time.perf_counter()
            await one_turn(http, base, "hello", conversation)
            samples.append((time.perf_counter() - started) * 1000)
    return samples


async def throughput(bases: list[str], turns: int, clients: int = 16) -> float:
    queue = list(range(turns))

    async def client(index: int, http: httpx2.AsyncClient) -> None:
        conversation = f"tp-{uuid.uuid4().hex[:8]}"
        n = 0
        while queue:
            queue.pop()
            await one_turn(http, bases[(index + n) % len(bases)], "hello", conversation)
            n += 1

    limits = httpx2.Limits(max_connections=clients * 2)
    async with httpx2.AsyncClient(timeout=60, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(i, http) for i in range(clients)))
        return turns / (time.perf_counter() - started)


async def plan_latency(writer: str, viewer: str, updates: int) -> list[float]:
    conversation = f"plan-{uuid.uuid4().hex[:8]}"
    received: list[float] = []
    ready = asyncio.Event()

    async def watch(http: httpx2.AsyncClient) -> None:
        url = f"{viewer}{PATH}/plan/events?conversationId={conversation}"
        async with http.stream("GET", url) as response:
            async for line in response.aiter_lines():
                if line.startswith("event: plan-snapshot"):
                    ready.set()
                if line.startswith("data:") and '"goal"' in line:
                    now = time.monotonic_ns()
                    goal = json.loads(line[5:]).get("goal")
                    if isinstance(goal, str) and goal.isdigit():
                        received.append((now - int(goal)) / 1e6)
                        if len(received) >= updates:
                            return

    async with httpx2.AsyncClient(timeout=60) as http:
        # A conversation is its first prompt's: the plan stream of an unused id answers 404.
        await one_turn(http, writer, "hello", conversation)
        watcher = asyncio.create_task(watch(http))
        await asyncio.wait_for(ready.wait(), 30)
        for _ in range(updates):
            await one_turn(http, writer, "plan", conversation)
        await asyncio.wait_for(watcher, 30)
    return received


async def round_trips(root: Path, url: str, turns: int = 40) -> dict[str, Any]:
    """What one turn asks PostgreSQL, counted by a proxy in front of it (after a warm-up)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tests/
    from tests.scaleout.wire import WireCounter

    async with WireCounter("127.0.0.1", 5432) as proxy:
        through = url.replace(":5432/", f":{proxy.port}/")
        async with Server(root, through) as server:
            await sequential_turns(server.base, 20)
            await asyncio.sleep(0.3)
            proxy.reset()
            await sequential_turns(server.base, turns)
            await asyncio.sleep(0.3)  # the last lock release runs after the `complete` frame
            return proxy.summary(turns, ignore=("SELECT 1",))


# The floor: what a turn waits for PostgreSQL, from a bare asyncpg client in this process, each
# wait a stand-in of the statement the stores send, on the same kind of connection (the lock
# connection, `asyncpg.connect`; the pool, `asyncpg.create_pool` without its reset query) and
# with the same commit: the claim writes a row committed without waiting for the WAL flush
# (`synchronous_commit` off for its own transaction, as the store's is) and takes an advisory
# lock; the turn's append and the run's end insert a row and update another in one statement
# committed with the server's default `synchronous_commit`; the unlock follows, not waited for
# by the turn (sent after the timed part).
FLOOR_TABLES = (
    "CREATE TABLE bench_floor_status (id int PRIMARY KEY, n bigint NOT NULL);"
    "INSERT INTO bench_floor_status VALUES (1, 0);"
    "CREATE TABLE bench_floor_turns (id bigserial PRIMARY KEY, conversation text NOT NULL,"
    " payload bytea NOT NULL)"
)
RELAXED = "relaxed AS (SELECT set_config('synchronous_commit', 'off', true))"
STATUS = "status AS (UPDATE bench_floor_status SET n = n + 1 FROM relaxed WHERE id = 1 RETURNING n)"
FLOOR_CLAIM = f"WITH {RELAXED}, {STATUS} SELECT pg_try_advisory_lock($1), (SELECT n FROM status)"
FLOOR_APPEND = "INSERT INTO bench_floor_turns (conversation, payload) VALUES ($1, $2)"
FLOOR_APPEND_END = (
    "WITH status AS (UPDATE bench_floor_status SET n = n + 1 WHERE id = 1 RETURNING n) "
    "INSERT INTO bench_floor_turns (conversation, payload) VALUES ($1, $2)"
)
FLOOR_UNLOCK = "SELECT pg_advisory_unlock($1)"
FLOOR_APPEND_RELAXED = (
    f"WITH {RELAXED} INSERT INTO bench_floor_turns (conversation, payload)"
    " SELECT $1, $2 FROM relaxed"
)


async def _no_reset(_connection: Any) -> None:
    """The stores' pool skips asyncpg's reset query on release (one round trip less)."""


async def floor(url: str, iterations: int) -> dict[str, Any]:
    """The waits of a turn (claim, then append and end with its WAL flush) from a bare
    client, and the WAL flush alone (the append committed with `synchronous_commit` on minus
    off)."""
    import asyncpg

    from atmosphere_harness._backends.postgres.locks import lock_session

    lock = await asyncpg.connect(url, server_settings=lock_session())
    pool = await asyncpg.create_pool(url, min_size=1, max_size=1, reset=_no_reset)
    payload = b"x" * 256  # about a one-answer turn's two messages, encoded
    try:
        await lock.execute(FLOOR_TABLES)
        setting = await lock.fetchval("SHOW synchronous_commit")

        async def append(statement: str) -> float:
            started = time.perf_counter()
            async with pool.acquire() as connection:
                await connection.execute(statement, "c", payload)
            return (time.perf_counter() - started) * 1000

        async def turn() -> float:
            started = time.perf_counter()
            await lock.fetchrow(FLOOR_CLAIM, 42)
            await append(FLOOR_APPEND_END)
            waited = (time.perf_counter() - started) * 1000
            await lock.fetchval(FLOOR_UNLOCK, 42)  # (the turn does not wait for it)
            return waited

        for _ in range(min(iterations, 50)):  # warm-up: statements prepared, pages cached
            await turn()
        turns = [await turn() for _ in range(iterations)]
        flushed: list[float] = []
        relaxed: list[float] = []
        for _ in range(iterations):  # alternated, so both meet the same disk
            flushed.append(await append(FLOOR_APPEND))
            relaxed.append(await append(FLOOR_APPEND_RELAXED))
        trivial = []
        for _ in range(iterations):
            started = time.perf_counter()
            await lock.fetchval("SELECT 1")
            trivial.append((time.perf_counter() - started) * 1000)
    finally:
        await pool.close()
        await lock.close()
    waits = quantiles(turns)
    return {
        "what": "claim (lock connection, no WAL flush), then append and end in one statement "
        "(pool, server default commit); the unlock (lock connection) after, not timed",
        "synchronous_commit": setting,
        "iterations": iterations,
        "median_ms": waits["p50"],
        "p90_ms": waits["p90"],
        "wal_flush_ms": round(statistics.median(flushed) - statistics.median(relaxed), 3),
        "append_median_ms": round(statistics.median(flushed), 3),
        "append_synchronous_commit_off_median_ms": round(statistics.median(relaxed), 3),
        "select_1_median_ms": round(statistics.median(trivial), 3),
    }


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50": round(statistics.median(ordered), 3),
        "p90": round(ordered[int(len(ordered) * 0.9) - 1], 3),
        "p99": round(ordered[max(int(len(ordered) * 0.99) - 1, 0)], 3),
        "n": len(ordered),
    }


async def admin(statement: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(f"{PG}/test", timeout=5)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    name = f"atmo_bench_{uuid.uuid4().hex[:8]}"
    try:
        await admin(f'CREATE DATABASE "{name}"')
    except Exception as exc:
        return {"skipped": f"PostgreSQL unavailable on 127.0.0.1:5432: {exc}"}
    url = f"{PG}/{name}"
    result: dict[str, Any] = {"machine": machine()}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            embedded_root, pg_root = Path(tmp, "embedded"), Path(tmp, "pg")
            embedded_root.mkdir()
            pg_root.mkdir()
            async with AsyncExitStack() as stack:
                embedded = await stack.enter_async_context(Server(embedded_root, None))
                a = await stack.enter_async_context(Server(pg_root, url))
                b = await stack.enter_async_context(Server(pg_root, url))
                relaxed = await stack.enter_async_context(
                    Server(pg_root, url + "?synchronous_commit=off")
                )
                durable = await stack.enter_async_context(Server(pg_root, url, durable=True))
                bases = {
                    "embedded": embedded.base,
                    "postgres": a.base,
                    "postgres_synchronous_commit_off": relaxed.base,
                    "postgres_durable_runs": durable.base,
                }
                for base in (*bases.values(), b.base):  # warm-up
                    await sequential_turns(base, 20)
                turns: dict[str, list[float]] = {key: [] for key in bases}
                per_round = max(args.turns // args.rounds, 1)
                for round_ in range(args.rounds):
                    order = list(bases.items())
                    if round_ % 2:
                        order.reverse()  # neither side always goes first
                    for key, base in order:
                        turns[key] += await sequential_turns(base, per_round)
                turn_ms: dict[str, Any] = {key: quantiles(value) for key, value in turns.items()}
                for key in ("postgres", "postgres_synchronous_commit_off", "postgres_durable_runs"):
                    turn_ms[f"added_median_ms_{key}"] = round(
                        turn_ms[key]["p50"] - turn_ms["embedded"]["p50"], 3
                    )
                result["turn_ms"] = turn_ms
                floor_ms = await floor(url, args.floor_turns)
                floor_ms["added_median_ms"] = turn_ms["added_median_ms_postgres"]
                floor_ms["added_over_floor_ms"] = round(
                    floor_ms["added_median_ms"] - floor_ms["median_ms"], 3
                )
                result["floor"] = floor_ms
                result["turns_per_s"] = {
                    "embedded_1_replica": round(await throughput([embedded.base], args.turns), 1),
                    "postgres_1_replica": round(await throughput([a.base], args.turns), 1),
                    "postgres_2_replicas": round(await throughput([a.base, b.base], args.turns), 1),
                }
                result["round_trips"] = await round_trips(pg_root, url, max(min(args.turns, 40), 4))
                result["plan_update_ms"] = {
                    "embedded_same_server": quantiles(
                        await plan_latency(embedded.base, embedded.base, args.updates)
                    ),
                    "postgres_a_to_b": quantiles(await plan_latency(a.base, b.base, args.updates)),
                }
    finally:
        await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), sys.argv[3])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--floor-turns", type=int, default=1000)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
