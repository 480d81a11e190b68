"""Small workspace operations on the event loop against the hop to a worker thread, in one process.

The same code runs both ways, switched between prompts by `workers.ON_LOOP_BYTES` (64 KiB: small
operations on the loop, the default; -1: every operation hops, as before), alternating which
goes first, so both share the machine's noise (a shared machine moves wall-clock figures far
more between runs than between these two):

- `turns`: `turns.py`'s `Ours` (the real harness, a fresh conversation per prompt), prompts of
  `--turns` turns of one `write_file` each, 1 KiB and 50 KiB; ms per turn, wall and process CPU.
  `loop` keeps the circuit breaker off (`SLOW_SECONDS` infinite: what the loop itself costs),
  `loop_breaker` has it as shipped.
- `edit`: one `edit_file` of a 50 KiB file in a tree of `--files` files, after a 20 ms pause (the
  worker has gone idle, as in `filesystem.py`'s `edit_once`), and deepagents'
  `FilesystemBackend.edit` on its own tree in the same rounds when it is installed.
- `on_loop_us`: how long each on-loop operation of the `loop` prompts held the loop, as wall time
  and less the thread's wait for a CPU (what the breaker counts), with how many passed 2 ms.

    python benchmarks/on_loop.py --rounds 12 > result.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import machine, peer_missing
from turns import Ours

from atmosphere_harness import WorkspaceAgentFileSystem
from atmosphere_harness._filesystem import workers

MODES: dict[str, tuple[int, float]] = {
    "hop": (-1, float("inf")),
    "loop": (workers.ON_LOOP_BYTES, float("inf")),
    "loop_breaker": (workers.ON_LOOP_BYTES, workers.SLOW_SECONDS),
}


class Recorder(workers.LoopBudget):
    """The shipped budget, recording each on-loop operation's wall time and breaker time."""

    def __init__(self, slow: float) -> None:
        super().__init__(slow=slow)
        self.walls: list[float] = []
        self.counted: list[float] = []

    def spent(self, start: tuple[float, float], what: str) -> None:
        wall = self.clock() - start[0]
        self.walls.append(wall)
        self.counted.append(wall - (self.waited() - start[1]))
        super().spent(start, what)


def use(mode: str) -> Recorder:
    size, slow = MODES[mode]
    workers.ON_LOOP_BYTES = size
    budget = Recorder(slow)
    workers.ON_LOOP = budget
    return budget


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else 0.0


def spread(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    if not ordered:
        return {"count": 0}

    def at(q: float) -> float:
        return round(ordered[int(q * (len(ordered) - 1))] * 1e6, 1)

    return {
        "count": len(ordered),
        "p50_us": at(0.5),
        "p90_us": at(0.9),
        "p99_us": at(0.99),
        "max_us": at(1.0),
        "over_2ms": sum(value > 0.002 for value in ordered),
    }


async def turns_section(root: Path, rounds: int, turns: int) -> dict[str, Any]:
    samples: dict[str, dict[int, list[tuple[float, float]]]] = {
        mode: {1: [], 50: []} for mode in MODES
    }
    walls: list[float] = []
    counted: list[float] = []
    trips = 0
    async with Ours(root / "turns", turns) as ours:
        for size in (1, 50):
            await ours.prompt(f"seq {turns} {size}")  # warm up
        for number in range(rounds):
            order = list(MODES) if number % 2 == 0 else list(reversed(MODES))
            for mode in order:
                budget = use(mode)
                for size in (1, 50):
                    cpu = time.process_time()
                    started = time.perf_counter()
                    await ours.prompt(f"seq {turns} {size}")
                    wall = (time.perf_counter() - started) * 1000 / turns
                    samples[mode][size].append((wall, (time.process_time() - cpu) * 1000 / turns))
                if mode == "loop":
                    walls += budget.walls
                    counted += budget.counted
                if mode == "loop_breaker":
                    trips += budget.trips
    result: dict[str, Any] = {}
    for size in (1, 50):
        result[f"{size}k"] = {
            mode: {
                "per_turn_ms": median([wall for wall, _ in samples[mode][size]]),
                "per_turn_min_ms": round(min(wall for wall, _ in samples[mode][size]), 3),
                "cpu_per_turn_ms": median([cpu for _, cpu in samples[mode][size]]),
            }
            for mode in MODES
        }
    result["on_loop_us"] = {"wall": spread(walls), "less_cpu_wait": spread(counted)}
    result["breaker_trips"] = trips
    return result


async def edit_section(root: Path, rounds: int, files: int) -> dict[str, Any]:
    filler = "".join(f"line {number} filler " + "x" * 40 + "\n" for number in range(800))
    texts = [f"EDIT_ANCHOR_{number} \n" + filler[: 50 * 1024 - 20] for number in range(files)]
    use("loop")
    fs = WorkspaceAgentFileSystem(root / "edit" / "ours")
    for number, text in enumerate(texts):
        await fs.write(f"d{number % 10}/f{number}.py", text)
    peer: Any = None
    if peer_missing() is None:
        from deepagents.backends import FilesystemBackend

        (root / "edit" / "peer").mkdir(parents=True)
        peer = FilesystemBackend(root_dir=root / "edit" / "peer", virtual_mode=True)
        for number, text in enumerate(texts):
            peer.write(f"/d{number % 10}/f{number}.py", text)
    times: dict[str, list[float]] = {"hop": [], "loop": [], "deepagents": []}
    for number in range(rounds):
        order = ["hop", "loop", "deepagents"]
        for side in order if number % 2 == 0 else reversed(order):
            if side == "deepagents" and peer is None:
                continue
            await asyncio.sleep(0.02)
            index = (number * 3 + len(times[side])) % files
            path = f"d{index % 10}/f{index}.py"
            old, new = f"EDIT_ANCHOR_{index} ", f"EDIT_ANCHOR_{index} x"
            started = time.perf_counter()
            if side == "deepagents":
                peer.edit(f"/{path}", old, new)
            else:
                use(side)
                await fs.edit(path, old, new)
            times[side].append((time.perf_counter() - started) * 1000)
    return {side: {"edit_ms": median(values)} for side, values in times.items() if values}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-on-loop-") as tmp:
        root = Path(tmp)
        turns = await turns_section(root, args.rounds, args.turns)
        edit = await edit_section(root, args.edits, args.files)
    return {
        "benchmark": "on_loop",
        "workload": {"rounds": args.rounds, "turns": args.turns, "edits": args.edits},
        "turns": turns,
        "edit": edit,
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        "peer_reason": peer_missing(),
        "env": machine(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--edits", type=int, default=30)
    parser.add_argument("--files", type=int, default=200)
    arguments = parser.parse_args()
    json.dump(asyncio.run(main(arguments)), sys.stdout, indent=2)
    print()
