"""Run every benchmark and gather the headline figures into `benchmarks/results.json`.

    python benchmarks/run_all.py [--quick] [--only turns,scale] [--out DIR] [--no-charts]

`make bench` runs it in the venv that has the peer (`.venv-bench`, the `bench` extra). Each
script runs in its own process, one after another, so one's threads and memory never colour
another's figures; each prints one JSON document, kept whole in `{out}/results/{name}.json`.
`{out}/results.json` holds the headline figures, one object per name:
`{"ours": median, "peer": median or null, "unit": "ms" | "x", "ratio": peer / ours or null}`.
A figure whose benchmark was not run (`--only`) has `ours: null`.

Everything a run writes is git-ignored (`make bench` never dirties the tree): the two above,
`{out}/timings.json` (seconds per script, the next run's ETA) and `{out}/charts/*.png` (drawn
by `charts.py` when matplotlib is installed). The committed run lives apart, in
`benchmarks/reference/`; `make bench-reference` makes the last run the committed one and redraws the
charts of `docs/images/`.

Progress goes to stderr: which benchmark, i/N, elapsed, and an ETA from the previous run's
seconds per script (`{out}/timings.json`, else the committed run's), redrawn every second on a
terminal and one line per benchmark otherwise.

`--quick` runs every script on a tiny workload (a check that everything runs, not figures).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from common import ratio

HERE = Path(__file__).resolve().parent

# name: (script, full-run arguments, quick arguments)
SCRIPTS: dict[str, tuple[str, list[str], list[str]]] = {
    "turns": ("turns.py", ["--repeats", "9"], ["--repeats", "1", "--turns", "3", "--batch", "4"]),
    # 15 repeats: `edit_once` and the greps are one sample per repeat, and 7 samples of a
    # 0.35 ms edit spread 0.31-0.53 ms on either side.
    "filesystem": (
        "filesystem.py",
        ["--repeats", "15"],
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
    # Skipped (a `"skipped"` document) where PostgreSQL does not run on 127.0.0.1:5432.
    "scaleout_postgres": (
        "scaleout_postgres.py",
        ["--turns", "300", "--updates", "200", "--rounds", "3"],
        ["--turns", "6", "--updates", "3", "--rounds", "1", "--floor-turns", "20"],
    ),
    # Needs Redis on 127.0.0.1:6379 (every machine of this project has it); keys go under a
    # random prefix on database 15 and are deleted at the end.
    "redis_backend": (
        "redis_backend.py",
        ["--turns", "200", "--rounds", "3", "--updates", "200"],
        ["--turns", "4", "--rounds", "1", "--updates", "3", "--floor-turns", "20"],
    ),
    # Two replicas on PostgreSQL and on Redis, a run on A followed from B, frame by frame.
    "follower_lag": (
        "follower_lag.py",
        ["--runs", "8", "--seconds", "10"],
        ["--runs", "1", "--seconds", "1"],
    ),
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
    "storage_amplification_durable",
    "durable_overhead_1k",
    "durable_overhead_50k",
    "grep_common_all",
    "grep_rare",
    "plan_fanout_p99",
    "turn_overhead_10k_conversations",
    "durable_added_50k",
    "backend_added_per_turn_postgres",
    "backend_added_per_turn_redis",
    "backend_floor_postgres",
    "backend_floor_redis",
    "follower_lag_p50_postgres",
    "follower_lag_p99_postgres",
    "follower_lag_p50_redis",
    "follower_lag_p99_redis",
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
    postgres = documents.get("scaleout_postgres")
    if postgres is not None and "turn_ms" in postgres:
        added = postgres["turn_ms"]["added_median_ms_postgres"]
        found["backend_added_per_turn_postgres"] = figure(added, None)
        found["backend_floor_postgres"] = figure(postgres["floor"]["median_ms"], None)
    redis = documents.get("redis_backend")
    if redis is not None:
        found["backend_added_per_turn_redis"] = figure(
            redis["per_turn_http"]["added_median_ms"], None
        )
        found["backend_floor_redis"] = figure(redis["floor"]["median_ms"], None)
    lag = documents.get("follower_lag")
    if lag is not None:
        for kind, measured in lag["backends"].items():
            if "follower_ms" in measured:
                for q in ("p50", "p99"):
                    found[f"follower_lag_{q}_{kind}"] = figure(measured["follower_ms"][q], None)
    unit = {
        "storage_amplification": "x",
        "storage_amplification_durable": "x",
        "durable_overhead_1k": "%",
        "durable_overhead_50k": "%",
        "durable_added_50k": "us",
    }
    return {name: found.get(name) or figure(None, None, unit.get(name, "ms")) for name in HEADLINES}


def clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}"


def previous_timings(out: Path, mode: str) -> dict[str, float]:
    """Seconds per script of the last run in this mode (`full` or `quick`), if any is known."""
    for path in (out / "timings.json", HERE / "reference" / "timings.json"):
        try:
            known = json.loads(path.read_text(encoding="utf-8")).get(mode) or {}
        except (OSError, ValueError):
            continue
        if known:
            return {name: float(value) for name, value in known.items()}
    return {}


class Progress:
    """Which benchmark, i/N, elapsed and ETA, on stderr.

    ETA = what the previous run's timings leave of the current script plus the scripts after it;
    unknown while any of those has no timing. On a terminal one line is redrawn every second.
    """

    def __init__(self, names: list[str], previous: dict[str, float], live: bool) -> None:
        self.names = names
        self.previous = previous
        self.live = live
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.drawn = False

    def eta(self, index: int, script_elapsed: float) -> str:
        left = self.names[index:]
        if any(name not in self.previous for name in left):
            return "ETA unknown (no previous timing)"
        remaining = max(self.previous[left[0]] - script_elapsed, 0.0)
        remaining += sum(self.previous[name] for name in left[1:])
        return f"ETA {clock(remaining)}"

    def line(self, index: int, script_started: float) -> str:
        now = time.monotonic()
        name = self.names[index]
        return (
            f"[{index + 1}/{len(self.names)}] {name} {clock(now - script_started)}"
            f" | elapsed {clock(now - self.started)} | {self.eta(index, now - script_started)}"
        )

    def status(self, text: str) -> None:
        with self.lock:
            sys.stderr.write(("\r\x1b[K" + text) if self.live else text + "\n")
            sys.stderr.flush()
            self.drawn = self.live

    def say(self, text: str) -> None:
        """A whole line (a script's own stderr, a summary), below the live line if one is up."""
        with self.lock:
            if self.drawn:
                sys.stderr.write("\r\x1b[K")
                self.drawn = False
            sys.stderr.write(text if text.endswith("\n") else text + "\n")
            sys.stderr.flush()


def run(name: str, quick: bool, progress: Progress, index: int) -> tuple[dict[str, Any], float]:
    script, full, small = SCRIPTS[name]
    command = [sys.executable, str(HERE / script), *(small if quick else full)]
    say = progress.say
    say(f"{progress.line(index, time.monotonic())}: {' '.join(command[1:])}")
    started = time.monotonic()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        assert child.stderr is not None
        errors = child.stderr

        def forward() -> None:
            for text in errors:
                say(text)

        forwarder = threading.Thread(target=forward, daemon=True)
        forwarder.start()
        reader: list[str] = []
        output = child.stdout
        collector = threading.Thread(target=lambda: reader.append(output.read()), daemon=True)
        collector.start()
        while True:
            if progress.live:
                progress.status(progress.line(index, started))
            try:
                child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                continue
        collector.join()
        forwarder.join()
    took = time.monotonic() - started
    if child.returncode != 0:
        raise subprocess.CalledProcessError(child.returncode, command)
    return json.loads(reader[0]), took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny workloads: a check, not figures")
    parser.add_argument("--only", default=",".join(SCRIPTS), help="comma list of benchmarks")
    parser.add_argument("--out", type=Path, default=HERE, help="where results.json goes")
    parser.add_argument("--no-charts", action="store_true", help="do not draw charts/*.png")
    args = parser.parse_args()
    names = [name for name in args.only.split(",") if name]
    unknown = set(names) - set(SCRIPTS)
    if unknown:
        parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")
    if "PYTEST_CURRENT_TEST" in os.environ and not args.quick:
        # `make test` checks that the benchmarks run, never how fast: a full run is 10+ minutes.
        parser.error("the full benchmarks do not run under pytest: pass --quick")
    details = args.out / "results"
    details.mkdir(parents=True, exist_ok=True)
    mode = "quick" if args.quick else "full"
    progress = Progress(names, previous_timings(args.out, mode), sys.stderr.isatty())
    documents: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    for index, name in enumerate(names):
        documents[name], seconds[name] = run(name, args.quick, progress, index)
        text = json.dumps(documents[name], indent=1) + "\n"
        (details / f"{name}.json").write_text(text, encoding="utf-8")
        progress.say(
            f"[{index + 1}/{len(names)}] {name} done in {clock(seconds[name])}"
            f" | elapsed {clock(time.monotonic() - progress.started)}"
        )
    figures = headlines(documents)
    (args.out / "results.json").write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    record_timings(args.out / "timings.json", mode, seconds)
    print(json.dumps(figures, indent=1))
    took = ", ".join(f"{name} {value:.0f}s" for name, value in seconds.items())
    progress.say(f"== took {sum(seconds.values()):.0f}s ({took})")
    if not args.no_charts:
        progress.say(draw_charts(args.out))


def record_timings(path: Path, mode: str, seconds: dict[str, float]) -> None:
    """Merge this run's seconds per script into `timings.json` (other scripts keep theirs)."""
    try:
        known = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    known.setdefault(mode, {}).update({name: round(value, 1) for name, value in seconds.items()})
    path.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def draw_charts(out: Path) -> str:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "== charts: matplotlib is not installed (pip install '.[bench]'); none drawn"
    from charts import draw

    written = draw(out, out / "charts")
    return "== charts: " + (", ".join(str(path) for path in written) or "nothing to draw")


if __name__ == "__main__":
    main()
