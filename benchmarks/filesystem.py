"""Filesystem benchmark: our files and PostgreSQL workspaces vs deepagents' backends, and `rg`.

Workload (deterministic, seed 1234, deepagents' benchmark workload): 200 files of 50 KiB
(800 lines of exactly 64 bytes) in `pkg{0..9}/sub{0,1}/`, even indices `mod_XXX.py`, odd
`doc_XXX.md`; `needle_token` on every 50th line (3,200 hits), one `UNIQUE_SENTINEL_XYZ` line (a
full scan, 1 hit), one `EDIT_ANCHOR_<i>` line per file.

Each repeat runs every op on both stores in the same process, alternating which goes first, with
a fresh empty store per repeat. Grep is the same literal for both (deepagents greps literals
only). `rg` on the same tree is the floor: a compiled, parallel searcher with no Python around it.
`write_all_fsync` is our write with `fsync=True`, the figure behind the default `fsync=False`.

`postgres` is `PostgresAgentFileSystem` (`ATMOSPHERE_AI_WORKSPACE_BACKEND=postgres`) on a
throwaway database this script creates on 127.0.0.1:5432 (or `--postgres-url`, whose database
must be empty or hold no `bench:` stores) and drops at the end: every op a round trip (or a
transaction) to PostgreSQL, `glob`/`grep` reading the rows and matching in Python. deepagents'
own stores beside it: `FilesystemBackend` (sync, async, Python grep) and, when
`langgraph-checkpoint-postgres` is installed, `StoreBackend` on langgraph's `PostgresStore` (its
way of keeping files in PostgreSQL; otherwise `peer_store: null` with the reason).

    python benchmarks/filesystem.py --repeats 15 > result.json

Prints one JSON document: per-op medians (ms), the ratio ours / deepagents and ours / rg, and
`peer: null` with the reason when deepagents is not installed (`pip install '.[bench]'`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import make_workload, summary, version

from atmosphere_harness import FileSystemLimits, WorkspaceAgentFileSystem
from atmosphere_harness._filesystem import spares, workers
from atmosphere_harness._filesystem.tools import read_window

OPS = (
    "write_all",
    "read_all_full",
    "read_all_window",
    "ls_root",
    "glob_py",
    "grep_common_all",
    "grep_common_cap",
    "grep_rare",
    "edit_once",
)
RG_FLOOR = {"grep_common_all": "common", "grep_common_cap": "common", "grep_rare": "rare"}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1000.0, out


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


class Timings:
    """`await measure(name, work)` times one awaited op and keeps `(ms, result)` under `name`."""

    def __init__(self) -> None:
        self.out: dict[str, tuple[float, Any]] = {}

    async def __call__(self, name: str, work: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        value = await work()
        self.out[name] = ((time.perf_counter() - start) * 1000.0, value)
        return value


def expected_counts(files: list[tuple[str, str]]) -> dict[str, int]:
    """What every store must find in this workload (checked on every repeat)."""
    common = sum(content.count("needle_token") for _, content in files)
    return {
        "glob_py": sum(path.endswith(".py") for path, _ in files),
        "grep_common_all": common,
        "grep_common_cap": min(common, 1000),
        "grep_rare": 1,
    }


class Ours:
    """One repeat on a fresh `WorkspaceAgentFileSystem`, every op awaited as a tool would."""

    name = "ours"

    def __init__(self, root: Path, files: list[tuple[str, str]]) -> None:
        self.files = files
        self.expected = expected_counts(files)
        self.root = root
        self.loop = asyncio.new_event_loop()

    def close(self) -> None:
        self.loop.close()

    def run(self, repeat: int) -> dict[str, tuple[float, Any]]:
        return self.loop.run_until_complete(self._run(repeat))

    async def _run(self, repeat: int) -> dict[str, tuple[float, Any]]:
        root = self.root / f"ours-{repeat}"
        fs = WorkspaceAgentFileSystem(root)
        fs_all = WorkspaceAgentFileSystem(root, FileSystemLimits(max_grep_hits=10_000))
        fs_cap = WorkspaceAgentFileSystem(root, FileSystemLimits(max_grep_hits=1000))
        durable = WorkspaceAgentFileSystem(self.root / f"ours-fsync-{repeat}", fsync=True)
        files = self.files
        measure = Timings()
        out = measure.out

        async def write_all(store: WorkspaceAgentFileSystem) -> None:
            for path, content in files:
                await store.write(path, content)

        async def read_all() -> list[str]:
            return [await fs.read(path) for path, _ in files]

        async def read_window_all() -> list[str]:
            return [read_window(await fs.read(path), path, 0, 100, 0) for path, _ in files]

        await measure("write_all", lambda: write_all(fs))
        texts = await measure("read_all_full", read_all)
        check(texts == [content for _, content in files], "ours: read-back differs")
        await measure("read_all_window", read_window_all)
        await measure("ls_root", fs.ls)
        expected = self.expected
        globbed = await measure("glob_py", lambda: fs.glob("**/*.py"))
        check(len(globbed) == expected["glob_py"], "ours: glob")
        # The edit comes before the greps on every side: ours scans the 10 MiB in this process,
        # deepagents' `rg` in a child process, and an edit right after an in-process scan of
        # that size costs either side 130-200 us more (cold caches).
        i = repeat % len(files)
        path = files[i][0]
        await measure(
            "edit_once", lambda: fs.edit(path, f"EDIT_ANCHOR_{i} ", f"EDITED_ANCHOR_{i} ")
        )
        hits = await measure("grep_common_all", lambda: fs_all.grep("needle_token"))
        check(len(hits) == expected["grep_common_all"], f"ours: {len(hits)} common hits")
        hits = await measure("grep_common_cap", lambda: fs_cap.grep("needle_token"))
        check(len(hits) == expected["grep_common_cap"], "ours: capped hits")
        hits = await measure("grep_rare", lambda: fs.grep("UNIQUE_SENTINEL_XYZ"))
        check(len(hits) == expected["grep_rare"], "ours: rare hit")
        await measure("write_all_fsync", lambda: write_all(durable))
        return out


class Postgres:
    """One repeat on a fresh `PostgresAgentFileSystem` store, every op awaited as a tool would."""

    name = "postgres"

    def __init__(self, url: str, files: list[tuple[str, str]]) -> None:
        from atmosphere_harness._backends.postgres import PostgresAgentFileSystem, PostgresDatabase

        self.store_class = PostgresAgentFileSystem
        self.files = files
        self.expected = expected_counts(files)
        self.loop = asyncio.new_event_loop()
        self.database = PostgresDatabase(url)
        self.loop.run_until_complete(self.database.open())

    def close(self) -> None:
        self.loop.run_until_complete(self.database.aclose())
        self.loop.close()

    def run(self, repeat: int) -> dict[str, tuple[float, Any]]:
        return self.loop.run_until_complete(self._run(repeat))

    async def _run(self, repeat: int) -> dict[str, tuple[float, Any]]:
        store = f"bench:{repeat}"
        make = self.store_class
        fs = make(self.database, store)
        fs_all = make(self.database, store, FileSystemLimits(max_grep_hits=10_000))
        fs_cap = make(self.database, store, FileSystemLimits(max_grep_hits=1000))
        files = self.files
        measure = Timings()

        async def write_all() -> None:
            for path, content in files:
                await fs.write(path, content)

        async def read_all() -> list[str]:
            return [await fs.read(path) for path, _ in files]

        async def read_window_all() -> list[str]:
            return [read_window(await fs.read(path), path, 0, 100, 0) for path, _ in files]

        await measure("write_all", write_all)
        texts = await measure("read_all_full", read_all)
        check(texts == [content for _, content in files], "postgres: read-back differs")
        await measure("read_all_window", read_window_all)
        await measure("ls_root", fs.ls)
        expected = self.expected
        globbed = await measure("glob_py", lambda: fs.glob("**/*.py"))
        check(len(globbed) == expected["glob_py"], "postgres: glob")
        i = repeat % len(files)
        path = files[i][0]
        await measure(
            "edit_once", lambda: fs.edit(path, f"EDIT_ANCHOR_{i} ", f"EDITED_ANCHOR_{i} ")
        )
        hits = await measure("grep_common_all", lambda: fs_all.grep("needle_token"))
        check(len(hits) == expected["grep_common_all"], f"postgres: {len(hits)} common hits")
        hits = await measure("grep_common_cap", lambda: fs_cap.grep("needle_token"))
        check(len(hits) == expected["grep_common_cap"], "postgres: capped hits")
        hits = await measure("grep_rare", lambda: fs.grep("UNIQUE_SENTINEL_XYZ"))
        check(len(hits) == expected["grep_rare"], "postgres: rare hit")
        return measure.out


class Peer:
    """One repeat on a fresh deepagents `FilesystemBackend(virtual_mode=True)`.

    `asynchronous` calls its `a*` methods (thread-hop wrappers, what an async server pays),
    otherwise the sync ones deepagents' benchmark times; `ripgrep=False` forces its Python grep.
    """

    def __init__(
        self, root: Path, files: list[tuple[str, str]], *, ripgrep: bool, asynchronous: bool
    ) -> None:
        from deepagents.backends import FilesystemBackend
        from deepagents.backends import filesystem as module

        self.module = module
        self.backend_class = FilesystemBackend
        self.root = root
        self.files = [("/" + path, content) for path, content in files]
        self.expected = expected_counts(files)
        self.ripgrep = ripgrep
        self.asynchronous = asynchronous
        self.name = (
            "deepagents" + ("_async" if asynchronous else "") + ("" if ripgrep else "_pygrep")
        )
        self.loop = asyncio.new_event_loop()

    def close(self) -> None:
        self.loop.close()

    def run(self, repeat: int) -> dict[str, tuple[float, Any]]:
        original = self.module._resolve_ripgrep_path
        if not self.ripgrep:
            self.module._resolve_ripgrep_path = lambda: None
        else:
            original.cache_clear()
        try:
            return self.loop.run_until_complete(self._run(repeat))
        finally:
            self.module._resolve_ripgrep_path = original

    def backend(self, repeat: int) -> Any:
        directory = self.root / f"{self.name}-{repeat}"
        directory.mkdir()
        return self.backend_class(root_dir=str(directory), virtual_mode=True)

    async def _run(self, repeat: int) -> dict[str, tuple[float, Any]]:
        backend = self.backend(repeat)

        async def call(method: str, *args: Any, **kwargs: Any) -> Any:
            if self.asynchronous:
                return await getattr(backend, "a" + method)(*args, **kwargs)
            return getattr(backend, method)(*args, **kwargs)

        files = self.files
        measure = Timings()
        out = measure.out

        async def each(method: str, *args: Any) -> list[Any]:
            return [await call(method, path, *args) for path, _ in files]

        async def write_all() -> list[Any]:
            return [await call("write", path, content) for path, content in files]

        await measure("write_all", write_all)
        read = await measure("read_all_full", lambda: each("read", 0, 10**9))
        check(all(result.error is None for result in read), "peer: read")
        await measure("read_all_window", lambda: each("read", 0, 100))
        await measure("ls_root", lambda: call("ls", "/"))
        expected = self.expected
        globbed = await measure("glob_py", lambda: call("glob", "**/*.py"))
        check(len(globbed.matches) == expected["glob_py"], "peer: glob")
        i = repeat % len(files)  # (before the greps, as on our side: see `Ours._run`)
        path = files[i][0]
        old, new = f"EDIT_ANCHOR_{i} ", f"EDITED_ANCHOR_{i} "
        edited = await measure("edit_once", lambda: call("edit", path, old, new))
        check(edited.error is None, "peer: edit")
        hits = await measure(
            "grep_common_all", lambda: call("grep", "needle_token", "/", max_count=None)
        )
        check(len(hits.matches) == expected["grep_common_all"], "peer: common hits")
        await measure("grep_common_cap", lambda: call("grep", "needle_token", "/", max_count=1000))
        hits = await measure("grep_rare", lambda: call("grep", "UNIQUE_SENTINEL_XYZ", "/"))
        check(len(hits.matches) == expected["grep_rare"], "peer: rare hit")
        return out


class PeerStore(Peer):
    """deepagents' way to keep files in PostgreSQL: `StoreBackend` on langgraph's sync
    `PostgresStore` (extra packages `langgraph-checkpoint-postgres`, `psycopg[binary,pool]`),
    a fresh namespace per repeat, its sync methods (as `deepagents`)."""

    def __init__(self, url: str, files: list[tuple[str, str]]) -> None:
        from deepagents.backends import StoreBackend
        from langgraph.store.postgres import PostgresStore

        super().__init__(Path(), files, ripgrep=False, asynchronous=False)
        self.name = "deepagents_store_postgres"
        self.store_backend = StoreBackend
        self._context = PostgresStore.from_conn_string(url)
        self.store = self._context.__enter__()
        self.store.setup()

    def close(self) -> None:
        self._context.__exit__(None, None, None)
        super().close()

    def run(self, repeat: int) -> dict[str, tuple[float, Any]]:
        return self.loop.run_until_complete(self._run(repeat))

    def backend(self, repeat: int) -> Any:
        namespace = ("fsbench", str(repeat))
        return self.store_backend(store=self.store, namespace=lambda _runtime: namespace)


def rg_floor(tree: Path, rg: str, expected: dict[str, int]) -> dict[str, tuple[float, Any]]:
    out = {}
    for name, literal, count in (
        ("common", "needle_token", expected["grep_common_all"]),
        ("rare", "UNIQUE_SENTINEL_XYZ", expected["grep_rare"]),
    ):
        command = [rg, "-n", "--no-heading", "-F", literal, str(tree)]
        ms, done = timed(lambda command=command: subprocess.run(command, capture_output=True))
        check(len(done.stdout.splitlines()) == count, f"rg {name}")
        out[name] = (ms, None)
    return out


LOOPBACK = "postgresql://postgres@127.0.0.1:5432"


async def _admin(statement: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(f"{LOOPBACK}/test", timeout=5)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


def throwaway_database() -> tuple[str | None, str | None]:
    """`(url, None)` of a new database on the loopback PostgreSQL, or `(None, reason)`."""
    name = f"atmo_fsbench_{uuid.uuid4().hex[:8]}"
    try:
        asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        return None, f"PostgreSQL unavailable on 127.0.0.1:5432: {exc}"
    return f"{LOOPBACK}/{name}", None


def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--size-kib", type=int, default=50)
    parser.add_argument("--postgres-url", default=None, help="default: a throwaway database")
    args = parser.parse_args()

    files = make_workload(args.files, args.size_kib)
    base = Path(tempfile.mkdtemp(prefix="fs-bench-"))
    runners: list[Any] = [Ours(base, files)]
    peer_reason = None
    try:
        for ripgrep, asynchronous in ((True, False), (True, True), (False, False)):
            runners.append(Peer(base, files, ripgrep=ripgrep, asynchronous=asynchronous))
    except ImportError as exc:
        peer_reason = f"deepagents is not installed ({exc}); pip install '.[bench]'"
    created: str | None = None
    postgres_url, postgres_reason = args.postgres_url, None
    if postgres_url is None:
        postgres_url, postgres_reason = throwaway_database()
        created = postgres_url
    if postgres_url is not None:
        try:
            runners.append(Postgres(postgres_url, files))
        except Exception as exc:
            postgres_reason = f"PostgreSQL workspace unavailable: {type(exc).__name__}: {exc}"
        if peer_reason is None:
            try:
                runners.append(PeerStore(postgres_url, files))
            except Exception as exc:
                store_reason = f"{type(exc).__name__}: {exc}"
            else:
                store_reason = None
        else:
            store_reason = peer_reason
    else:
        store_reason = postgres_reason
    rg = shutil.which("rg")
    samples: dict[str, dict[str, list[float]]] = {runner.name: {} for runner in runners}
    samples["rg"] = {}
    try:
        for repeat in range(args.repeats):
            order = runners if repeat % 2 == 0 else list(reversed(runners))
            for runner in order:
                for op, (ms, _) in runner.run(repeat).items():
                    samples[runner.name].setdefault(op, []).append(ms)
            if rg:
                floor = rg_floor(base / f"ours-{repeat}", rg, expected_counts(files))
                for name, (ms, _) in floor.items():
                    samples["rg"].setdefault(name, []).append(ms)
    finally:
        for runner in runners:
            runner.close()
        shutil.rmtree(base, ignore_errors=True)
        if created is not None:
            drop_database(created)

    results = {name: {op: summary(v) for op, v in ops.items()} for name, ops in samples.items()}
    ours = results["ours"]
    peer = results.get("deepagents")

    def ratio(a: float, b: float) -> float:
        return round(a / b, 3) if b else float("inf")

    ratios: dict[str, dict[str, float]] = {}
    for op in OPS:
        entry: dict[str, float] = {}
        if peer is not None:
            entry["vs_deepagents"] = ratio(ours[op]["median_ms"], peer[op]["median_ms"])
            for variant in ("deepagents_async", "deepagents_pygrep"):
                entry[f"vs_{variant}"] = ratio(
                    ours[op]["median_ms"], results[variant][op]["median_ms"]
                )
        if op in RG_FLOOR and results["rg"]:
            entry["vs_rg"] = ratio(ours[op]["median_ms"], results["rg"][RG_FLOOR[op]]["median_ms"])
        if "postgres" in results:
            rows = results["postgres"][op]["median_ms"]
            entry["postgres_vs_ours"] = ratio(rows, ours[op]["median_ms"])
            if peer is not None:
                entry["postgres_vs_deepagents"] = ratio(rows, peer[op]["median_ms"])
            if "deepagents_store_postgres" in results:
                entry["postgres_vs_deepagents_store_postgres"] = ratio(
                    rows, results["deepagents_store_postgres"][op]["median_ms"]
                )
        ratios[op] = entry
    document = {
        "benchmark": "filesystem",
        "env": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "ripgrep": subprocess.run(
                [rg, "--version"], capture_output=True, text=True
            ).stdout.split("\n")[0]
            if rg
            else None,
            "atmosphere-harness": version("atmosphere-harness"),
            "deepagents": version("deepagents"),
            "regex": version("regex"),
        },
        "workload": {
            "files": args.files,
            "size_kib": args.size_kib,
            "total_mib": round(sum(len(c) for _, c in files) / 2**20, 3),
            "repeats": args.repeats,
            "seed": 1234,
        },
        "ours": ours,
        # How our small operations ran: a cool-down sends them through the worker threads
        # (`workers.ON_LOOP`; a lone slow one is a hiccup, let pass), and writes fill spare
        # files made ahead of time.
        "ours_on_loop": {
            "cool_downs": workers.ON_LOOP.trips,
            "hiccups": workers.ON_LOOP.hiccups,
            "spare_files_used": spares.SPARES.used,
        },
        "peer": peer,
        "peer_reason": peer_reason,
        "peer_variants": {
            variant: results.get(variant) for variant in ("deepagents_async", "deepagents_pygrep")
        },
        "rg": results["rg"] or None,
        "postgres": results.get("postgres"),
        "postgres_reason": postgres_reason,
        "peer_store": results.get("deepagents_store_postgres"),
        "peer_store_reason": store_reason,
        "ratios": ratios,
        "goals": {
            "no_op_slower_than_deepagents": None
            if peer is None
            else all(ratios[op]["vs_deepagents"] <= 1.0 for op in OPS),
            "no_op_slower_than_deepagents_async": None
            if peer is None
            else all(ratios[op]["vs_deepagents_async"] <= 1.0 for op in OPS),
            "grep_within_3x_of_rg": None
            if not results["rg"]
            else all(ratios[op]["vs_rg"] <= 3.0 for op in RG_FLOOR),
        },
    }
    json.dump(document, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
