"""Ours against the agent servers users compare us with, side by side in one run.

    python benchmarks/servers.py [--runs 200] [--rounds 4] [--seconds 10] [--clients 50]
        [--follow-runs 8] [--no-peers] [--smoke]

`make bench-servers` runs it (not `make bench`: it installs the peers and takes minutes).

Servers, each a process of its own on loopback, all on the same fake OpenAI-compatible model
(`inflight.py --fake`, which answers a short run at once and stamps each token):

- ours (`inflight_app.py`: one `@agent`, the whole default harness, the `openai` SDK) on the
  embedded stores, on PostgreSQL (a fresh database) and on Redis (a fresh key prefix);
- Aegra (`peers.py`) on PostgreSQL (its own fresh database, created and dropped here), and
  with its Redis broker; `langgraph dev` (in memory). The peers are installed into their own
  environments on first use and need Python >= 3.12; where none exists (or `--no-peers`) they
  are reported as skipped with the reason.

Figures (one JSON document; `ratio` = peer / ours, above 1 is better for us):

- `latency_ms`: a complete short run over HTTP (a new conversation or thread, the request to
  the stream's end), one client, p50/p99: `echo` (one model call) and `tool` (a call of `ls`,
  its result, the answer). Servers take turns in `--rounds`, the order turned each round;
- `throughput`: `--clients` concurrent clients running `echo` runs for `--seconds`: runs/s,
  and the server's CPU per run (`/proc/<pid>/stat` of its processes, plus the PostgreSQL
  backends of its database where it uses one; Redis's own CPU is listed apart, as the shared
  server also serves others);
- `follower_lag_ms`: a run executing on replica A followed from replica B, per streamed token:
  ours on PostgreSQL and on Redis (`follower_lag.py`), Aegra's two replicas on its Redis broker
  (Aegra without Redis runs each run where it was posted and cannot be followed elsewhere).

`--smoke` checks that everything runs (a few runs, ours only unless a peer is installed).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import follower_lag
from inflight import (
    TICKS,
    Backend,
    Server,
    Stream,
    Variant,
    cpu_ticks,
    environment,
    exit_on_sigterm,
    fast_loop,
    free_port,
    raise_file_limit,
    request_for,
    spread,
    stop,
    wait_for_port,
    warm_up,
)
from peers import aegra, install, join_request, langgraph_dev

MESSAGES = {"echo": "now echo", "tool": "now tool"}


# --- processes and their CPU -----------------------------------------------------------------


def postgres_pids(database: str) -> list[int]:
    """The PostgreSQL backends connected to `database` (their process titles name it)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            title = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            if title.startswith(b"postgres: ") and f" {database} ".encode() in title:
                found.append(int(proc.name))
    return found


def redis_pid() -> int | None:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if (proc / "comm").read_text().strip() == "redis-server":
                    return int(proc.name)
    return None


class Side:
    """One server measured: how to reach it, and the CPU of everything that serves it."""

    def __init__(self, name: str, server: Any, backend: Backend | None) -> None:
        self.name = name
        self.server = server
        self.backend = backend

    @property
    def port(self) -> int:
        return int(self.server.port)

    @property
    def protocol(self) -> str:
        return str(self.server.protocol)

    def cpu(self) -> tuple[float, float, float]:
        """(server, PostgreSQL backends of its database, Redis) CPU seconds so far."""
        database = 0
        if self.backend is not None and self.backend.uses_postgres:
            database = sum(cpu_ticks(pid) for pid in postgres_pids(self.backend.name))
        pid = redis_pid() if self.backend is not None and self.backend.uses_redis else None
        return (
            self.server.cpu() / TICKS,
            database / TICKS,
            cpu_ticks(pid) / TICKS if pid else 0.0,
        )


# --- one run over HTTP -----------------------------------------------------------------------


async def one_run(side: Side, message: str) -> float:
    """Seconds from the request to the end of its stream (a complete run), or raise."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str] = loop.create_future()
    data = request_for(side.protocol, side.port, message)
    started = time.perf_counter()
    await loop.create_connection(
        lambda: Stream(data, done, peer=side.protocol != "ours"), "127.0.0.1", side.port
    )
    outcome = await asyncio.wait_for(done, 120)
    took = time.perf_counter() - started
    if outcome != "complete":
        raise RuntimeError(f"{side.name}: a run did not complete: {outcome[:300]}")
    return took


async def latency(sides: list[Side], runs: int, rounds: int, smaller: dict[str, int]) -> Any:
    samples: dict[str, dict[str, list[float]]] = {
        kind: {side.name: [] for side in sides} for kind in MESSAGES
    }
    for round_ in range(rounds):
        order = sides if round_ % 2 == 0 else sides[::-1]
        for side in order:
            count = max(1, min(runs, smaller.get(side.name, runs)) // rounds)
            for kind, message in MESSAGES.items():
                for _ in range(count):
                    samples[kind][side.name].append(await one_run(side, message) * 1000)
    return {
        kind: {name: spread(values, 1.0) for name, values in by_side.items()}
        for kind, by_side in samples.items()
    }


async def throughput(side: Side, clients: int, seconds: float) -> dict[str, Any]:
    done_runs = 0
    stop_at = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done_runs
        while time.monotonic() < stop_at:
            await one_run(side, MESSAGES["echo"])
            done_runs += 1

    await asyncio.gather(*(one_run(side, MESSAGES["echo"]) for _ in range(clients)))  # warm
    before, started = side.cpu(), time.monotonic()
    done_runs = 0
    await asyncio.gather(*(client() for _ in range(clients)))
    took = time.monotonic() - started
    after = side.cpu()
    server, database, redis = (a - b for a, b in zip(after, before, strict=True))
    runs = max(done_runs, 1)
    return {
        "runs": done_runs,
        "runs_per_s": round(done_runs / took, 1),
        "cpu_ms_per_run": round((server + database) * 1000 / runs, 2),
        "server_cpu_ms_per_run": round(server * 1000 / runs, 2),
        "postgres_cpu_ms_per_run": round(database * 1000 / runs, 2),
        "redis_cpu_ms_per_run_shared_server": round(redis * 1000 / runs, 2),
    }


# --- follower lag ----------------------------------------------------------------------------


async def aegra_follow(a: Any, b: Any, runs: int, timeout: float) -> dict[str, Any]:
    """Runs created on Aegra replica A (in the background), each followed from B."""
    loop = asyncio.get_running_loop()

    async def one() -> tuple[list[int], str]:
        thread = str(uuid.uuid4())
        created: asyncio.Future[str] = loop.create_future()
        body = bytearray()

        class Created(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport = transport
                transport.write(  # type: ignore[attr-defined]
                    request_for_background(a.port, thread)
                )

            def data_received(self, data: bytes) -> None:
                body.extend(data)

            def connection_lost(self, exc: Exception | None) -> None:
                created.set_result(bytes(body).decode(errors="replace"))

        await loop.create_connection(Created, "127.0.0.1", a.port)
        answer = await asyncio.wait_for(created, timeout)
        run_id = json.loads(answer[answer.index("{") : answer.rindex("}") + 1])["run_id"]
        seen: array.array[int] = array.array("q")
        done: asyncio.Future[str] = loop.create_future()
        get = join_request(b.port, thread, run_id)
        await loop.create_connection(
            lambda: Stream(get, done, from_open=seen, peer=True), "127.0.0.1", b.port
        )
        outcome = await asyncio.wait_for(done, timeout)
        return seen.tolist(), outcome

    results = await asyncio.gather(*(one() for _ in range(runs)))
    outcomes: dict[str, int] = {}
    for _, outcome in results:
        outcomes[outcome.split(":")[0]] = outcomes.get(outcome.split(":")[0], 0) + 1
    return {
        "follower_ms": spread([d for delays, _ in results for d in delays], 1000.0),
        "follower_outcomes": outcomes,
    }


def request_for_background(port: int, thread: str) -> bytes:
    from peers import agent_protocol_request

    return agent_protocol_request(port, "stream please", thread, background=True)


# --- the run ---------------------------------------------------------------------------------


class Model:
    """The fake model, streaming `tokens_per_s` for `seconds` (short `now` runs: at once)."""

    def __init__(self, tokens_per_s: float, seconds: float) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("inflight.py")),
                "--fake",
                str(self.port),
                str(tokens_per_s),
                str(seconds),
                "text",
            ],
            env=environment({}),
            stdout=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.process)

    def close(self) -> None:
        stop(self.process)


@contextlib.contextmanager
def started(stack: list[Callable[[], None]]) -> Iterator[list[Callable[[], None]]]:
    try:
        yield stack
    finally:
        for close in reversed(stack):
            with contextlib.suppress(Exception):
                close()


def ratios(ours: dict[str, Any], peers: dict[str, Any], key: str, lower: bool = True) -> Any:
    """peer / ours of one figure (inverted for runs/s: higher is better there)."""
    found: dict[str, dict[str, float | None]] = {}
    for mine, mine_value in ours.items():
        for theirs, their_value in peers.items():
            value = None
            if mine_value and their_value:
                value = round(their_value / mine_value if lower else mine_value / their_value, 2)
            found.setdefault(mine, {})[theirs] = value
    return found


def main(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-servers-"))
    document: dict[str, Any] = {"benchmark": "servers", "workload": vars(args).copy()}
    document["workload"].pop("func", None)
    skipped: dict[str, str] = {}
    venvs: dict[str, Path] = {}
    if args.no_peers:
        skipped = {"aegra": "--no-peers", "langgraph_dev": "--no-peers"}
    else:
        for name, peer in (("aegra", "aegra"), ("langgraph_dev", "langgraph")):
            venv, why = install(peer)
            if venv is None:
                skipped[name] = why
            else:
                venvs[name] = venv
    for name, why in skipped.items():
        print(f"servers: {name} skipped: {why}", file=sys.stderr)
    closers: list[Callable[[], None]] = []
    try:
        with started(closers):
            model = Model(args.tokens_per_s, args.follow_seconds)
            closers.append(model.close)
            sides: list[Side] = []
            for kind in ("embedded", "postgres", "redis"):
                backend = Backend(kind).__enter__()
                closers.append(lambda b=backend: b.__exit__(None, None, None))
                server = Server(Variant(kind, kind), model.port, backend.env, root / kind)
                closers.append(server.close)
                sides.append(Side(f"ours_{kind}", server, backend))
            if "aegra" in venvs:
                for kind in ("aegra", "aegra_redis"):
                    backend = Backend(kind).__enter__()
                    closers.append(lambda b=backend: b.__exit__(None, None, None))
                    server = aegra(
                        venvs["aegra"],
                        root / kind,
                        model.port,
                        backend.database_url,
                        backend.redis_url,
                        backend.name + ":",
                    )
                    closers.append(server.close)
                    sides.append(Side(kind, server, backend))
            if "langgraph_dev" in venvs:
                server = langgraph_dev(venvs["langgraph_dev"], root / "langgraph", model.port)
                closers.append(server.close)
                sides.append(Side("langgraph_dev", server, None))
            for side in sides:
                warm_up(side.port, side.protocol)
            # `langgraph dev` takes about a second a run: fewer of its runs.
            smaller = {"langgraph_dev": max(2, args.runs // 10)}
            document["latency_ms"] = asyncio.run(latency(sides, args.runs, args.rounds, smaller))
            document["throughput"] = {
                side.name: asyncio.run(
                    throughput(
                        side, args.clients, args.seconds * (2 if "langgraph" in side.name else 1)
                    )
                )
                for side in sides
            }
            if "aegra" in venvs:
                document["aegra_follower_lag"] = aegra_lag(venvs["aegra"], model.port, root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lag_args = argparse.Namespace(
        runs=args.follow_runs,
        seconds=args.follow_seconds,
        tokens_per_s=args.tokens_per_s,
        backends="postgres,redis",
    )
    ours_lag = follower_lag.main(lag_args)["backends"]
    document["follower_lag_ms"] = {f"ours_{kind}": measured for kind, measured in ours_lag.items()}
    if "aegra_follower_lag" in document:
        document["follower_lag_ms"]["aegra_redis"] = document.pop("aegra_follower_lag")
    document["skipped"] = skipped
    document["ratios"] = summary_ratios(document)
    return document


def aegra_lag(venv: Path, model_port: int, root: Path, args: argparse.Namespace) -> Any:
    with Backend("aegra_redis") as backend:

        def replica() -> Any:
            prefix = backend.name + ":"
            url = backend.database_url
            return aegra(venv, root / "lag", model_port, url, backend.redis_url, prefix)

        a = replica()
        try:
            b = replica()
            try:
                timeout = args.follow_seconds * 4 + 60
                asyncio.run(aegra_follow(a, b, 2, timeout))
                return asyncio.run(aegra_follow(a, b, args.follow_runs, timeout))
            finally:
                b.close()
        finally:
            a.close()


def summary_ratios(document: dict[str, Any]) -> dict[str, Any]:
    """peer / ours for latency p50 and CPU per run, ours / peer for runs/s."""
    ours = [name for name in document["throughput"] if name.startswith("ours_")]
    peers = [name for name in document["throughput"] if not name.startswith("ours_")]
    found: dict[str, Any] = {}
    for kind, by_side in document["latency_ms"].items():
        found[f"latency_p50_{kind}"] = ratios(
            {o: by_side[o]["p50"] for o in ours}, {p: by_side[p]["p50"] for p in peers}, "p50"
        )
    throughput = document["throughput"]
    found["runs_per_s"] = ratios(
        {o: throughput[o]["runs_per_s"] for o in ours},
        {p: throughput[p]["runs_per_s"] for p in peers},
        "runs_per_s",
        lower=False,
    )
    found["cpu_per_run"] = ratios(
        {o: throughput[o]["cpu_ms_per_run"] for o in ours},
        {p: throughput[p]["cpu_ms_per_run"] for p in peers},
        "cpu",
    )
    return found


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="short runs per server and kind")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0, help="each throughput window")
    parser.add_argument("--follow-runs", type=int, default=8)
    parser.add_argument("--follow-seconds", type=float, default=10.0)
    parser.add_argument("--tokens-per-s", type=float, default=20.0)
    parser.add_argument("--no-peers", action="store_true", help="ours only")
    parser.add_argument("--smoke", action="store_true", help="a few runs: a check, not figures")
    parsed = parser.parse_args()
    if parsed.smoke:
        parsed.runs, parsed.rounds, parsed.clients, parsed.seconds = 4, 2, 4, 1.0
        parsed.follow_runs, parsed.follow_seconds = 1, 1.0
    raise_file_limit()
    fast_loop()
    exit_on_sigterm()
    print(json.dumps(main(parsed), indent=1))
