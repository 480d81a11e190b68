"""What exactness across processes costs a process writing alone: small writes and edits through
`WorkspaceAgentFileSystem` with the shared-volume ledger (the default) and the in-process one.

Both run in the same process on the same machine, alternating which goes first in each round,
each round on fresh stores, so the ratio holds while the machine's speed drifts. Ops (per call,
awaited one after another, as a model's tool calls are):

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
from pathlib import Path
from typing import Any

from atmosphere_harness import FileSystemLimits, WorkspaceAgentFileSystem
from atmosphere_harness.filesystem.usage import (
    InProcessWorkspaceUsage,
    SharedVolumeWorkspaceUsage,
    WorkspaceUsage,
)

LIMITS = FileSystemLimits(max_files=100_000, max_total_bytes=1 << 30)
BODY = "x" * 1023 + "\n"
USAGES: dict[str, type[Any]] = {
    "shared_volume": SharedVolumeWorkspaceUsage,
    "in_process": InProcessWorkspaceUsage,
}


async def one_round(root: Path, usage: WorkspaceUsage, ops: int) -> dict[str, list[float]]:
    fs = WorkspaceAgentFileSystem(root, LIMITS, usage=usage)
    times: dict[str, list[float]] = {"new_1k": [], "overwrite_1k": [], "edit": []}
    clock = time.perf_counter
    for i in range(ops):
        start = clock()
        await fs.write(f"d{i % 10}/new_{i}.txt", BODY)
        times["new_1k"].append(clock() - start)
    for i in range(ops):
        start = clock()
        await fs.write(f"d{i % 10}/new_{i % 100}.txt", BODY)
        times["overwrite_1k"].append(clock() - start)
    await fs.write("edit.txt", "marker-0\n" + BODY)
    for i in range(ops):
        start = clock()
        await fs.edit("edit.txt", f"marker-{i}\n", f"marker-{i + 1}\n")
        times["edit"].append(clock() - start)
    return times


def us(values: list[float]) -> float:
    return round(statistics.median(values) * 1e6, 1)


async def alone(rounds: int, ops: int) -> dict[str, Any]:
    medians: dict[str, dict[str, list[float]]] = {name: {} for name in USAGES}
    with tempfile.TemporaryDirectory() as scratch:
        for number in range(rounds):
            order = list(USAGES) if number % 2 == 0 else list(reversed(USAGES))
            for name in order:
                root = Path(scratch) / f"{name}-{number}"
                times = await one_round(root, USAGES[name](), ops)
                for op, values in times.items():
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
