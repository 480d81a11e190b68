"""The Redis backend against the embedded default, side by side in one run.

    python benchmarks/redis_backend.py [--turns 200] [--rounds 5] [--updates 500]
        [--url redis://127.0.0.1:6379/15] [--floor-turns 1000]

1. **Per-turn cost over HTTP.** The scale-out test app (`tests.scaleout.redis_app`, one agent
   with the whole harness on a scripted model: one model call, no tool) in a uvicorn process of
   its own: on the embedded stores (SQLite + files) and with `ATMOSPHERE_REDIS_URL`, each with
   durable runs off and on (`ATMOSPHERE_DURABLE_RUNS_ENABLED`: the run journalled in SQLite or
   in Redis). A client sends `--turns` prompts one after another (10 conversations, in turn),
   and times each from the POST to the `complete` frame. The servers run side by side and the
   client alternates between them round by round (`--rounds`, the order turned each round), so
   load from elsewhere on the machine hits all alike. Reported: median and p90 per turn, and the
   median each adds to the embedded one without durable runs (`added_median_ms_*`). No other
   replica follows these runs, so the run frame feed writes nothing.
   **The floor** (`floor`): what a turn waits for from Redis, from a bare client in this
   process: two `EVALSHA` of a one-`INCR` script, one after another, on one connection of
   redis-py's asyncio client with hiredis, `--floor-turns` times, alone; median and p90, a
   `PING`'s median, and `added_over_floor_ms`: the added median minus the floor's, what is ours
   rather than Redis's round trips.
2. **Throughput**, turns/s with 16 concurrent conversations: embedded with one replica, Redis
   with one and with two replicas (the load spread over both). The load generator shares the
   machine's cores with the servers, so the 2-replica figure is no scaling claim.
3. **Round trips per turn**, counted on the wire by a proxy between the server and Redis
   (`tests/scaleout/wire.py`): each command or script a turn sends, by purpose, with the time
   Redis took as the proxy saw it; without and with durable runs. The list
   `docs/scale-out-redis.md` publishes.
4. **Plan fan-out between replicas.** A `RedisPlanBus` on each of two connections (two
   replicas' buses): one publishes `--updates` plans, one after another, a viewer on the other
   records when each arrives; the same with one `InProcessPlanBus` (the embedded, one-process
   bus). Reported: publish -> receive latency p50/p99.

Prints one JSON document. Keys go under a random `key_prefix` on the given database and are
deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx2
import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from atmosphere_harness._backends.redis import RedisConnection, RedisPlanBus  # noqa: E402
from atmosphere_harness._planning.bus import InProcessPlanBus, PlanEventBus  # noqa: E402
from tests.reliability.server import ServerProcess  # noqa: E402
from tests.scaleout.redis_app import PATH  # noqa: E402

CONVERSATIONS = 10


def delete_prefix(prefix: str, *, db: int) -> None:
    """Remove every key under `prefix`. Here, not imported from the tests' Redis helpers: those
    import pytest, which the `bench` extra (`make bench`'s venv) does not install."""
    client = redis.Redis(host="127.0.0.1", port=REDIS_PORT, db=db)
    try:
        for key in client.scan_iter(match=prefix + "*", count=1000):
            client.unlink(key)
    finally:
        client.close()


REDIS_PORT = 6379
CONCURRENCY = 16


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def one_turn(client: httpx2.AsyncClient, message: str, conversation: str) -> float:
    started = time.perf_counter()
    body = {"message": message, "conversationId": conversation}
    async with client.stream("POST", PATH, json=body, headers={"X-User-Id": "bench"}) as response:
        assert response.status_code == 200, response.status_code
        async for line in response.aiter_lines():
            if line.startswith("data:") and '"event":"complete"' in line.replace(" ", ""):
                return (time.perf_counter() - started) * 1000
            if line.startswith("data:") and '"event":"error"' in line.replace(" ", ""):
                raise RuntimeError(line)
    raise RuntimeError("stream ended without a complete frame")


def start(workspace: Path, log: Path, url: str | None, *, durable: bool = False) -> ServerProcess:
    env = {
        "ATMOSPHERE_AI_HARNESS_ENABLED": "true",
        # Explicit: `enabled=true` alone would turn durable runs on.
        "ATMOSPHERE_DURABLE_RUNS_ENABLED": "true" if durable else "false",
    }
    if url:
        env["ATMOSPHERE_REDIS_URL"] = url
    return ServerProcess("redis", workspace, log, env).start()


SERVERS = {
    # name: (uses Redis, durable runs)
    "embedded": (False, False),
    "redis": (True, False),
    "embedded_durable_runs": (False, True),
    "redis_durable_runs": (True, True),
}


async def per_turn(root: Path, url: str, turns: int, rounds: int) -> dict[str, Any]:
    servers = {
        name: start(root / name, root / f"{name}.log", url if redis else None, durable=durable)
        for name, (redis, durable) in SERVERS.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in servers}
    clients = {
        name: httpx2.AsyncClient(base_url=server.url, timeout=60)
        for name, server in servers.items()
    }
    try:
        for client in clients.values():  # warm-up: imports, first connections, scripts loaded
            for n in range(10):
                await one_turn(client, f"warm {n}", f"warm-{n % 2}")
        per_round = max(1, turns // rounds)
        names = list(clients)
        for round_ in range(rounds):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                for n in range(per_round):
                    cid = f"turns-{round_}-{n % CONVERSATIONS}"
                    samples[name].append(await one_turn(clients[name], f"turn {n}", cid))
    finally:
        for client in clients.values():
            await client.aclose()
        for server in servers.values():
            server.stop()
    result: dict[str, Any] = {
        name: {
            "turns": len(values),
            "median_ms": round(statistics.median(values), 3),
            "p90_ms": round(percentile(values, 0.9), 3),
        }
        for name, values in samples.items()
    }
    base = result["embedded"]["median_ms"]
    result["added_median_ms"] = round(result["redis"]["median_ms"] - base, 3)
    for name in ("embedded_durable_runs", "redis_durable_runs"):
        result[f"added_median_ms_{name}"] = round(result[name]["median_ms"] - base, 3)
    result["durable_runs_added_median_ms_redis"] = round(
        result["redis_durable_runs"]["median_ms"] - result["redis"]["median_ms"], 3
    )
    return result


def script_names() -> dict[str, str]:
    """SHA-1 -> name of every Lua script a turn may run (ours and redis-py's lock's)."""
    from redis.asyncio.lock import Lock

    from atmosphere_harness._backends.redis import control, history, locks, long_term, owners, runs
    from tests.scaleout.wire import script_names as names_in

    found = {
        **names_in(locks),
        **names_in(history),
        **names_in(long_term),
        **names_in(runs),
        **names_in(owners),
        **names_in(control),
    }
    for name in ("LUA_RELEASE_SCRIPT", "LUA_REACQUIRE_SCRIPT", "LUA_EXTEND_SCRIPT"):
        found[hashlib.sha1(getattr(Lock, name).encode()).hexdigest()] = f"Lock.{name}"
    return found


async def round_trips(root: Path, url: str, turns: int) -> dict[str, Any]:
    """What one turn asks Redis, counted by a proxy in front of it (after a warm-up)."""
    from tests.scaleout.wire import WireCounter

    found: dict[str, Any] = {}
    for name, durable in (("state", False), ("with_durable_runs", True)):
        async with WireCounter("127.0.0.1", REDIS_PORT, redis_scripts=script_names()) as proxy:
            through = url.replace(f":{REDIS_PORT}/", f":{proxy.port}/")
            server = await asyncio.to_thread(
                start, root / f"rt-{name}", root / f"rt-{name}.log", through, durable=durable
            )
            try:
                async with httpx2.AsyncClient(base_url=server.url, timeout=60) as client:
                    for n in range(10):
                        await one_turn(client, f"warm {n}", f"rt-{n % 2}")
                    await asyncio.sleep(0.3)
                    proxy.reset()
                    for n in range(turns):
                        await one_turn(client, f"turn {n}", f"rt-{n % 2}")
                    await asyncio.sleep(0.3)  # the last lock release runs after `complete`
                found[name] = proxy.summary(turns, ignore=("PING",))  # not the shutdown's
            finally:
                await asyncio.to_thread(server.stop)
    return found


FLOOR_SCRIPT = "return redis.call('INCR', KEYS[1])"


async def floor(url: str, prefix: str, iterations: int) -> dict[str, Any]:
    """What a turn waits for Redis, from a bare client in this process: two `EVALSHA` of a
    trivial script, one after another, on one connection of redis-py's asyncio client (with
    hiredis, as the stores use it)."""
    import redis.asyncio
    from redis.utils import HIREDIS_AVAILABLE

    client = redis.asyncio.Redis.from_url(url.split("?")[0], single_connection_client=True)
    key = f"{prefix}floor"
    try:
        sha = await client.script_load(FLOOR_SCRIPT)

        async def turn() -> float:
            started = time.perf_counter()
            await client.evalsha(sha, 1, key)
            await client.evalsha(sha, 1, key)
            return (time.perf_counter() - started) * 1000

        for _ in range(min(iterations, 50)):  # warm-up
            await turn()
        samples = [await turn() for _ in range(iterations)]
        pings = []
        for _ in range(iterations):
            started = time.perf_counter()
            await client.ping()
            pings.append((time.perf_counter() - started) * 1000)
    finally:
        await client.aclose()
    return {
        "what": "2 EVALSHA of a one-INCR script, one after another, redis-py asyncio client",
        "hiredis": HIREDIS_AVAILABLE,
        "iterations": iterations,
        "median_ms": round(statistics.median(samples), 3),
        "p90_ms": round(percentile(samples, 0.9), 3),
        "ping_median_ms": round(statistics.median(pings), 3),
    }


async def throughput(urls: list[str], turns: int) -> float:
    clients = [httpx2.AsyncClient(base_url=u, timeout=60) for u in urls]
    try:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for n in range(turns):
            queue.put_nowait(n)
        run = uuid.uuid4().hex[:6]

        async def worker(slot: int) -> None:
            client = clients[slot % len(clients)]
            while True:
                try:
                    n = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await one_turn(client, f"turn {n}", f"load-{run}-{slot}")

        started = time.perf_counter()
        await asyncio.gather(*(worker(slot) for slot in range(CONCURRENCY)))
        return turns / (time.perf_counter() - started)
    finally:
        for client in clients:
            await client.aclose()


async def turns_per_second(root: Path, url: str, turns: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    embedded = start(root / "tp-embedded", root / "tp-embedded.log", None)
    try:
        await throughput([embedded.url], 32)
        figures["embedded_1_replica"] = round(await throughput([embedded.url], turns), 1)
    finally:
        embedded.stop()
    a = start(root / "tp-redis", root / "tp-a.log", url)
    b = start(root / "tp-redis", root / "tp-b.log", url)
    try:
        await throughput([a.url, b.url], 32)
        figures["redis_1_replica"] = round(await throughput([a.url], turns), 1)
        figures["redis_2_replicas"] = round(await throughput([a.url, b.url], turns), 1)
    finally:
        a.stop()
        b.stop()
    return figures


async def fan_out(publisher: PlanEventBus, viewer_bus: PlanEventBus, updates: int) -> list[float]:
    sent: dict[int, float] = {}
    latencies: list[float] = []
    async with viewer_bus.subscribe("bench", "c") as viewer:
        await asyncio.sleep(0.2)  # the follower is reading

        async def read() -> None:
            async for batch in viewer:
                now = time.perf_counter()
                for event in batch:
                    latencies.append((now - sent[int(event.data["n"])]) * 1000)
                if len(latencies) >= updates:
                    return

        reader = asyncio.create_task(read())
        for n in range(updates):
            sent[n] = time.perf_counter()
            await publisher.publish("bench", "c", {"n": n, "steps": []})
            await asyncio.sleep(0.002)
        await asyncio.wait_for(reader, 60)
    return latencies


async def plan_latency(url: str, updates: int) -> dict[str, Any]:
    first, second = RedisConnection(url), RedisConnection(url)
    await first.open()
    await second.open()
    a, b = RedisPlanBus(first), RedisPlanBus(second)
    try:
        await fan_out(a, b, 20)
        redis = await fan_out(a, b, updates)
    finally:
        await a.aclose()
        await b.aclose()
        await first.aclose()
        await second.aclose()
    local_bus = InProcessPlanBus()
    local = await fan_out(local_bus, local_bus, updates)
    await local_bus.aclose()
    return {
        name: {
            "updates": len(values),
            "p50_ms": round(percentile(values, 0.5), 3),
            "p99_ms": round(percentile(values, 0.99), 3),
        }
        for name, values in (("redis_two_replicas", redis), ("embedded_one_process", local))
    }


async def main(args: argparse.Namespace) -> None:
    prefix = f"bench-{uuid.uuid4().hex[:10]}:"
    base = args.url.split("?")[0]
    url = f"{base}?key_prefix={prefix}"
    try:
        with tempfile.TemporaryDirectory(prefix="atmosphere-redis-bench-") as tmp:
            root = Path(tmp)
            per_turn_http = await per_turn(root, url, args.turns, args.rounds)
            floor_ms = await floor(url, prefix, args.floor_turns)
            floor_ms["added_median_ms"] = per_turn_http["added_median_ms"]
            floor_ms["added_over_floor_ms"] = round(
                floor_ms["added_median_ms"] - floor_ms["median_ms"], 3
            )
            document = {
                "benchmark": "redis_backend",
                "per_turn_http": per_turn_http,
                "floor": floor_ms,
                "turns_per_second": await turns_per_second(root, url, args.turns),
                "round_trips": await round_trips(root, url, max(min(args.turns, 40), 4)),
                "plan_fan_out": await plan_latency(url, args.updates),
            }
    finally:
        db = int(base.rstrip("/").rsplit("/", 1)[1]) if base.count("/") >= 3 else 0
        delete_prefix(prefix, db=db)
    print(json.dumps(document, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=500)
    parser.add_argument("--url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--floor-turns", type=int, default=1000)
    asyncio.run(main(parser.parse_args()))
