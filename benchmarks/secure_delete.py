"""What wiping deleted data costs: SQLite's `secure_delete` on a normal turn, and the scrub
after a deletion.

    python benchmarks/secure_delete.py [--repeats 7] [--turns 60] > result.json

Two hosts in one process, each with its own `workspace_root` and durable runs on (a turn's
history rows and the run's journal rows, deleted when the run is compacted, all in the SQLite
file): one whose SQLite connection has `secure_delete` off, one with it on (the shipped
setting). Both run the `turns` prompts of `benchmarks/turns.py` (60 model turns, each writing a
1 KiB or a 50 KiB file) as the HTTP routes run them, alternated (`turns.compare`: the order
flips every repeat). For each: `per_turn_ms` (the prompt's wall time / turns), and
`cpu_per_turn_ms` (the process's CPU time, every thread, from the prompt's start until the
history packer rewrote every large payload: the background rewrites are where deleted cells
are zeroed); `overhead_pct` = on / off - 1. Then each host deletes its conversations one by one
(`DELETE P/conversations/{id}` as the route does it, alternated): `delete_ms` each, the `on`
side including the scrub (WAL checkpoint and truncate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import machine, summary
from turns import PATH, Ours, compare

from atmosphere_harness._memory import sqlite as sqlite_module
from atmosphere_harness._memory.sqlite import DATABASE_FILE, SqliteDatabase


class Side:
    """One host, its `secure_delete` setting, and the conversations its prompts used."""

    def __init__(self, ours: Ours) -> None:
        self.ours = ours
        self.conversations: list[str] = []

    async def __call__(self, message: str) -> tuple[float, list[float]]:
        ours = self.ours
        conversation = uuid.uuid4().hex
        self.conversations.append(conversation)
        ours.stamps.clear()
        ours.model.job = message
        cpu = time.process_time()
        started = time.perf_counter()
        live = ours.host.start_run(
            ours.host.endpoints[PATH], message=message, conversation_id=conversation, user_id=None
        )
        frames = [frame async for frame in live.follow(0)]
        elapsed = time.perf_counter() - started
        if frames[-1].event != "complete":
            raise AssertionError(f"the run did not complete: {frames[-1]}")
        while getattr(ours.host.runs, "_closers", None):  # the run's compaction
            await asyncio.sleep(0.001)
        await ours.settle()
        return elapsed, [time.process_time() - cpu]

    async def delete_one(self) -> float:
        conversation = self.conversations.pop()
        started = time.perf_counter()
        await self.ours.host.forget_conversation(PATH, conversation)
        return time.perf_counter() - started


async def started(root: Path, turns: int, secure_delete: str) -> Ours:
    """A started host whose SQLite connection has `secure_delete` as given (read when the
    connection opens, at start)."""
    shipped = sqlite_module.SECURE_DELETE
    sqlite_module.SECURE_DELETE = secure_delete
    try:
        ours = Ours(root, turns, durable=True)
        await ours.__aenter__()
    finally:
        sqlite_module.SECURE_DELETE = shipped
    if secure_delete == "ON":  # and the scrub after a deletion, as `resolve_backends` sets it
        ours.host.scrubbers.append(SqliteDatabase.shared(root / DATABASE_FILE))
    return ours


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-secure-delete-") as tmp:
        root = Path(tmp)
        off = await started(root / "off", args.turns, "OFF")
        on = await started(root / "on", args.turns, "ON")
        try:
            sides = {"off": Side(off), "on": Side(on)}
            messages = [f"seq {args.turns} {size}" for size in (1, 50)]
            samples = await compare(dict(sides), messages, args.repeats)
            deletes: dict[str, list[float]] = {"off": [], "on": []}
            for index in range(min(len(side.conversations) for side in sides.values())):
                for name in ("off", "on") if index % 2 == 0 else ("on", "off"):
                    deletes[name].append(await sides[name].delete_one())
        finally:
            for scrubber in on.host.scrubbers:
                assert isinstance(scrubber, SqliteDatabase)
                await scrubber.aclose()
            await on.__aexit__(None, None, None)
            await off.__aexit__(None, None, None)
    result: dict[str, Any] = {"machine": machine(), "turns": args.turns, "repeats": args.repeats}
    for size, message in zip((1, 50), messages, strict=True):
        entry: dict[str, Any] = {
            name: {
                "per_turn_ms": summary([wall * 1000 / args.turns for wall, _ in runs]),
                "cpu_per_turn_ms": summary([cpu[0] * 1000 / args.turns for _, cpu in runs]),
                "runs_ms": [round(wall * 1000, 1) for wall, _ in runs],
            }
            for name, runs in samples[message].items()
        }
        for key in ("per_turn_ms", "cpu_per_turn_ms"):
            low = entry["off"][key]["median_ms"]
            high = entry["on"][key]["median_ms"]
            entry[f"{key.removesuffix('_ms')}_overhead_pct"] = round((high / low - 1) * 100, 1)
        result[f"{size}k"] = entry
    result["delete_ms"] = {
        name: summary([seconds * 1000 for seconds in values]) for name, values in deletes.items()
    }
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--turns", type=int, default=60)
    json.dump(asyncio.run(main(parser.parse_args())), sys.stdout, indent=2)
    print()
