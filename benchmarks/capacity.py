"""Per-component costs for sizing a deployment, checked at 1 and 2 replicas.

    python benchmarks/capacity.py [--backends postgres,redis] [--clients 50] [--seconds 10]
        [--stream-runs 100] [--stream-seconds 20] [--tokens-per-s 20] [--followed 0.1] [--smoke]

For each backend, replicas of the `inflight_app.py` server (separate uvicorn processes, asyncio
+ h11, durable runs off) on one fresh PostgreSQL database of 127.0.0.1:5432, or on a Redis
server of their own (`redis-server` started here on a free port, so its CPU and its
`INFO commandstats` are theirs alone), all on the fake model of `inflight.py`:

- `turns_1`, `turns_2`: `--clients` clients running short runs (`now echo`: one model call
  answered at once, a new conversation each) for `--seconds`, spread over 1 or 2 replicas.
  Per run: CPU ms of the servers, of the database's PostgreSQL backends, of Redis and of the
  load generator (this process); PostgreSQL transactions and rows (`pg_stat_database` of the
  database: every statement of a turn is its own transaction, so commits count statements) and
  WAL bytes (`pg_stat_wal`, which counts the whole cluster); Redis commands by name;
- `stream_1`, `stream_2`: `--stream-runs` runs at once over 1 or 2 replicas, each streaming
  `--tokens-per-s` for `--stream-seconds`, followed by no other replica (the frame feed writes
  nothing for them). Per streamed token, over a steady window: CPU µs of the servers, of
  PostgreSQL and of Redis, Redis commands; PostgreSQL transactions a token (the phase's total
  less the runs' own cost from `turns_1`) and rows the feed inserted; resident memory added per
  run in flight;
- `stream_2_followed`: the same over 2 replicas, each run also followed by one reader on the
  other replica (`GET P/conversations/{id}/events` there, once the run streams): the frame
  feed's writes a token and the store's CPU a write, the followers' outcomes and tokens;
- `connections`: in each phase's middle, per replica: open file descriptors and TCP sockets by
  peer (clients, PostgreSQL, Redis, the model), and the database's backends
  (`pg_stat_activity`).

`model` predicts the runs/s of `turns_1` and `turns_2` from `turns_1`'s per-run CPU alone:
each server process, Redis and the load generator run on one core at most, and everything
shares the CPU the machine's other processes left (measured in the same window):
`min(R * 1000 / server_ms, 1000 / redis_ms, 1000 / client_ms, free_cores * 1000 / total_ms)`.
`sizing` applies the measured costs to `--sizes` concurrent runs (each streaming
`--tokens-per-s` for `--run-seconds`), a share `--followed` of them followed from another
replica: per-run cost x runs started/s + tokens/s x (the unfollowed runs' cost a token +
`--followed` x what following added a token). `--smoke` is a quick check that everything runs.
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from inflight import (
    PATH,
    PG,
    TICKS,
    Backend,
    Server,
    Stream,
    Variant,
    cpu_ticks,
    exit_on_sigterm,
    fast_loop,
    follow_bytes,
    free_port,
    machine_idle,
    raise_file_limit,
    request_bytes,
    stop,
    wait_for_port,
    warm_up,
)
from servers import Model, postgres_pids

SETTLE = 11.0
"""Seconds of quiet before PostgreSQL's counters are read: an idle backend publishes what it
counted within 10 s (PostgreSQL 15's `PGSTAT_IDLE_INTERVAL`)."""
POOL_MAX = 10
"""PostgreSQL connections a replica's pool may open (`_backends/postgres/database.py`)."""
PG_EXTRA = 2
"""A replica's connections besides the pool: `LISTEN`, and the conversation locks'."""
REDIS_MAX = 64
"""Redis connections a replica's pool may open (`_backends/redis/connection.py`)."""
MODEL_MAX = 1000
"""HTTP connections the `openai` SDK's client opens to the model at most (its default)."""
FOLLOWED = 0.1
"""The sizing's default share of runs a reader follows from another replica: a client that
re-attaches mid-run (a reload, a dropped mobile connection, a second tab) through a load balancer
without affinity (docs/capacity.md); an assumption, `--followed` changes it."""
BUSY = 0.7
"""Share of a core a sized process is planned at (headroom for bursts and GC pauses)."""


# --- the backends -----------------------------------------------------------------------------


class OwnRedis:
    """A `redis-server` of this benchmark's own on a free port (no persistence), dropped after."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not on the PATH")
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                *(binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
                *("--appendonly", "no", "--dir", str(root), "--maxclients", "10000"),
            ],
            stdout=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.process)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.env = {"ATMOSPHERE_REDIS_URL": self.url + "?key_prefix=capacity:"}

    def commands(self) -> dict[str, int]:
        """Calls so far by command, from `INFO commandstats` (this query's own left out)."""
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            stats = client.info("commandstats")
        finally:
            client.close()
        found = {}
        for name, value in stats.items():
            command = name.removeprefix("cmdstat_")
            if command not in ("info", "hello", "client|setinfo"):
                found[command] = int(value["calls"])
        return found

    def cpu(self) -> float:
        return cpu_ticks(self.process.pid) / TICKS

    def close(self) -> None:
        stop(self.process)


class Store:
    """One backend under test: PostgreSQL (a fresh database) or Redis (a server of its own)."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.redis: OwnRedis | None = None
        self.postgres: Backend | None = None
        if kind == "postgres":
            self.postgres = Backend("postgres").__enter__()
            self.env = self.postgres.env
        else:
            self.redis = OwnRedis(root)
            self.env = self.redis.env

    def cpu(self) -> tuple[float, float]:
        """(PostgreSQL backends of the database, Redis) CPU seconds so far."""
        database = 0.0
        if self.postgres is not None:
            pids = postgres_pids(self.postgres.name)
            database = sum(cpu_ticks(pid) for pid in pids) / TICKS
        return database, self.redis.cpu() if self.redis else 0.0

    def commands(self) -> dict[str, int]:
        return self.redis.commands() if self.redis else {}

    def database_stats(self) -> dict[str, int]:
        if self.postgres is None:
            return {}
        return asyncio.run(database_stats(self.postgres.name))

    def frame_rows(self) -> int:
        """Rows inserted into the frame feed's table so far (PostgreSQL; 0 on Redis)."""
        if self.postgres is None:
            return 0
        return asyncio.run(frame_rows(self.postgres.name))

    def database_backends(self) -> int:
        return len(postgres_pids(self.postgres.name)) if self.postgres else 0

    def close(self) -> None:
        if self.postgres is not None:
            self.postgres.__exit__(None, None, None)
        if self.redis is not None:
            self.redis.close()


STAT_COLUMNS = (
    "xact_commit",
    "xact_rollback",
    "tup_returned",
    "tup_fetched",
    "tup_inserted",
    "tup_updated",
    "tup_deleted",
    "blks_hit",
    "blks_read",
)


async def database_stats(name: str) -> dict[str, int]:
    """`pg_stat_database` of `name` and the cluster's `pg_stat_wal`, read from database `test`."""
    import asyncpg

    connection = await asyncpg.connect(f"{PG}/test", timeout=5)
    try:
        row = await connection.fetchrow(
            f"SELECT {', '.join(STAT_COLUMNS)} FROM pg_stat_database WHERE datname = $1", name
        )
        wal = await connection.fetchrow("SELECT wal_records, wal_bytes FROM pg_stat_wal")
    finally:
        await connection.close()
    found = {column: int(row[column]) for column in STAT_COLUMNS}
    found["wal_records_cluster"] = int(wal["wal_records"])
    found["wal_bytes_cluster"] = int(wal["wal_bytes"])
    return found


async def frame_rows(name: str) -> int:
    """`n_tup_ins` of `atmosphere_run_frames` in database `name` (`pg_stat_user_tables`)."""
    import asyncpg

    connection = await asyncpg.connect(f"{PG}/{name}", timeout=5)
    try:
        found = await connection.fetchval(
            "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'atmosphere_run_frames'"
        )
    finally:
        await connection.close()
    return int(found or 0)


# --- what a process holds ---------------------------------------------------------------------


def tcp_table() -> dict[int, tuple[int, int]]:
    """inode -> (local port, remote port) of every TCP socket in this network namespace."""
    found: dict[int, tuple[int, int]] = {}
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
                parts = line.split()
                local, remote = parts[1].rsplit(":", 1)[1], parts[2].rsplit(":", 1)[1]
                found[int(parts[9])] = (int(local, 16), int(remote, 16))
    return found


def census(pid: int, ports: dict[str, int], table: dict[int, tuple[int, int]]) -> dict[str, int]:
    """Open file descriptors of `pid`, and its TCP sockets by peer (`ports`: name -> port;
    `clients` are those on the server's own port)."""
    found = {
        "fds": 0,
        "clients": 0,
        "other_tcp": 0,
        **{name: 0 for name in ports if name != "server"},
    }
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            found["fds"] += 1
            with contextlib.suppress(OSError):
                link = os.readlink(fd)
                if not link.startswith("socket:["):
                    continue
                local, remote = table.get(int(link[8:-1]), (0, 0))
                if local == 0:
                    continue
                if local == ports["server"]:
                    found["clients"] += 1
                    continue
                name = next((n for n, p in ports.items() if p == remote and n != "server"), None)
                found[name or "other_tcp"] += 1
    return found


def rss(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Snapshot:
    """CPU seconds of each part at one moment, and the machine's busy time."""

    def __init__(self, servers: list[Server], store: Store) -> None:
        self.at = time.monotonic()
        self.each = [server.cpu() / TICKS for server in servers]
        self.server = sum(self.each)
        self.postgres, self.redis = store.cpu()
        self.client = cpu_ticks(os.getpid()) / TICKS
        idle, total = machine_idle()
        self.busy = (total - idle) / TICKS
        self.commands = store.commands()


def spent(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds each part used between two snapshots, others' (the rest of the machine's
    busy time) and the wall time."""
    parts = {
        "server": after.server - before.server,
        "postgres": after.postgres - before.postgres,
        "redis": after.redis - before.redis,
        "client": after.client - before.client,
    }
    parts["others"] = max(0.0, after.busy - before.busy - sum(parts.values()))
    parts["seconds"] = after.at - before.at
    return parts


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key)}


# --- the load ---------------------------------------------------------------------------------


async def one_run(port: int, message: str) -> str:
    """One run on a new conversation, read to its end: its outcome (`complete` when whole)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str] = loop.create_future()
    data = request_bytes(port, PATH, message, f"cap-{uuid.uuid4().hex[:12]}")
    await loop.create_connection(lambda: Stream(data, done), "127.0.0.1", port)
    return await asyncio.wait_for(done, 120)


class Phase:
    """Servers started on a store; what they cost over a window; stopped, and then PostgreSQL's
    counters (which its backends publish when they end)."""

    def __init__(
        self, store: Store, model: Model, replicas: int, root: Path, settle: float
    ) -> None:
        self.store = store
        self.model = model
        self.servers: list[Server] = []
        for _ in range(replicas):
            self.servers.append(
                Server(Variant("capacity", store.kind), model.port, store.env, root)
            )
        for server in self.servers:
            warm_up(server.port)
        self.settle = settle

    def ports(self, server: Server) -> dict[str, int]:
        ports = {"server": server.port, "model": self.model.port}
        if self.store.postgres is not None:
            ports["postgres"] = int(PG.rsplit(":", 1)[1])
        if self.store.redis is not None:
            ports["redis"] = self.store.redis.port
        return ports

    def connections(self) -> dict[str, Any]:
        table = tcp_table()
        per_replica = []
        for server in self.servers:
            counts: dict[str, int] = {}
            for pid in server.pids():
                for key, value in census(pid, self.ports(server), table).items():
                    counts[key] = counts.get(key, 0) + value
            per_replica.append(counts)
        return {
            "per_replica": per_replica,
            "postgres_backends_of_database": self.store.database_backends(),
        }

    def close(self) -> dict[str, int]:
        """Stop the servers; the database's counters once its backends have ended."""
        for server in self.servers:
            server.close()
        deadline = time.monotonic() + 20
        while self.store.database_backends() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.store.database_stats()


def turns(store: Store, model: Model, replicas: int, args: argparse.Namespace, root: Path) -> Any:
    phase = Phase(store, model, replicas, root, args.settle)
    ports = [server.port for server in phase.servers]
    try:
        time.sleep(args.settle)
        database_before = store.database_stats()
        load_before = os.getloadavg()

        async def load() -> tuple[int, int, Snapshot, Snapshot, dict[str, Any]]:
            done = errors = 0
            stop_at = time.monotonic() + args.seconds

            async def client(index: int) -> None:
                nonlocal done, errors
                while time.monotonic() < stop_at:
                    outcome = await one_run(ports[index % len(ports)], "now echo")
                    if outcome == "complete":
                        done += 1
                    else:
                        errors += 1

            before = Snapshot(phase.servers, store)
            clients = asyncio.gather(*(client(index) for index in range(args.clients)))
            await asyncio.sleep(args.seconds / 2)
            middle = phase.connections()
            await clients
            return done, errors, before, Snapshot(phase.servers, store), middle

        done, errors, before, after, middle = asyncio.run(load())
    finally:
        database_after = phase.close()
    runs = max(done, 1)
    cpu = spent(before, after)
    per_run = {
        part: round(cpu[part] * 1000 / runs, 3)
        for part in ("server", "postgres", "redis", "client")
    }
    commands = delta(after.commands, before.commands)
    database = delta(database_after, database_before)
    return {
        "replicas": replicas,
        "runs": done,
        "errors": errors,
        "runs_per_s": round(done / cpu["seconds"], 1),
        "cpu_ms_per_run": per_run,
        "others_cores": round(cpu["others"] / cpu["seconds"], 2),
        "load_average": [round(v, 2) for v in load_before],
        "postgres_per_run": {key: round(value / runs, 2) for key, value in database.items()},
        "redis_commands_per_run": round(sum(commands.values()) / runs, 2),
        "redis_commands_by_name_per_run": {
            key: round(value / runs, 2) for key, value in sorted(commands.items())
        },
        "connections_mid_window": middle,
    }


def stream(
    store: Store,
    model: Model,
    replicas: int,
    args: argparse.Namespace,
    root: Path,
    runs_cost: Any,
    followed: bool = False,
) -> Any:
    """`--stream-runs` long runs at once, spread over `replicas`: costs per streamed token and
    per run. `followed`: each run is also followed by one reader on the next replica
    (`GET P/conversations/{id}/events` there, once its own stream has a token), so the frame
    feed writes it to the store."""
    phase = Phase(store, model, replicas, root, args.settle)
    servers = phase.servers

    def resident() -> int:
        return sum(rss(pid) for server in servers for pid in server.pids())

    try:
        rest_before, rest_started = [server.cpu() for server in servers], time.monotonic()
        time.sleep(args.settle)
        rest = [
            (server.cpu() - cpu) / TICKS / max(time.monotonic() - rest_started, 0.1)
            for server, cpu in zip(servers, rest_before, strict=True)
        ]
        rows_before = store.frame_rows()
        database_before = store.database_stats()
        rss_before = resident()
        load_before = os.getloadavg()

        async def load() -> Any:
            loop = asyncio.get_running_loop()
            streams: list[Stream] = []
            firsts: list[float] = []
            finished: list[asyncio.Future[str]] = []
            followers: list[tuple[Stream, asyncio.Future[str], int]] = []
            follower_firsts: list[float] = []
            attaching = []
            for index in range(args.stream_runs):
                port = servers[index % len(servers)].port
                done: asyncio.Future[str] = loop.create_future()
                conversation = f"cap-{uuid.uuid4().hex}"
                data = request_bytes(port, PATH, "stream please", conversation)
                streams.append(Counted(data, done, firsts))
                finished.append(done)
                await loop.create_connection(lambda s=streams[-1]: s, "127.0.0.1", port)
                if followed:
                    other = servers[(index + 1) % len(servers)].port
                    attaching.append(
                        follow(other, conversation, streams[-1], follower_firsts, followers)
                    )
            attached = asyncio.gather(*attaching)
            # The steady window: from every run streaming (and followed) to 1 s before the first
            # one ends.
            give_up = time.monotonic() + args.stream_seconds / 2
            while (
                len(firsts) < args.stream_runs
                or (followed and len(follower_firsts) < args.stream_runs)
            ) and time.monotonic() < give_up:
                await asyncio.sleep(0.05)
            end = min(firsts, default=time.monotonic()) + args.stream_seconds - 1.0

            def frames() -> tuple[int, int]:
                return sum(s.frames for s in streams), sum(f[0].frames for f in followers)

            before, frames_before = Snapshot(servers, store), frames()
            await asyncio.sleep(max(0.25, (end - time.monotonic()) / 2))
            middle = phase.connections()
            held = resident()
            await asyncio.sleep(max(0.25, end - time.monotonic()))
            after, frames_after = Snapshot(servers, store), frames()
            results = [await asyncio.wait_for(done, 300) for done in finished]
            await attached
            read = [await asyncio.wait_for(done, 300) for _, done, _ in followers]
            retries = sum(tries for _, _, tries in followers)
            return (
                results,
                read,
                retries,
                frames_after[0] - frames_before[0],
                frames_after[1] - frames_before[1],
                before,
                after,
                middle,
                held,
            )

        results, read, retries, tokens, relayed, before, after, middle, held = asyncio.run(load())
    finally:
        database_after = phase.close()
    rows = store.frame_rows() - rows_before
    cpu = spent(before, after)
    tokens_total = args.stream_runs * round(args.tokens_per_s * args.stream_seconds)
    commands = delta(after.commands, before.commands)
    database = delta(database_after, database_before)
    per_run_xacts = runs_cost.get("postgres_per_run", {}).get("xact_commit", 0.0)
    feed_xacts = database.get("xact_commit", 0) - per_run_xacts * args.stream_runs
    # The frame feed's writes on Redis: a script each (its reads are plain commands).
    writes_per_token = commands.get("evalsha", 0) / max(tokens, 1)
    found: dict[str, Any] = {
        "replicas": replicas,
        "runs": args.stream_runs,
        "followed": followed,
        "server_cores_at_rest": [round(value, 4) for value in rest],
        "outcomes": outcomes_of(results),
        "tokens_in_window": tokens,
        "window_seconds": round(cpu["seconds"], 2),
        "cpu_us_per_token": {
            part: round(cpu[part] * 1e6 / max(tokens, 1), 1)
            for part in ("server", "postgres", "redis")
        },
        "server_cores": round(cpu["server"] / cpu["seconds"], 3),
        "others_cores": round(cpu["others"] / cpu["seconds"], 2),
        "load_average": [round(v, 2) for v in load_before],
        "rss_kib_per_run": round((held - rss_before) / 1024 / args.stream_runs, 1),
        "rss_mib_server_idle": round(rss_before / 2**20, 1),
        "postgres_xacts_per_token": round(feed_xacts / max(tokens_total, 1), 3),
        "postgres_rows_written_per_token": round(
            sum(database.get(f"tup_{key}", 0) for key in ("inserted", "updated", "deleted"))
            / max(tokens_total, 1),
            3,
        ),
        "postgres_wal_bytes_per_token_cluster": round(
            database.get("wal_bytes_cluster", 0) / max(tokens_total, 1), 1
        ),
        "redis_commands_per_token": round(sum(commands.values()) / max(tokens, 1), 3),
        "redis_commands_by_name_per_token": {
            key: round(value / max(tokens, 1), 3) for key, value in sorted(commands.items())
        },
        "connections_mid_window": middle,
    }
    if store.postgres is not None:
        # Rows the feed inserted (`atmosphere_run_frames`), over every token of the phase.
        found["postgres_frame_rows_per_token"] = round(rows / max(tokens_total, 1), 3)
    else:
        found["feed_writes_per_token"] = round(writes_per_token, 3)
    if followed:
        found["follower_outcomes"] = outcomes_of(read)
        found["follower_tokens_in_window"] = relayed
        found["follow_attempts_answered_404"] = retries
        if store.postgres is not None:
            # Its CPU a transaction (the feed's writes, the followers' reads, the upkeep).
            found["postgres_cpu_us_per_xact"] = round(
                cpu["postgres"] * 1e6 / max(feed_xacts * tokens / max(tokens_total, 1), 1), 1
            )
        else:
            found["feed_write_cpu_us"] = round(
                cpu["redis"] * 1e6 / max(writes_per_token * tokens, 1), 1
            )
            found["redis_commands_per_feed_write"] = round(
                sum(commands.values()) / max(commands.get("evalsha", 0), 1), 1
            )
    return found


def outcomes_of(results: list[str]) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    for outcome in results:
        outcomes[outcome.split(":")[0]] = outcomes.get(outcome.split(":")[0], 0) + 1
    return outcomes


FOLLOW_ATTEMPTS = 1000
"""Tries to attach on the other replica before giving up (10 ms apart: 10 s, a hang guard)."""


async def follow(
    port: int,
    conversation: str,
    run: Stream,
    firsts: list[float],
    into: list[tuple[Stream, asyncio.Future[str], int]],
) -> None:
    """Follow `conversation`'s run from the replica on `port` once `run` (its own stream) has a
    token: `GET P/conversations/{id}/events` with the headers the run's `POST` had (none: the
    anonymous user), again after a 404 (the run not yet known there)."""
    loop = asyncio.get_running_loop()
    while run.frames == 0 and not run.done.done():
        await asyncio.sleep(0.01)
    for tries in range(FOLLOW_ATTEMPTS):
        done: asyncio.Future[str] = loop.create_future()
        reader = Counted(follow_bytes(port, PATH, conversation), done, firsts)
        await loop.create_connection(lambda r=reader: r, "127.0.0.1", port)
        while reader.frames == 0 and not done.done():
            await asyncio.sleep(0.01)
        if done.done() and " 404 " in done.result():
            await asyncio.sleep(0.01)
            continue
        into.append((reader, done, tries))
        return
    raise RuntimeError(f"could not follow {conversation} on port {port}")


class Counted(Stream):
    """A run's stream that notes when its first token arrived (`time.monotonic()`)."""

    def __init__(self, request: bytes, done: asyncio.Future[str], firsts: list[float]) -> None:
        super().__init__(request, done)
        self.firsts = firsts

    def record(self, arrived: int, stamp: int) -> None:
        if self.frames == 0:
            self.firsts.append(time.monotonic())
        super().record(arrived, stamp)


# --- the model of it --------------------------------------------------------------------------


def predict(costs: dict[str, float], replicas: int, free_cores: float) -> dict[str, Any]:
    """Runs/s the per-run CPU allows: each bound, and the smallest."""
    total = sum(costs.values())
    bounds = {"shared_cpu": free_cores * 1000 / max(total, 1e-3)}
    # Each of these runs on one core at most (a part that measured no CPU bounds nothing).
    for name, part, cores in (
        ("server_processes", "server", replicas),
        ("load_generator", "client", 1),
        ("redis_thread", "redis", 1),
    ):
        if costs[part] > 0:
            bounds[name] = cores * 1000 / costs[part]
    limit = min(bounds, key=lambda name: bounds[name])
    return {
        "runs_per_s": round(bounds[limit], 1),
        "bound_by": limit,
        "bounds": {name: round(value, 1) for name, value in bounds.items()},
    }


def check(kind: Any) -> dict[str, Any]:
    """Predicted runs/s of each `turns_R` from `turns_1`'s per-run CPU, against measured."""
    costs = kind["turns_1"]["cpu_ms_per_run"]
    cores = os.cpu_count() or 1
    found = {}
    for name in ("turns_1", "turns_2"):
        measured = kind[name]
        free = max(0.1, cores - measured["others_cores"])
        predicted = predict(costs, measured["replicas"], free)
        predicted["free_cores"] = round(free, 2)
        predicted["measured_runs_per_s"] = measured["runs_per_s"]
        predicted["measured_over_predicted"] = round(
            measured["runs_per_s"] / predicted["runs_per_s"], 2
        )
        found[name] = predicted
    return found


def cores_for(tokens_s: float, starts_s: float, us_per_token: float, ms_per_run: float) -> float:
    return tokens_s * us_per_token / 1e6 + starts_s * ms_per_run / 1000


def blend(
    alone: dict[str, Any], followed: dict[str, Any], name: str, part: str | None, share: float
) -> float:
    """A figure a token of the unfollowed runs, plus `share` of what following added (>= 0)."""
    base, more = alone[name], followed[name]
    if part is not None:
        base, more = base[part], more[part]
    return float(base) + share * max(0.0, float(more) - float(base))


def sizing(document: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """What `--sizes` concurrent runs need, from the measured costs: each run streams
    `--tokens-per-s` for `--run-seconds` (so `N / run_seconds` runs start each second), and a
    share `--followed` of them is followed from another replica. A cost a token is the
    unfollowed runs' (`stream_2`, else `stream_1`) plus, for that share, what following added
    (`stream_2_followed` less the unfollowed, each part at least 0): per-run cost x starts/s
    + tokens/s x (unfollowed + followed share x the feed's) a token."""
    found: dict[str, Any] = {}
    share = args.followed
    for kind, measured in document["backends"].items():
        if "stream_1" not in measured or "stream_2_followed" not in measured:
            continue
        alone = measured.get("stream_2", measured["stream_1"])
        followed = measured["stream_2_followed"]
        per_run = measured["turns_1"]["cpu_ms_per_run"]
        xacts_run = measured["turns_1"]["postgres_per_run"].get("xact_commit", 0.0)
        commands_run = measured["turns_1"]["redis_commands_per_run"]

        def per_token(name: str, part: str | None = None, fraction: float = share) -> float:
            return blend(alone, followed, name, part, fraction)  # noqa: B023

        for size in args.sizes:
            tokens_s = size * args.tokens_per_s
            starts_s = size / args.run_seconds

            def cores(part: str, fraction: float = share) -> float:
                us = per_token("cpu_us_per_token", part, fraction)
                return cores_for(tokens_s, starts_s, us, per_run[part])  # noqa: B023

            server = cores("server")
            replicas = max(1, math.ceil(server / BUSY))
            runs_per_replica = math.ceil(size / replicas)
            entry: dict[str, Any] = {
                "from": f"{'stream_2' if 'stream_2' in measured else 'stream_1'}"
                " + stream_2_followed",
                "followed_share": share,
                "tokens_per_s": round(tokens_s),
                "followed_tokens_per_s": round(tokens_s * share),
                "runs_started_per_s": round(starts_s, 1),
                "server_cores": round(server, 1),
                "server_cores_all_followed": round(cores("server", 1.0), 1),
                "replicas_at_70_pct": replicas,
                "runs_per_replica": runs_per_replica,
                "memory_gib_runs": round(size * per_token("rss_kib_per_run") / 2**20, 1),
                # A run's client and model call, and its reader's socket where followed.
                "fds_per_replica": math.ceil((2 + share) * runs_per_replica)
                + POOL_MAX
                + PG_EXTRA
                + 16,
                "model_pool_full": runs_per_replica > MODEL_MAX,
            }
            if kind == "postgres":
                xacts_token = per_token("postgres_xacts_per_token")
                entry["postgres_xacts_per_s"] = round(tokens_s * xacts_token + starts_s * xacts_run)
                entry["postgres_xacts_per_s_all_followed"] = round(
                    tokens_s * per_token("postgres_xacts_per_token", fraction=1.0)
                    + starts_s * xacts_run
                )
                entry["postgres_cores"] = round(cores("postgres"), 1)
                entry["postgres_cores_all_followed"] = round(cores("postgres", 1.0), 1)
                entry["postgres_frame_rows_per_s"] = round(
                    tokens_s * per_token("postgres_frame_rows_per_token")
                )
                entry["postgres_connections"] = replicas * (POOL_MAX + PG_EXTRA)
            else:
                entry["redis_commands_per_s"] = round(
                    tokens_s * per_token("redis_commands_per_token") + starts_s * commands_run
                )
                entry["redis_commands_per_s_all_followed"] = round(
                    tokens_s * per_token("redis_commands_per_token", fraction=1.0)
                    + starts_s * commands_run
                )
                entry["redis_cores"] = round(cores("redis"), 2)
                entry["redis_cores_all_followed"] = round(cores("redis", 1.0), 2)
                entry["redis_connections_max"] = replicas * REDIS_MAX
            found.setdefault(kind, {})[str(size)] = entry
    return found


# --- the run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def closing(close: Callable[[], None]) -> Iterator[None]:
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            close()


def commit() -> str:
    here = Path(__file__).resolve().parent
    done = subprocess.run(
        ["git", "-C", str(here), "describe", "--always", "--dirty", "--abbrev=12"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def main(args: argparse.Namespace) -> dict[str, Any]:
    from inflight import machine

    root = Path(tempfile.mkdtemp(prefix="bench-capacity-"))
    workload = vars(args).copy()
    document: dict[str, Any] = {
        "benchmark": "capacity",
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "workload": workload,
        "backends": {},
        "skipped": {},
    }
    try:
        model = Model(args.tokens_per_s, args.stream_seconds)
        with closing(model.close):
            for kind in args.backends:
                try:
                    store = Store(kind, root / kind)
                except (FileNotFoundError, OSError) as exc:
                    document["skipped"][kind] = f"{exc.__class__.__name__}: {exc}"
                    continue
                with closing(store.close):
                    found: dict[str, Any] = {}
                    for replicas in (1, 2):
                        found[f"turns_{replicas}"] = turns(store, model, replicas, args, root)
                        measured = found[f"turns_{replicas}"]["runs_per_s"]
                        print(f"capacity {kind} {replicas}: {measured} runs/s", file=sys.stderr)
                    if args.stream_runs:
                        # Runs nobody follows from another replica (a smoke run leaves out the
                        # 2-replica ones), then each followed from the other replica.
                        for replicas in (1,) if args.smoke else (1, 2):
                            found[f"stream_{replicas}"] = stream(
                                store, model, replicas, args, root, found["turns_1"]
                            )
                        found["stream_2_followed"] = stream(
                            store, model, 2, args, root, found["turns_1"], followed=True
                        )
                    found["model"] = check(found)
                    document["backends"][kind] = found
    finally:
        shutil.rmtree(root, ignore_errors=True)
    document["sizing"] = sizing(document, args)
    document["machine"]["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    return document


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="postgres,redis")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0, help="each short-turn window")
    parser.add_argument("--stream-runs", type=int, default=100)
    parser.add_argument("--stream-seconds", type=float, default=20.0)
    parser.add_argument("--tokens-per-s", type=float, default=20.0)
    parser.add_argument("--run-seconds", type=float, default=30.0, help="sizing: a run's length")
    parser.add_argument("--sizes", default="10000,100000", help="sizing: concurrent runs")
    parser.add_argument(
        "--followed",
        type=float,
        default=FOLLOWED,
        help="sizing: share of runs followed from another replica (docs/capacity.md)",
    )
    parser.add_argument("--settle", type=float, default=SETTLE, help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="a few runs: a check, not figures")
    parsed = parser.parse_args()
    parsed.backends = [name for name in parsed.backends.split(",") if name]
    parsed.sizes = [int(size) for size in parsed.sizes.split(",") if size]
    if parsed.smoke:
        parsed.clients, parsed.seconds, parsed.settle = 4, 3.0, 0.5
        parsed.stream_runs, parsed.stream_seconds = 4, 3.0
    raise_file_limit()
    fast_loop()
    exit_on_sigterm()
    print(json.dumps(main(parsed), indent=1))
