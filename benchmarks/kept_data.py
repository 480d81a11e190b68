"""Kept data must not make a turn slower: per-turn and upkeep cost with 1 k to 1 M kept records.

    python benchmarks/kept_data.py [--levels 1000,100000,1000000] [--turns 200]
        [--backends postgres,redis] [--smoke]

For each backend (PostgreSQL on a fresh database, Redis on a fresh key prefix of
127.0.0.1:6379/15, both dropped at the end), the store is filled, level after level, with that
many kept finished runs (inside the keep window, a day here: their records stay, their frames
are gone) and as many closed conversations (two messages each on PostgreSQL; on Redis their
records), written in bulk in the stores' own layout. At each level:

- `turn_ms`: `--turns` short turns over HTTP (the `inflight.py` app on the fake model, a new
  set of 10 conversations in turn), p50/p90 from the request to the `complete` frame;
- `upkeep_ms`: each periodic call a replica makes, timed from this process on the real store
  (lease heartbeat, claim, expire, abandon, the memory reaper's idle scan), median of 20;
- PostgreSQL only: the sequential scans of `atmosphere_runs` and `atmosphere_conversations`
  during the level's turns (`pg_stat_user_tables`), which must stay 0.

`flat` gives the largest level's medians over the smallest's (1.0: flat). Redis keeps at most
`MAX_CONVERSATIONS` (100,000) conversations by design, so its fill stops short of the cap
(`REDIS_CONVERSATIONS`): its 1 M level is 1 M runs and 87,000 conversations. Prints one JSON
document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from inflight import (
    PATH,
    Backend,
    Server,
    Stream,
    Variant,
    exit_on_sigterm,
    raise_file_limit,
    request_bytes,
    warm_up,
)
from servers import Model

from atmosphere_harness._backends.redis.history import MAX_CONVERSATIONS
from atmosphere_harness._contracts import FEED_OWNER

KEEP = 86_400.0
"""The keep window (`ATMOSPHERE_DURABLE_RUNS_KEEP_SECONDS`) of the server and of the upkeep
measured here: a day, so the kept runs stay kept while the levels fill (a shorter window would
have `expire` delete the earlier levels' runs during the later ones, which is the rate of runs
finishing, not what is kept)."""
SPREAD = 3000
"""Kept runs finished over the last `SPREAD` seconds (and a minute)."""
LEASE = 15.0
BATCH = 50_000
REDIS_CONVERSATIONS = MAX_CONVERSATIONS - MAX_CONVERSATIONS // 8 - 500
"""Redis keeps at most `MAX_CONVERSATIONS` conversations: past it, the next new one evicts the
least recently active down to 7/8 of the cap in one script. The fill stays under that (room
for the benchmark's own), so the levels above hold that many conversations and all the runs."""


# --- filling ------------------------------------------------------------------------------------


async def fill_postgres(url: str, start: int, end: int) -> None:
    """Kept runs and closed conversations `start` to `end` (exclusive), in bulk."""
    import asyncpg

    now = time.time()
    connection = await asyncpg.connect(url)
    try:
        for low in range(start, end, BATCH):
            high = min(end, low + BATCH)
            await connection.execute(
                "INSERT INTO atmosphere_runs (run_id, path, conversation_id, user_key, "
                "session_id, message, started_at, owner, lease_until, finished_at) "
                "SELECT 'kept-' || g, $1, 'kept-' || g, '', 's', '', "
                "$2::float8 - (g % $6), $3, 0, $2::float8 - (g % $6) + 1 "
                "FROM generate_series($4::int, $5::int - 1) AS g",
                PATH,
                now - 60,
                FEED_OWNER + "gone",
                low,
                high,
                SPREAD,
            )
            await connection.execute(
                "WITH c AS (INSERT INTO atmosphere_conversations (endpoint, user_key, "
                "conversation_id, updated_at, closed_at, last_seq) SELECT $1, '', 'kept-' || g, "
                "$2::float8 - g % 86400, $2::float8, 2 FROM generate_series($3::int, $4::int - 1) "
                "AS g RETURNING id) "
                "INSERT INTO atmosphere_messages (conversation, seq, payload) "
                'SELECT c.id, s, convert_to(\'{"role":"user","content":"kept"}\', \'UTF8\') '
                "FROM c, generate_series(1, 2) AS s",
                PATH,
                now,
                low,
                high,
            )
        await connection.execute("ANALYZE")
    finally:
        await connection.close()


def fill_redis(url: str, start: int, end: int) -> None:
    """The same in Redis: run records in `runs:finished`, conversation records in the index
    of every conversation (`history:all`), each as its store writes them."""
    import redis

    from atmosphere_harness._backends.redis.connection import digest

    base, _, query = url.partition("?key_prefix=")
    prefix = query
    client = redis.Redis.from_url(base)
    now = time.time()
    try:
        for low in range(start, end, 5000):
            pipe = client.pipeline(transaction=False)
            for n in range(low, min(end, low + 5000)):
                run = f"kept-{n}"
                finished = now - 60 - n % SPREAD
                pipe.hset(
                    f"{prefix}run:{run}",
                    mapping={
                        "run_id": run,
                        "path": PATH,
                        "conversation": run,
                        "user": "",
                        "session": "s",
                        "message": "",
                        "started": finished - 1,
                        "owner": FEED_OWNER + "gone",
                        "finished": finished,
                    },
                )
                pipe.zadd(f"{prefix}runs:finished", {run: finished})
                if n >= REDIS_CONVERSATIONS:
                    continue
                name = digest(PATH, "", run)
                updated = now - n % 86400
                pipe.hset(
                    f"{prefix}h:{name}",
                    mapping={
                        "first": 1,
                        "last": 2,
                        "extracted": 2,
                        "summary_seq": 0,
                        "updated": updated,
                        "closed": 1,
                        "endpoint": PATH,
                        "user": "",
                        "conversation": run,
                        "lock": "",
                    },
                )
                pipe.zadd(f"{prefix}history:all", {name: updated})
            pipe.execute()
    finally:
        client.close()


# --- measuring ----------------------------------------------------------------------------------


async def turns(port: int, count: int) -> list[float]:
    loop = asyncio.get_running_loop()
    tag = uuid.uuid4().hex[:6]
    samples = []
    for n in range(count):
        done: asyncio.Future[str] = loop.create_future()
        data = request_bytes(port, PATH, "now echo", f"level-{tag}-{n % 10}")
        started = time.perf_counter()
        await loop.create_connection(lambda d=data, f=done: Stream(d, f), "127.0.0.1", port)
        outcome = await asyncio.wait_for(done, 60)
        if outcome != "complete":
            raise RuntimeError(f"a turn did not complete: {outcome[:300]}")
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def upkeep(kind: str, backend: Backend, calls: int = 20) -> dict[str, float]:
    """Median ms of each periodic call on the real store (opened here, as a replica would)."""
    timed: dict[str, list[float]] = {}

    async def measure(stores: dict[str, Callable[[], Awaitable[Any]]]) -> None:
        for _ in range(calls):
            for name, call in stores.items():
                started = time.perf_counter()
                await call()
                timed.setdefault(name, []).append((time.perf_counter() - started) * 1000)

    now = time.time()
    if kind == "postgres":
        from atmosphere_harness._backends.postgres import (
            PostgresDatabase,
            PostgresHistory,
            PostgresRunStore,
        )

        database = PostgresDatabase(backend.database_url, pool_max=2)
        await database.open()
        try:
            runs, history = PostgresRunStore(database), PostgresHistory(database)
            await measure(periodic(runs, history, now))
        finally:
            await database.aclose()
    else:
        from atmosphere_harness._backends.redis import RedisConnection, RedisRunStore
        from atmosphere_harness._backends.redis.history import RedisHistory

        connection = RedisConnection(backend.env["ATMOSPHERE_REDIS_URL"])
        await connection.open()
        try:
            redis_runs, redis_history = RedisRunStore(connection), RedisHistory(connection)
            await measure(periodic(redis_runs, redis_history, now))
        finally:
            await connection.aclose()
    return {name: round(statistics.median(values), 3) for name, values in timed.items()}


def periodic(runs: Any, history: Any, now: float) -> dict[str, Callable[[], Awaitable[Any]]]:
    return {
        "heartbeat": lambda: runs.heartbeat(FEED_OWNER + "bench", LEASE),
        "claim": lambda: runs.claim("bench-owner", LEASE, 8),
        "expire": lambda: runs.expire(now - KEEP),
        "abandon": lambda: runs.abandon("the replica running it stopped", 8),
        "idle": lambda: history.idle(now - 1800, 256),
    }


async def seq_scans(url: str) -> dict[str, int]:
    import asyncpg

    connection = await asyncpg.connect(url)
    try:
        rows = await connection.fetch(
            "SELECT relname, seq_scan FROM pg_stat_user_tables WHERE relname = ANY($1)",
            ["atmosphere_runs", "atmosphere_conversations"],
        )
    finally:
        await connection.close()
    return {row["relname"]: int(row["seq_scan"]) for row in rows}


def level_figures(
    kind: str, backend: Backend, server: Server, count: int, args: argparse.Namespace
) -> dict[str, Any]:
    before = asyncio.run(seq_scans(backend.database_url)) if kind == "postgres" else {}
    samples = asyncio.run(turns(server.port, args.turns))
    after = asyncio.run(seq_scans(backend.database_url)) if kind == "postgres" else {}
    ordered = sorted(samples)
    figures: dict[str, Any] = {
        "kept": count,
        "turn_ms": {
            "p50": round(statistics.median(ordered), 3),
            "p90": round(ordered[int(len(ordered) * 0.9) - 1], 3),
            "n": len(ordered),
        },
        "upkeep_ms": asyncio.run(upkeep(kind, backend)),
    }
    if kind == "postgres":
        figures["seq_scans_during_turns"] = {
            table: after.get(table, 0) - before.get(table, 0) for table in after
        }
    return figures


def run_backend(kind: str, levels: list[int], args: argparse.Namespace, root: Path) -> Any:
    model = Model(20.0, 1.0)
    try:
        try:
            backend = Backend(kind).__enter__()
        except Exception as exc:
            return {"skipped": f"{kind} unavailable: {exc.__class__.__name__}: {exc}"}
        try:
            env = {**backend.env, "ATMOSPHERE_DURABLE_RUNS_KEEP_SECONDS": str(int(KEEP))}
            server = Server(Variant(kind, kind), model.port, env, root / kind)
            try:
                warm_up(server.port)
                asyncio.run(turns(server.port, 20))
                found: dict[str, Any] = {}
                kept = 0
                for level in levels:
                    started = time.monotonic()
                    if kind == "postgres":
                        asyncio.run(fill_postgres(backend.database_url, kept, level))
                    else:
                        fill_redis(backend.env["ATMOSPHERE_REDIS_URL"], kept, level)
                    kept = level
                    filled = round(time.monotonic() - started, 1)
                    found[str(level)] = level_figures(kind, backend, server, level, args)
                    found[str(level)]["fill_seconds"] = filled
                    print(
                        f"kept_data {kind} {level}: turn p50 "
                        f"{found[str(level)]['turn_ms']['p50']} ms, upkeep "
                        f"{found[str(level)]['upkeep_ms']}",
                        file=sys.stderr,
                    )
            finally:
                server.close()
        finally:
            backend.__exit__(None, None, None)
    finally:
        model.close()
    small, large = found[str(levels[0])], found[str(levels[-1])]
    return {
        "levels": found,
        "flat": {
            "turn_p50_x": round(large["turn_ms"]["p50"] / small["turn_ms"]["p50"], 2),
            "upkeep_x": {
                name: round(large["upkeep_ms"][name] / max(value, 1e-3), 2)
                for name, value in small["upkeep_ms"].items()
            },
        },
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(level) for level in args.levels.split(",") if level]
    root = Path(tempfile.mkdtemp(prefix="bench-kept-"))
    try:
        found = {
            kind: run_backend(kind, levels, args, root) for kind in args.backends.split(",") if kind
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "benchmark": "kept_data",
        "workload": {"levels": levels, "turns": args.turns},
        "backends": found,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1000,100000,1000000")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--backends", default="postgres,redis")
    parser.add_argument("--smoke", action="store_true", help="tiny levels: a check, not figures")
    parsed = parser.parse_args()
    if parsed.smoke:
        parsed.levels, parsed.turns = "100,1000", 10
    raise_file_limit()
    exit_on_sigterm()
    print(json.dumps(main(parsed), indent=1))
