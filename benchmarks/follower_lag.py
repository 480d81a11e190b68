"""Cross-replica follower lag: a run executing on replica A, followed frame by frame from B.

    python benchmarks/follower_lag.py [--runs 8] [--seconds 10] [--tokens-per-s 20]
        [--backends postgres,redis]

For each backend (PostgreSQL on a fresh database of 127.0.0.1:5432, Redis on a fresh key prefix
of 127.0.0.1:6379/15), two replicas of the `inflight.py` app (uvicorn processes on one
workspace root, durable runs off: the run frame feed carries the frames between them) and the
fake OpenAI-compatible model of `inflight.py`, which streams `--tokens-per-s` tokens for
`--seconds`, each stamped with the monotonic time it was written. `--runs` runs at once: each
is posted to A (whose stream is read to its end) and followed from B with
`GET P/conversations/{id}/events` as soon as B knows the run (B asks A to share it once the
run's status record is stored; it answers 404 before that). Per `text` frame: the delay from
the model's stamp to its arrival at A's client (the same replica: the floor) and at B's (the
follower), counting at B only frames the model wrote after B's stream had opened (not the replay
of what came before).

Prints one JSON document: per backend `same_replica_ms` and `follower_ms` (p50/p99/max/n) and
`added_p50_ms` (follower minus same replica). A backend whose server is not running here is
`"skipped"` with the reason.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from inflight import (
    PATH,
    Backend,
    Server,
    Stream,
    Variant,
    environment,
    exit_on_sigterm,
    follow_bytes,
    free_port,
    raise_file_limit,
    request_bytes,
    spread,
    stop,
    wait_for_port,
    warm_up,
)

FOLLOW_ATTEMPTS = 2000
"""Tries to attach on B before giving up (each 5 ms apart: 10 s, a hang guard)."""


async def one_run(a: Server, b: Server, timeout: float) -> tuple[list[int], list[int], str]:
    """One run on A, followed from B; the frame delays (us) at A and at B, and B's outcome."""
    loop = asyncio.get_running_loop()
    conversation = f"lag-{uuid.uuid4().hex[:10]}"
    at_a: array.array[int] = array.array("q")
    at_b: array.array[int] = array.array("q")
    done_a: asyncio.Future[str] = loop.create_future()
    post = request_bytes(a.port, PATH, "stream please", conversation)
    await loop.create_connection(lambda: Stream(post, done_a, at_a), "127.0.0.1", a.port)
    outcome_b = "never attached"
    for _ in range(FOLLOW_ATTEMPTS):
        done_b: asyncio.Future[str] = loop.create_future()
        get = follow_bytes(b.port, PATH, conversation)
        seen: array.array[int] = array.array("q")
        await loop.create_connection(
            lambda f=done_b, g=get, s=seen: Stream(g, f, from_open=s), "127.0.0.1", b.port
        )
        outcome_b = await asyncio.wait_for(done_b, timeout)
        if " 404 " not in outcome_b:
            at_b = seen
            break
        await asyncio.sleep(0.005)
    outcome_a = await asyncio.wait_for(done_a, timeout)
    if outcome_a != "complete":
        raise RuntimeError(f"the run on A did not complete: {outcome_a}")
    return at_a.tolist(), at_b.tolist(), outcome_b


async def measure(a: Server, b: Server, runs: int, timeout: float) -> dict[str, Any]:
    results = await asyncio.gather(*(one_run(a, b, timeout) for _ in range(runs)))
    same = [delay for at_a, _, _ in results for delay in at_a]
    follower = [delay for _, at_b, _ in results for delay in at_b]
    outcomes: dict[str, int] = {}
    for _, _, outcome in results:
        outcomes[outcome.split(":")[0]] = outcomes.get(outcome.split(":")[0], 0) + 1
    same_ms = spread(same, 1000.0)
    follower_ms = spread(follower, 1000.0)
    added = None
    if same_ms["p50"] is not None and follower_ms["p50"] is not None:
        added = round(follower_ms["p50"] - same_ms["p50"], 2)
    return {
        "same_replica_ms": same_ms,
        "follower_ms": follower_ms,
        "added_p50_ms": added,
        "follower_outcomes": outcomes,
    }


def backend_lag(kind: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    model_port = free_port()
    model = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("inflight.py")),
            "--fake",
            str(model_port),
            str(args.tokens_per_s),
            str(args.seconds),
            "text",
        ],
        env=environment({}),
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_port(model_port, model)
        try:
            backend = Backend(kind).__enter__()
        except Exception as exc:
            return {"skipped": f"{kind} unavailable: {exc.__class__.__name__}: {exc}"}
        try:
            variant = Variant(kind, kind)
            a = Server(variant, model_port, backend.env, root)
            try:
                b = Server(variant, model_port, backend.env, root)
                try:
                    warm_up(a.port)
                    warm_up(b.port)
                    timeout = args.seconds * 4 + 60
                    asyncio.run(measure(a, b, 2, timeout))  # warm: the feed's statements
                    measured = asyncio.run(measure(a, b, args.runs, timeout))
                    if set(measured["follower_outcomes"]) != {"complete"}:
                        measured["server_warnings"] = warnings(root / "server.log")
                    return measured
                finally:
                    b.close()
            finally:
                a.close()
        finally:
            backend.__exit__(None, None, None)
    finally:
        stop(model)


def warnings(log: Path, most: int = 40) -> list[str]:
    """The servers' last WARNING and ERROR lines: what a follower that never attached met."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return [line for line in lines if "WARNING" in line or "ERROR" in line][-most:]


def main(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-follower-"))
    try:
        found = {
            kind: backend_lag(kind, args, root / kind)
            for kind in args.backends.split(",")
            if kind and (root / kind).mkdir() is None
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "benchmark": "follower_lag",
        "workload": {
            "runs": args.runs,
            "seconds": args.seconds,
            "tokens_per_s": args.tokens_per_s,
        },
        "backends": found,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=8, help="runs at once on replica A")
    parser.add_argument("--seconds", type=float, default=10.0, help="each run's answer")
    parser.add_argument("--tokens-per-s", type=float, default=20.0)
    parser.add_argument("--backends", default="postgres,redis")
    raise_file_limit()
    exit_on_sigterm()
    print(json.dumps(main(parser.parse_args()), indent=1))
