"""Instructions durable runs add to a turn (callgrind): `turns.py --sections durable`, counted.

    python benchmarks/durable_instructions.py [--size 1] [--turns 60] [--prompts 4]
        [--pace 60] [--checkout PATH] [--keep DIR] [--profile FILE]

`turns.py --sections durable` times the same prompts with durable runs off and on; on a shared
2-core VM its 1 KiB figure moves by more than a change to the journal does. This runs its prompts
(`seq <turns> <size>`: each model turn one `write_file`, started as the HTTP routes start them,
the frames read back from the run's journal; `turns.Ours`) in one process under
`valgrind --tool=callgrind` with its counting off: after a warm-up prompt each way, counting is
turned on around each prompt (until its journal is compacted, as `turns.py` waits, every thread)
and off before the history packer's pause, `--prompts` times each way, off and on alternated
(the garbage collector's older generations emptied before each window).
Prints the median instructions a turn each way and `added` = on / off - 1, the share
`durable_overhead_<size>k` measures in time, with the durable side's log writes a prompt.

The journal groups a run's writes by time (`writer.GROUP_SECONDS`, 2 ms), and callgrind's pace
follows the machine's load: in a counted window the loop's clock is the process's CPU time
divided by `--pace` (60: a turn about as long as a real one), so that a prompt writes about as
often as a real one does (8 to 22 times on the 2-vCPU VMs), and as often whatever the load.
`--checkout`
counts another checkout's package with this script (alternate them). `--keep DIR` keeps each
window's dump (`callgrind_annotate`). `--profile FILE` runs the same windows under cProfile
instead (no valgrind) and writes the durable side's stats to FILE and the other's to FILE.off.
Benchmark-only: nothing here is part of the library.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def child(args: argparse.Namespace) -> None:
    """The prompts, each window between a `ready` line and a `done` one (stdin says go)."""
    sys.path.insert(0, str(HERE))
    from turns import Ours

    clock = {"on": 0.0, "base": 0.0, "cpu": 0.0}
    real = time.monotonic

    def loop_time() -> float:
        """The loop's clock: in a counted window, the process's CPU time over `--pace` (what
        callgrind's pace does not change), else the real one; never going back."""
        if not clock["on"]:
            return real()
        return clock["base"] + (time.process_time() - clock["cpu"]) / args.pace

    profiles: dict[str, Any] = {}
    if args.profile:
        import cProfile

        profiles = {"off": cProfile.Profile(), "on": cProfile.Profile()}
    writes = {"n": 0}

    async def main() -> None:
        asyncio.get_running_loop().time = loop_time  # type: ignore[method-assign]
        root = Path(args.work)
        async with (
            Ours(root / "off", args.turns) as off,
            Ours(root / "on", args.turns, durable=True) as on,
        ):
            store: Any = on.host.runs.store  # type: ignore[attr-defined]
            append_now = store.append_now

            def counted(*a: Any, **k: Any) -> Any:
                writes["n"] += 1
                return append_now(*a, **k)

            store.append_now = counted
            message = f"seq {args.turns} {args.size}"
            for index in range(args.prompts + 1):
                for name, ours in (("off", off), ("on", on)):
                    counted_window = index > 0
                    writes["n"] = 0
                    if counted_window:
                        gc.collect()  # (a collection of older objects otherwise falls in
                        # one window or another: +-3 % of a prompt)
                        print(f"ready {name}", flush=True)
                        assert sys.stdin.readline().strip() == "go"
                        if profiles:
                            profiles[name].enable()
                        clock.update(base=real(), cpu=time.process_time(), on=1.0)
                    await ours.prompt_journalled(message)
                    closers = getattr(ours.host.runs, "_closers", None)
                    while closers:  # (the run's compaction)
                        await asyncio.wait(set(closers))
                        await asyncio.sleep(0)
                    clock["on"] = 0.0
                    if counted_window:
                        if profiles:
                            profiles[name].disable()
                        print(f"done {name} {writes['n']}", flush=True)
                        assert sys.stdin.readline().strip() == "next"
                    await ours.settle()

    asyncio.run(main())
    if profiles:
        profiles["on"].dump_stats(args.profile)
        profiles["off"].dump_stats(args.profile + ".off")
    print("end", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=1, help="KiB a turn writes (1 or 50)")
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--prompts", type=int, default=4, help="counted prompts each way")
    parser.add_argument("--pace", type=float, default=60.0)
    parser.add_argument("--checkout", default=str(HERE.parent))
    parser.add_argument("--keep", default="", help="copy each window's dump into this folder")
    parser.add_argument("--profile", default="")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    sys.path.insert(0, str(HERE))
    from callgrind_window import control, dumped_total

    root = Path(args.checkout).resolve()
    work = Path(tempfile.mkdtemp(prefix="durable-instructions-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATMOSPHERE_", "LLM_"))}
    env["PYTHONPATH"] = str(root)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONHASHSEED"] = "0"  # (the same dict and set orders in every count)
    me = [sys.executable, str(Path(__file__).resolve()), "--child", "--work", str(work)]
    me += ["--size", str(args.size), "--turns", str(args.turns), "--prompts", str(args.prompts)]
    me += ["--pace", str(args.pace if not args.profile else 1.0)]
    if args.profile:
        command = [*me, "--profile", str(Path(args.profile).resolve())]
    else:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={work}/callgrind.out",
            *me,
        ]
    process = subprocess.Popen(
        command,
        cwd=root,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(work / "child.log").open("w"),
        text=True,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    counts: dict[str, list[float]] = {"off": [], "on": []}
    log_writes: list[int] = []
    try:
        for line in process.stdout:
            word, *rest = line.split()
            if word == "ready":
                if not args.profile:
                    control(process.pid, "--zero")
                    control(process.pid, "-i", "on")
                process.stdin.write("go\n")
                process.stdin.flush()
            elif word == "done":
                name, written = rest[0], int(rest[1])
                if not args.profile:
                    control(process.pid, "-i", "off")
                    total = dumped_total(work, process.pid)
                    counts[name].append(total / args.turns)
                    if args.keep:
                        Path(args.keep).mkdir(parents=True, exist_ok=True)
                        newest = max(work.glob("callgrind.out*"), key=lambda p: p.stat().st_mtime)
                        shutil.copy(newest, Path(args.keep) / f"{name}-{len(counts[name])}")
                if name == "on":
                    log_writes.append(written)
                process.stdin.write("next\n")
                process.stdin.flush()
            elif word == "end":
                break
        if process.wait(600) != 0:
            raise RuntimeError((work / "child.log").read_text()[-3000:])
        if args.profile:
            print(f"{root}: profiles in {args.profile} (on) and {args.profile}.off")
            return
        off, on = statistics.median(counts["off"]), statistics.median(counts["on"])
        print(
            f"{root} seq {args.turns} {args.size} KiB: a turn {off:,.0f} instructions off, "
            f"{on:,.0f} on: +{on - off:,.0f} (+{(on / off - 1) * 100:.1f} %); "
            f"off {[int(c) for c in counts['off']]}, on {[int(c) for c in counts['on']]}; "
            f"log writes a prompt {log_writes}"
        )
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
