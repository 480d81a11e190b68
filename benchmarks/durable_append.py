"""How long one durable-run append holds the event loop, over thousands of appends.

    python benchmarks/durable_append.py [--turns 2000] > result.json

The embedded journal writes a run's frames and checkpoints on the event loop
(`SqliteRunStore.append_now`, see docs/durable-runs.md). This measures that on-loop time as a
run of `--turns` model turns of the `turns` benchmark makes it: per turn one append with the
model's answer (a `write_file` of 1 KiB or 50 KiB of the shared workload's content) and its
`tool-start` frame, then one with the call's `started` mark, its result and its `tool-result`
frame, all on one store (whose WAL the database thread checkpoints meanwhile, every 1 MiB,
when the run is written into SQLite rows, as before the run logs).

Reported per size: p50 / p99 / max of the wall time and of the loop thread's CPU time per
append, in microseconds, and of the time a turn's payloads take to encode (as the journal
encodes them for this store, `SqliteRunStore.encode`: before the append, also on the loop);
`refused` (appends the store left to its thread because it could not write them on the loop);
`slept`: the appends during which the loop's thread went to sleep (a voluntary context switch:
waiting on the disk, a lock or the GIL) and their wall times, and `preempted`: those the
scheduler took the CPU from (an involuntary one, which a busy machine does to any code); and,
as the scale for that, the same percentiles for a 1 KiB `os.write` to a file made between the
appends. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from common import machine, make_workload

from atmosphere_harness._contracts import StoredRun
from atmosphere_harness._durable import SqliteRunStore
from atmosphere_harness._kernel.writer import encode


def percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    at = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6, 1)  # noqa: E731
    return {"p50_us": at(0.5), "p99_us": at(0.99), "max_us": round(ordered[-1] * 1e6, 1)}


async def one_size(root: Path, turns: int, size_kib: int) -> dict[str, Any]:
    path, content = make_workload(1, size_kib)[0]
    store = SqliteRunStore.under(root)
    await store.open()
    run = StoredRun("run", "/bench", "conversation", None, "session", "go", time.time())
    wall: list[float] = []
    cpu: list[float] = []
    writes: list[float] = []
    blocked: list[float] = []
    preempted: list[float] = []
    refused = 0
    encodes: list[float] = []
    # The journal encodes a payload the way its store takes it (JSON, or the store's own form).
    coded = getattr(store, "encode", encode)
    scratch = os.open(root / "scratch", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        assert store.append_now("run", [], [], create=run, owner="bench", lease_seconds=60)
        seq = 0
        for turn in range(turns):
            call = f"call_{turn}"
            model = {
                "text": "",
                "calls": [[call, "write_file", {"path": path, "content": content}]],
            }
            start = {"toolCallId": call, "tool": "write_file", "arguments": {"$model": "m"}}
            end = {"toolCallId": call, "tool": "write_file", "result": f"Wrote {path}"}
            began = time.perf_counter()
            appends = (
                ([(seq + 1, "tool-start", coded(start))], [(f"model:{turn}", coded(model))]),
                (
                    [(seq + 2, "tool-result", coded(end))],
                    [(f"started:{turn}:{call}", "true"), (f"result:{turn}:{call}", coded("ok"))],
                ),
            )
            encodes.append(time.perf_counter() - began)
            seq += 2
            for frames, checkpoints in appends:
                before = resource.getrusage(resource.RUSAGE_THREAD)
                began_cpu, began = time.thread_time(), time.perf_counter()
                done = store.append_now("run", frames, checkpoints)
                wall.append(time.perf_counter() - began)
                cpu.append(time.thread_time() - began_cpu)
                after = resource.getrusage(resource.RUSAGE_THREAD)
                if after.ru_nvcsw > before.ru_nvcsw:
                    blocked.append(wall[-1])  # it slept: on the disk, a lock or the GIL
                elif after.ru_nivcsw > before.ru_nivcsw:
                    preempted.append(wall[-1])
                if not done:
                    refused += 1
                    await store.append("run", frames, checkpoints)
            began = time.perf_counter()
            os.write(scratch, b"x" * 1024)
            writes.append(time.perf_counter() - began)
            await asyncio.sleep(0)  # the loop turns, as between a run's steps
        await store.finish("run")
    finally:
        os.close(scratch)
        await store.aclose()
    return {
        "appends": len(wall),
        "refused": refused,
        "wall": percentiles(wall),
        "cpu": percentiles(cpu),
        "encode_per_turn": percentiles(encodes),
        "os_write_1kib": percentiles(writes),
        "slept": {"appends": len(blocked), **(percentiles(blocked) if blocked else {})},
        "preempted": {"appends": len(preempted), **(percentiles(preempted) if preempted else {})},
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"benchmark": "durable_append", "turns": args.turns}
    for size in (1, 50):
        with tempfile.TemporaryDirectory(prefix="bench-durable-append-") as tmp:
            result[f"{size}k"] = await one_size(Path(tmp), args.turns, size)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result["env"] = machine()
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=2000)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=1))
