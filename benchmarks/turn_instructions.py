"""Instructions a turn costs the real server over HTTP (callgrind): embedded, on Redis or on
PostgreSQL.

    python benchmarks/turn_instructions.py [--backend redis|postgres|embedded] [--turns 100]
        [--url redis://127.0.0.1:6379/15] [--checkout PATH] [--profile FILE] [--keep FILE]

What `benchmarks/redis_backend.py` times, counted instead: the scale-out test app
(`python -m tests.reliability.server redis`: one agent with the whole harness on the scripted
model, a user from `X-User-Id`) runs under `valgrind --tool=callgrind` with its counting off,
durable runs off (no other replica follows these runs: the run frame feed writes nothing).
After a warm-up of 20 turns, counting is turned on around `--turns` turns sent one after another
(10 conversations in turn, as `redis_backend.py` sends them), and a quarter of a second after
the last one's `complete` frame (the lock's release runs after it). The lease is an hour and
the idle sweep off, so no periodic work falls in the window (its share would follow the
window's length, which follows the machine's load). With `--backend postgres` the same app
runs on a database this script creates on 127.0.0.1:5432 (user `postgres`) and drops at the end
(`--url` is then ignored). Prints the server's user-space instructions a turn (the kernel's
socket work is not counted); a backend's added cost is this figure on it minus the embedded
one. Instructions move little with the
machine's load, so two versions compare in pairs (`--checkout` runs another checkout's package
and app with this script; alternate them anyway).

`--profile FILE` runs the server under cProfile instead of callgrind, switched on and off around
the same window, and writes its stats to FILE (`python -m pstats FILE`): where a turn's time
goes by Python function (inclusive), to see which parts the instructions are spent in.
Benchmark-only: nothing here is part of the library.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx2
from callgrind_window import control, dumped_total

CONVERSATIONS = 10
WARM_UP = 20
PATH = "/atmosphere/agent/scribe"


PG = "postgresql://postgres@127.0.0.1:5432"


def postgres_admin(statement: str) -> None:
    import asyncpg

    async def run() -> None:
        connection = await asyncpg.connect(f"{PG}/postgres", timeout=10)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(run())


def serve_profiled(kind: str, out: str) -> None:
    """The server with cProfile switched on by SIGUSR1 and off (stats written) by SIGUSR2."""
    import cProfile

    profiler = cProfile.Profile()
    signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())

    def stop(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(out)

    signal.signal(signal.SIGUSR2, stop)
    from tests.reliability.server import _serve

    _serve(kind)


def serve() -> None:
    """`python -m tests.reliability.server redis` (the checkout's, from the working directory)."""
    import runpy

    sys.path.insert(0, os.getcwd())
    sys.argv = ["tests.reliability.server", "redis"]
    runpy.run_module("tests.reliability.server", run_name="__main__", alter_sys=True)


async def one_turn(client: httpx2.AsyncClient, message: str, conversation: str) -> None:
    body = {"message": message, "conversationId": conversation}
    async with client.stream("POST", PATH, json=body, headers={"X-User-Id": "bench"}) as response:
        assert response.status_code == 200, response.status_code
        async for line in response.aiter_lines():
            compact = line.replace(" ", "")
            if line.startswith("data:") and '"event":"complete"' in compact:
                return
            if line.startswith("data:") and '"event":"error"' in compact:
                raise RuntimeError(line)
    raise RuntimeError("stream ended without a complete frame")


async def turns(url: str, count: int, tag: str) -> None:
    async with httpx2.AsyncClient(base_url=url, timeout=600) as client:
        for n in range(count):
            await one_turn(client, f"turn {n}", f"{tag}-{n % CONVERSATIONS}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("redis", "postgres", "embedded"), default="redis")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--checkout", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--profile", default="")
    parser.add_argument("--keep", default="", help="copy the window's callgrind dump here")
    args = parser.parse_args()

    root = Path(args.checkout).resolve()
    work = Path(tempfile.mkdtemp(prefix="turn-instructions-"))
    (work / "ws").mkdir()
    prefix = f"turns-{uuid.uuid4().hex[:10]}:"
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("ATMOSPHERE_", "LLM_", "RELIABILITY_", "TEST_SERVER_"))
    }
    env.update(
        {
            "PYTHONPATH": str(root),
            "PYTHONUNBUFFERED": "1",
            "LLM_RUNTIME": "scripted",
            "ATMOSPHERE_WORKSPACE_ROOT": str(work / "ws"),
            "ATMOSPHERE_AI_HARNESS_ENABLED": "true",
            "ATMOSPHERE_DURABLE_RUNS_ENABLED": "false",
            # No periodic work inside the window (its count would follow the window's length,
            # which follows the machine's load): the lease's upkeep and the idle sweep.
            "ATMOSPHERE_DURABLE_RUNS_LEASE_SECONDS": "3600",
            "ATMOSPHERE_AI_CONVERSATION_IDLE_TIMEOUT": "0",
        }
    )
    database = f"turns_{uuid.uuid4().hex[:10]}"
    if args.backend == "redis":
        env["ATMOSPHERE_REDIS_URL"] = f"{args.url}?key_prefix={prefix}"
    elif args.backend == "postgres":
        postgres_admin(f'CREATE DATABASE "{database}"')
        env["ATMOSPHERE_POSTGRES_URL"] = f"{PG}/{database}"
    out = work / "callgrind.out"
    stats = str(Path(args.profile).resolve()) if args.profile else ""
    if stats:
        command = [sys.executable, str(Path(__file__).resolve()), "--serve-profiled", stats]
    else:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve",
        ]
    server = subprocess.Popen(
        command,
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=(work / "server.log").open("w"),
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline().strip()
        if not line.startswith("PORT "):
            raise RuntimeError(f"server did not start: {line!r}")
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        deadline = time.time() + 600
        while True:
            try:
                if httpx2.get(url + "/api/console/info", timeout=60).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            if server.poll() is not None or time.time() > deadline:
                raise RuntimeError("server never became ready")
            time.sleep(0.5)
        asyncio.run(turns(url, WARM_UP, "warm"))
        time.sleep(0.5)
        if stats:
            server.send_signal(signal.SIGUSR1)
        else:
            control(server.pid, "--zero")
            control(server.pid, "-i", "on")
        started = time.time()
        asyncio.run(turns(url, args.turns, f"t-{uuid.uuid4().hex[:6]}"))
        time.sleep(0.25)
        took = time.time() - started
        if stats:
            server.send_signal(signal.SIGUSR2)
            time.sleep(3)
            print(f"{root} {args.backend}: profile of {args.turns} turns in {stats}")
            return
        control(server.pid, "-i", "off")
        total = dumped_total(work, server.pid)
        if args.keep:
            newest = max(work.glob("callgrind.out*"), key=lambda p: p.stat().st_mtime)
            shutil.copy(newest, args.keep)
        print(
            f"{root} {args.backend} turns {args.turns}: {total:,} -> "
            f"{total / args.turns:,.0f} instructions a turn (window {took:.1f} s)"
        )
    finally:
        server.terminate()
        try:
            server.wait(120)
        except subprocess.TimeoutExpired:
            server.kill()
        if args.backend == "redis":
            import redis

            base = args.url.split("?")[0]
            client = redis.Redis.from_url(base)
            for key in client.scan_iter(match=prefix + "*", count=1000):
                client.unlink(key)
            client.close()
        elif args.backend == "postgres":
            postgres_admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-profiled":
        sys.path.insert(0, os.getcwd())
        serve_profiled("redis", sys.argv[2])
    elif len(sys.argv) == 2 and sys.argv[1] == "--serve":
        serve()
    else:
        main()
