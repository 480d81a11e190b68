"""What the durable journal adds per model turn, the journal alone, with little noise.

    python benchmarks/durable_journal.py [--turns 60] [--repeats 40] > result.json

`turns.py --sections durable` measures a whole prompt with durable runs off and on; on a busy
2-core machine its figure moves by tens of microseconds from run to run, more than what a
change to the journal moves. This records the journal calls of one real durable `turns` prompt
(`seq <turns> <KiB>`: each model turn one `write_file` of 1 KiB or 50 KiB of the shared workload's
content; every `LiveRun.publish`, `DurableRun.checkpoint` and `DurableRun.note` the kernel made,
in order) and replays them on a live run with a reader attached, without a store (durable runs
off) and with the embedded one (`SqliteRunStore`, durable runs on), alternated `--repeats`
times in one process.
Each `started` mark is followed by `asyncio.sleep(--tool-seconds)` (the tool; by default 0: the
journal's own work, with no idle loop in between, whose wake-ups this VM charges 40-60 us of
CPU each; with 0.0002 the loop sleeps about a millisecond a turn, epoll's resolution, and the
journal writes about every other turn, as its 2 ms grouping makes it).

Reported per size, per model turn (a prompt's figure over `--turns`, as `turns.py` counts):
the medians of each side's wall and CPU time, `added_us` (the median of the paired
differences, on minus off, wall and CPU), the minor page faults each side took, and the
durable side's log writes and bytes written. `parts_cpu_us` splits the added CPU time: the
same replay on a store that takes each append without packing it (`encode`: the journal's own
work, encoding payloads and grouping writes), one that packs it into a record but does not
write it (`pack`), and the real store (`write`), each the median of its paired differences
with durable runs off, alternated with the others. What it leaves out: the kernel's own work around
each checkpoint (its key, the model answer's dict), the history read behind the run's
`since:` mark (`newest_seq`), a real tool's worker thread, and the finished run's compaction;
and it runs with warm caches, where the same code costs about half what it does inside a real
turn (docs/benchmarks.md counts a whole prompt's instructions instead).
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import machine
from turns import Ours

from atmosphere_harness._contracts import StoredRun
from atmosphere_harness._durable import SqliteRunStore, journal
from atmosphere_harness._durable.log import pack_parts
from atmosphere_harness._durable.writer import STARTED, DurableWriter
from atmosphere_harness._events import Frame
from atmosphere_harness._kernel.live import LiveRun

Call = tuple[str, Any, Any, bool]
"""A recorded journal call: `("frame", frame, None, False)` or
`("checkpoint", key, value, wait)`."""


async def record(root: Path, turns: int, size: int) -> list[Call]:
    """The journal calls of one durable `seq <turns> <size>` prompt, as the kernel made them."""
    calls: list[Call] = []
    publish, checkpoint = LiveRun.publish, journal.DurableRun.checkpoint
    note = DurableWriter.checkpoint  # (a run's `note` is its writer's `checkpoint`)
    waited: list[bool] = []

    async def recorded_publish(self: LiveRun, frame: Frame) -> None:
        calls.append(("frame", frame, None, False))
        await publish(self, frame)

    async def recorded_checkpoint(
        self: journal.DurableRun, key: str, value: Any, *, wait: bool = False
    ) -> None:
        calls.append(("checkpoint", key, value, wait))
        waited.append(True)
        try:
            await checkpoint(self, key, value, wait=wait)
        finally:
            waited.pop()

    def recorded_note(self: DurableWriter, key: str, value: Any) -> None:
        if not waited:
            calls.append(("checkpoint", key, value, False))
        note(self, key, value)

    LiveRun.publish = recorded_publish  # type: ignore[method-assign]
    journal.DurableRun.checkpoint = recorded_checkpoint  # type: ignore[method-assign]
    DurableWriter.checkpoint = recorded_note  # type: ignore[method-assign]
    try:
        async with Ours(root, turns, durable=True) as ours:
            await ours.prompt_journalled(f"seq {turns} {size}")
    finally:
        LiveRun.publish = publish  # type: ignore[method-assign]
        journal.DurableRun.checkpoint = checkpoint  # type: ignore[method-assign]
        DurableWriter.checkpoint = note  # type: ignore[method-assign]
    return calls


class Counted:
    """The store's log writes, counted (calls and bytes)."""

    def __init__(self, store: SqliteRunStore) -> None:
        self.writes = 0
        self.bytes = 0
        logs = store._logs
        write = logs.write

        def counted(row: int, record: Any, *, new: bool = False) -> None:
            self.writes += 1
            parts = [record] if isinstance(record, bytes) else record
            self.bytes += sum(len(part) for part in parts)
            write(row, record, new=new)

        logs.write = counted  # type: ignore[method-assign]


class Unwritten:
    """A store that takes every append on the loop and keeps nothing: the journal's own work
    alone (`pack`: each append also packed into its record, as the embedded store packs it)."""

    name = "unwritten"
    encode = staticmethod(SqliteRunStore.encode)

    def __init__(self, pack: bool) -> None:
        self.pack = pack

    def append_now(
        self,
        run_id: str,
        frames: Sequence[tuple[int, str, str]],
        checkpoints: Sequence[tuple[str, str]],
        **_: Any,
    ) -> bool:
        if self.pack:
            pack_parts(frames, checkpoints)
        return True

    async def append(self, *_: Any, **__: Any) -> None:
        return None

    async def finish(self, run_id: str) -> None:
        return None


async def replay(
    calls: list[Call], store: SqliteRunStore | Unwritten | None, tool_seconds: float
) -> tuple[float, float, int]:
    """Wall and CPU seconds, and minor faults, of one replay (`store`: durable runs on)."""
    writer = None
    if store is not None:
        run = StoredRun(uuid.uuid4().hex, "/bench", "conversation", None, "s", "go", time.time())
        writer = DurableWriter(
            store,  # type: ignore[arg-type]  # (`Unwritten` is only what the writer calls)
            run.run_id,
            owner="bench/1/x",
            lease_seconds=60,
            create=run,
        )
    live = LiveRun("/bench", "conversation", None, session_id="s", writer=writer)
    if writer is not None:
        writer.on_stored = live._stored

    async def read() -> int:
        return len([frame async for frame in live.follow(0)])

    reader = asyncio.ensure_future(read())
    await asyncio.sleep(0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu, wall = time.process_time(), time.perf_counter()
    for kind, first, value, wait in calls:
        if kind == "frame":
            await live.publish(first)
            continue
        if writer is not None:
            writer.checkpoint(first, value)
            if wait:
                await writer.flushed()
        if first.startswith(STARTED):
            await asyncio.sleep(tool_seconds)  # the tool
    if writer is not None:
        await writer.flushed()
    live.finish()
    await reader
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    if writer is not None and store is not None:
        await store.finish(writer.run_id)
    return wall, cpu, faults


def us(seconds: float, turns: int) -> float:
    return round(seconds * 1e6 / turns, 2)


async def one_size(root: Path, args: argparse.Namespace, size: int) -> dict[str, Any]:
    turns = args.turns
    calls = await record(root / f"record-{size}", turns, size)
    store = SqliteRunStore.under(root / f"replay-{size}")
    await store.open()
    counted = Counted(store)
    stores: dict[str, SqliteRunStore | Unwritten | None] = {
        "off": None,
        "on": store,
        "encode": Unwritten(pack=False),
        "pack": Unwritten(pack=True),
    }
    samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in stores}
    try:
        for index in range(args.repeats + 2):
            sides = list(stores) if index % 2 else list(stores)[::-1]
            for side in sides:
                if index == 2 and side == sides[0]:
                    counted.writes = counted.bytes = 0  # (after two warm-up rounds)
                sample = await replay(calls, stores[side], args.tool_seconds)
                if index >= 2:
                    samples[side].append(sample)
    finally:
        await store.aclose()
    off, on = samples["off"], samples["on"]
    model_turns = sum(
        1 for kind, key, _, _ in calls if kind == "checkpoint" and str(key).startswith("model:")
    )
    per = turns * len(on)
    return {
        "model_turns": model_turns,
        "journal_calls": len(calls),
        "off": {
            "wall_us": us(statistics.median(s[0] for s in off), turns),
            "cpu_us": us(statistics.median(s[1] for s in off), turns),
            "minor_faults": round(statistics.median(s[2] for s in off) / turns, 2),
        },
        "on": {
            "wall_us": us(statistics.median(s[0] for s in on), turns),
            "cpu_us": us(statistics.median(s[1] for s in on), turns),
            "minor_faults": round(statistics.median(s[2] for s in on) / turns, 2),
            "log_writes": round(counted.writes / per, 3),
            "log_bytes": round(counted.bytes / per),
        },
        "added_us": {
            "wall": us(statistics.median(a[0] - b[0] for a, b in zip(on, off, strict=True)), turns),
            "cpu": us(statistics.median(a[1] - b[1] for a, b in zip(on, off, strict=True)), turns),
        },
        "parts_cpu_us": {
            part: us(
                statistics.median(a[1] - b[1] for a, b in zip(samples[side], off, strict=True)),
                turns,
            )
            for part, side in (("encode", "encode"), ("pack", "pack"), ("write", "on"))
        },
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "benchmark": "durable_journal",
        "turns": args.turns,
        "repeats": args.repeats,
        "tool_seconds": args.tool_seconds,
    }
    with tempfile.TemporaryDirectory(prefix="bench-durable-journal-") as tmp:
        for size in (1, 50):
            result[f"{size}k"] = await one_size(Path(tmp), args, size)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result["env"] = machine()
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--tool-seconds", type=float, default=0.0)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=1))
