"""Run every benchmark and gather the headline figures into `benchmarks/results.json`.

    python benchmarks/run_all.py [--quick] [--only turns,scale] [--out DIR]

`make bench` runs it in the venv that has the peer (`.venv-bench`, the `bench` extra). Each
script runs in its own process, one after another, so one's threads and memory never colour
another's figures; each prints one JSON document, kept whole in `{out}/results/{name}.json`.
`{out}/results.json` holds the headline figures, one object per name:
`{"ours": median, "peer": median or null, "unit": "ms" | "x", "ratio": peer / ours or null}`.
A figure whose benchmark was not run (`--only`) has `ours: null`.

`--quick` runs every script on a tiny workload (a check that everything runs, not figures).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import ratio

HERE = Path(__file__).resolve().parent

# name: (script, full-run arguments, quick arguments)
SCRIPTS: dict[str, tuple[str, list[str], list[str]]] = {
    "turns": ("turns.py", ["--repeats", "9"], ["--repeats", "1", "--turns", "3", "--batch", "4"]),
    "filesystem": (
        "filesystem.py",
        ["--repeats", "7"],
        ["--files", "20", "--size-kib", "4", "--repeats", "1"],
    ),
    "plan_fanout": (
        "plan_fanout.py",
        ["--subscribers", "1000", "--updates", "200", "--repeat", "3"],
        ["--subscribers", "5", "--updates", "5", "--repeat", "1"],
    ),
    "scale": ("scale.py", ["--levels", "10,1000,10000"], ["--levels", "2,5", "--prompts", "2"]),
    "subagents": ("subagents.py", [], ["--spawns", "3", "--size-kib", "1", "--repeats", "1"]),
    # Fewer runs than these two scripts' defaults keep `make bench` under 15 minutes on 2 cores.
    "transports": ("transports.py", ["--runs", "10"], ["--runs", "1", "--repeats", "1"]),
    "runtimes": ("bench_runtimes.py", ["--repeats", "3"], ["--repeats", "1", "--calls", "1"]),
    "memory": (
        "memory_bench.py",
        ["--peer-python", sys.executable],
        f"--peer-python {sys.executable} --repeats 1 --users 10 --facts-per-user 5 --samples 10 "
        "--closes 2 --extraction-ms 10".split(),
    ),
}

HEADLINES = (
    "turn_overhead_1k",
    "turn_overhead_50k",
    "batch_write_per_call",
    "batch_read_per_call",
    "storage_amplification",
    "grep_common_all",
    "grep_rare",
    "plan_fanout_p99",
    "turn_overhead_10k_conversations",
)


def figure(ours: float | None, peer: float | None, unit: str = "ms") -> dict[str, Any]:
    return {"ours": ours, "peer": peer, "unit": unit, "ratio": ratio(peer, ours)}


def headlines(documents: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The figures of `results.json`, from the documents of the benchmarks that ran."""
    found: dict[str, dict[str, Any]] = {}
    turns = documents.get("turns")
    if turns is not None:
        found.update({name: dict(value) for name, value in turns["figures"].items()})
    filesystem = documents.get("filesystem")
    if filesystem is not None:
        peer = filesystem["peer"]
        for op in ("grep_common_all", "grep_rare"):
            found[op] = figure(
                filesystem["ours"][op]["median_ms"], peer[op]["median_ms"] if peer else None
            )
    fanout = documents.get("plan_fanout")
    if fanout is not None:
        found["plan_fanout_p99"] = figure(fanout["median"]["latency_ms_p99"], None)
    scale = documents.get("scale")
    if scale is not None:
        largest = str(max(scale["workload"]["levels"]))
        found["turn_overhead_10k_conversations"] = figure(
            scale["levels"][largest]["ms_per_turn"], None
        )
    unit = {"storage_amplification": "x"}
    return {name: found.get(name) or figure(None, None, unit.get(name, "ms")) for name in HEADLINES}


def run(name: str, quick: bool) -> tuple[dict[str, Any], float]:
    script, full, small = SCRIPTS[name]
    command = [sys.executable, str(HERE / script), *(small if quick else full)]
    print(f"== {name}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    started = time.monotonic()
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout), time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny workloads: a check, not figures")
    parser.add_argument("--only", default=",".join(SCRIPTS), help="comma list of benchmarks")
    parser.add_argument("--out", type=Path, default=HERE, help="where results.json goes")
    args = parser.parse_args()
    names = [name for name in args.only.split(",") if name]
    unknown = set(names) - set(SCRIPTS)
    if unknown:
        parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")
    details = args.out / "results"
    details.mkdir(parents=True, exist_ok=True)
    documents: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    for name in names:
        documents[name], seconds[name] = run(name, args.quick)
        text = json.dumps(documents[name], indent=1) + "\n"
        (details / f"{name}.json").write_text(text, encoding="utf-8")
    figures = headlines(documents)
    (args.out / "results.json").write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(figures, indent=1))
    took = ", ".join(f"{name} {value:.0f}s" for name, value in seconds.items())
    print(f"== took {sum(seconds.values()):.0f}s ({took})", file=sys.stderr)


if __name__ == "__main__":
    main()
