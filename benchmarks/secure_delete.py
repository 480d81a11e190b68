"""What wiping deleted data costs: SQLite's `secure_delete` on a normal turn, and the scrub
after a deletion.

    python benchmarks/secure_delete.py [--repeats 25] [--turns 60] [--setting FAST|ON] > result.json

Two hosts in one process, each with its own `workspace_root` and durable runs on (a turn's
history rows and the run's journal rows, deleted when the run is compacted, all in the SQLite
file): one whose SQLite connection has `secure_delete` off (`off`), one with `--setting` (`on`;
by default the shipped setting, `FAST`). Both run the `turns` prompts of
`benchmarks/turns.py` (60 model turns, each writing a 1 KiB or a 50 KiB file) as the HTTP
routes run them, alternated (`turns.compare`: the order
flips every repeat). For each: `per_turn_ms` (the prompt's wall time / turns), and
`cpu_per_turn_ms` (the process's CPU time, every thread, from the prompt's start until the
history packer rewrote every large payload: the background rewrites are where deleted cells
are zeroed); `..._overhead_pct` = on / off - 1. A third host, off too (`off_again`), shows
the noise floor: `..._noise_pct` = off_again / off - 1. Then each host deletes its
conversations one by one (`DELETE P/conversations/{id}` as the route does it, alternated):
`delete_ms` each, the `on` side including the scrub (free pages given back, WAL checkpointed
and truncated).

`rows_insert_update_delete` isolates what the setting changes, SQLite's own work: 200 rows of
1 KiB or 50 KiB inserted, each rewritten, then all deleted, in a file set up as the harness's,
off and on alternated (`overhead_pct` = on / off - 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
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
    if secure_delete != "OFF":  # and the scrub after a deletion, as `resolve_backends` sets it
        ours.host.scrubbers.append(SqliteDatabase.shared(root / DATABASE_FILE))
    return ours


def rows_ms(path: Path, secure_delete: str, size: int, rows: int = 200) -> float:
    """Milliseconds to insert `rows` rows of `size` bytes, rewrite each, then delete them all,
    in a SQLite file set up as the harness's (WAL, 1 KiB pages, incremental auto-vacuum)."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        for pragma in ("page_size=1024", "auto_vacuum=INCREMENTAL", "journal_mode=WAL"):
            connection.execute(f"PRAGMA {pragma}")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute(f"PRAGMA secure_delete={secure_delete}")
        connection.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")
        text = "x" * size
        started = time.perf_counter()
        for row in range(rows):
            connection.execute("INSERT INTO t VALUES (?, ?)", (row, text))
        for row in range(rows):
            connection.execute("UPDATE t SET v = ? WHERE id = ?", (text[:-1] + "y", row))
        connection.execute("DELETE FROM t")
        return (time.perf_counter() - started) * 1000
    finally:
        connection.close()


def rows_section(root: Path, setting: str, repeats: int) -> dict[str, Any]:
    """`rows_ms` with `secure_delete` off and on, alternated, on a file of its own each time."""
    result: dict[str, Any] = {}
    for size in (1024, 50 * 1024):
        runs: dict[str, list[float]] = {"off": [], "on": []}
        for index in range(repeats):
            for name in ("off", "on") if index % 2 == 0 else ("on", "off"):
                path = root / f"rows-{name}-{size}-{index}.db"
                runs[name].append(rows_ms(path, "OFF" if name == "off" else setting, size))
        entry: dict[str, Any] = {name: summary(values) for name, values in runs.items()}
        entry["overhead_pct"] = round(
            (entry["on"]["median_ms"] / entry["off"]["median_ms"] - 1) * 100, 1
        )
        result[f"{size // 1024}k"] = entry
    return result


async def setting(ours: Ours) -> int:
    """The `secure_delete` the host's SQLite connection really has (0 off, 1 on, 2 fast)."""
    database = SqliteDatabase.shared(ours.root / DATABASE_FILE)
    try:
        row = await database.run(lambda c: c.execute("PRAGMA secure_delete").fetchone())
    finally:
        await database.aclose()
    return int(row[0])


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-secure-delete-") as tmp:
        root = Path(tmp)
        off = await started(root / "off", args.turns, "OFF")
        off_again = await started(root / "off-again", args.turns, "OFF")
        on = await started(root / "on", args.turns, args.setting)
        try:
            sides = {"off": Side(off), "on": Side(on), "off_again": Side(off_again)}
            settings = {name: await setting(side.ours) for name, side in sides.items()}
            messages = [f"seq {args.turns} {size}" for size in (1, 50)]
            samples = await compare(dict(sides), messages, args.repeats)
            deletes: dict[str, list[float]] = {name: [] for name in sides}
            for index in range(min(len(side.conversations) for side in sides.values())):
                for name in list(sides) if index % 2 == 0 else list(sides)[::-1]:
                    deletes[name].append(await sides[name].delete_one())
        finally:
            for scrubber in on.host.scrubbers:
                assert isinstance(scrubber, SqliteDatabase)
                await scrubber.aclose()
            for ours in (on, off_again, off):
                await ours.__aexit__(None, None, None)
    result: dict[str, Any] = {
        "machine": machine(),
        "turns": args.turns,
        "repeats": args.repeats,
        "secure_delete": settings,
        "setting": args.setting,
    }
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
            for name, label in (("on", "overhead_pct"), ("off_again", "noise_pct")):
                high = entry[name][key]["median_ms"]
                entry[f"{key.removesuffix('_ms')}_{label}"] = round((high / low - 1) * 100, 1)
        result[f"{size}k"] = entry
    with tempfile.TemporaryDirectory(prefix="bench-secure-delete-rows-") as tmp:
        result["rows_insert_update_delete"] = rows_section(Path(tmp), args.setting, args.repeats)
    result["delete_ms"] = {
        name: summary([seconds * 1000 for seconds in values]) for name, values in deletes.items()
    }
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--setting", default=sqlite_module.SECURE_DELETE, choices=("FAST", "ON"))
    parser.add_argument("--turns", type=int, default=60)
    json.dump(asyncio.run(main(parser.parse_args())), sys.stdout, indent=2)
    print()
