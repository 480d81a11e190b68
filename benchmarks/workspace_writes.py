"""What exactness across processes costs a process writing alone: small writes and edits through
`WorkspaceAgentFileSystem` with the shared-volume ledger (the default) and the in-process one.

Both run in the same process, op by op: each op is run on a store of each kind in turn,
alternating which goes first, each round on fresh stores, so the two share the machine's noise
and the ratio holds while its speed drifts. Ops (per call, awaited one after another, as a
model's tool calls are):

- `new_1k`: create a 1 KiB file (a new file: count and bytes reserved);
- `overwrite_1k`: replace one of 100 existing 1 KiB files;
- `edit`: `edit_file` on a 1 KiB file (read, replace, write, all under the hold).

`--contended` adds a figure for two processes writing one store at once (each recounts when it
finds the other's mark): the median per write seen by each.

    python benchmarks/workspace_writes.py --rounds 7 --ops 1000 > result.json
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atmosphere_harness import FileSystemLimits, WorkspaceAgentFileSystem
from atmosphere_harness._filesystem.usage import (
    InProcessWorkspaceUsage,
    SharedVolumeWorkspaceUsage,
)

LIMITS = FileSystemLimits(max_files=100_000, max_total_bytes=1 << 30)
BODY = "x" * 1023 + "\n"
USAGES: dict[str, type[Any]] = {
    "shared_volume": SharedVolumeWorkspaceUsage,
    "in_process": InProcessWorkspaceUsage,
}


async def one_round(root: Path, ops: int) -> dict[str, dict[str, list[float]]]:
    """One round: a store per ledger, each op run on both, alternating which goes first, so
    the two share the machine's noise op by op."""
    stores = {
        name: WorkspaceAgentFileSystem(root / name, LIMITS, usage=usage())
        for name, usage in USAGES.items()
    }
    times: dict[str, dict[str, list[float]]] = {
        name: {"new_1k": [], "overwrite_1k": [], "edit": []} for name in USAGES
    }
    clock = time.perf_counter
    names = list(USAGES)

    async def each(op: str, number: int, call: Callable[[WorkspaceAgentFileSystem], Any]) -> None:
        for name in names if number % 2 == 0 else reversed(names):
            start = clock()
            await call(stores[name])
            times[name][op].append(clock() - start)

    for i in range(ops):
        new = f"d{i % 10}/new_{i}.txt"
        await each("new_1k", i, lambda fs, path=new: fs.write(path, BODY))
    for i in range(ops):
        old = f"d{i % 10}/new_{i % 100}.txt"
        await each("overwrite_1k", i, lambda fs, path=old: fs.write(path, BODY))
    for fs in stores.values():
        await fs.write("edit.txt", "marker-0\n" + BODY)
    for i in range(ops):
        was, now = f"marker-{i}\n", f"marker-{i + 1}\n"
        await each("edit", i, lambda fs, was=was, now=now: fs.edit("edit.txt", was, now))
    return times


def us(values: list[float]) -> float:
    return round(statistics.median(values) * 1e6, 1)


async def alone(rounds: int, ops: int) -> dict[str, Any]:
    medians: dict[str, dict[str, list[float]]] = {name: {} for name in USAGES}
    with tempfile.TemporaryDirectory() as scratch:
        for number in range(rounds):
            times = await one_round(Path(scratch) / f"round-{number}", ops)
            for name, ops_times in times.items():
                for op, values in ops_times.items():
                    medians[name].setdefault(op, []).append(us(values))
    result: dict[str, Any] = {}
    for op in medians["shared_volume"]:
        shared = statistics.median(medians["shared_volume"][op])
        local = statistics.median(medians["in_process"][op])
        result[op] = {
            "shared_volume_us": shared,
            "in_process_us": local,
            "ratio": round(shared / local, 3),
            "per_round_us": {name: medians[name][op] for name in USAGES},
        }
    return result


def contended_worker(root: str, ops: int, tag: str) -> None:
    """Child: `ops` overwrites of its own files in the shared store; prints its median (us)."""

    async def run() -> list[float]:
        fs = WorkspaceAgentFileSystem(root, LIMITS)
        times = []
        for i in range(ops):
            start = time.perf_counter()
            await fs.write(f"{tag}/f{i % 50}.txt", BODY)
            times.append(time.perf_counter() - start)
        return times

    print(json.dumps(us(asyncio.run(run()))))


def contended(ops: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        root = os.path.join(scratch, "store")
        command = [sys.executable, __file__, "--child", root, "--ops", str(ops)]
        children = [
            subprocess.Popen([*command, "--tag", tag], stdout=subprocess.PIPE, text=True)
            for tag in ("a", "b")
        ]
        medians = [json.loads(child.communicate()[0]) for child in children]
    return {"two_processes_overwrite_1k_us": medians, "ops_each": ops}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--contended", action="store_true")
    parser.add_argument("--child")
    parser.add_argument("--tag", default="a")
    args = parser.parse_args()
    if args.child:
        contended_worker(args.child, args.ops, args.tag)
        return 0
    out: dict[str, Any] = {
        "benchmark": "workspace_writes",
        "rounds": args.rounds,
        "ops": args.ops,
        "alone": asyncio.run(alone(args.rounds, args.ops)),
    }
    if args.contended:
        out["contended"] = contended(args.ops)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
