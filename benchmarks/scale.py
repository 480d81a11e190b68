"""Scale with work: the cost of a turn and the server's memory with 10 to 10,000 conversations.

    python benchmarks/scale.py [--levels 10,1000,10000] [--prompts 40] > result.json

Population (one workspace, grown level by level): every conversation gets what a short real one
leaves behind, written through the harness's own stores, as the server would: a history turn in
the SQLite file (the user message, a `write_todos` call and result, a 1 KiB `write_file` call and
result, the answer), its plan (`FilePlanStore`) and its 1 KiB file (`AgentFileSystemProvider`).
The stores apply their caps as in production: 256 conversation workspaces per owner (the least
recently written is removed when a new one is created) and 1,024 plan documents (the least
recently modified go first); the history has no count cap. What is left on disk is reported.

At each level a fresh server (uvicorn in a subprocess, the `@agent` of `turns.py` with the
default harness) starts on that workspace. The client sends `--prompts` prompts to new
conversations and as many to existing ones (sampled uniformly from the population), alternating;
each prompt is 3 model turns: `write_todos`, `write_file` (1 KiB), the answer. Reported per level:
milliseconds per model turn (median over prompts, client side, over HTTP), the server's resident
memory after start-up and after the prompts, its start-up time, what the stores kept. No peer:
deepagents keeps conversations in a checkpointer and files in its state, with nothing like a
per-owner workspace on disk to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx2
from common import free_port, machine, rss_kib, wait_until_serving
from turns import AGENT, PATH, plan_todos, workload

from atmosphere_harness import AgentPlan, Message, ToolCall
from atmosphere_harness._filesystem.provider import AgentFileSystemProvider
from atmosphere_harness._memory.history import ConversationKey
from atmosphere_harness._memory.sqlite import DATABASE_FILE, SqliteDatabase
from atmosphere_harness._memory.sqlite_history import SqliteHistory
from atmosphere_harness._planning.store import FilePlanStore

STEPS = 3
TURNS_PER_PROMPT = 3
TURNS_SCRIPT = Path(__file__).with_name("turns.py")


def owner_root(workspace: Path) -> Path:
    return workspace / "agents" / AGENT


def history_turn(plan: AgentPlan) -> list[Message]:
    """The messages one short prompt of the benchmark's model leaves in the history."""
    path, content = workload(STEPS, 1)[0]
    todo = ToolCall("write_todos", {"todos": plan_todos(STEPS, 1), "goal": "Scale"})
    write = ToolCall("write_file", {"path": path, "content": content})
    return [
        Message.user(f"plan {STEPS} 1"),
        Message.assistant("", [todo]),
        Message.tool(todo, plan.to_markdown()),
        Message.assistant("", [write]),
        Message.tool(write, f"Wrote {path}"),
        Message.assistant("done"),
    ]


async def populate(workspace: Path, ids: list[str]) -> float:
    """Give every conversation in `ids` its history turn, plan and file; returns seconds.

    The stores' eviction messages (one per conversation past a cap) are silenced here; the
    server's own are left as they are.
    """
    logging.getLogger("atmosphere_harness").setLevel(logging.ERROR)
    started = time.perf_counter()
    root = owner_root(workspace)
    database = SqliteDatabase(workspace / DATABASE_FILE)
    history = SqliteHistory(database)
    plans = FilePlanStore(root)
    files = AgentFileSystemProvider(root)
    plan = AgentPlan.from_json(
        json.dumps({"goal": "Scale", "steps": plan_todos(STEPS, 1)}).encode()
    )
    messages = history_turn(plan)
    path, content = workload(STEPS, 1)[0]
    gate = asyncio.Semaphore(8)

    async def one(conversation: str) -> None:
        async with gate:
            await history.append(ConversationKey(PATH, None, conversation), messages)
            await plans.put(AGENT, conversation, plan)
            await files.for_conversation(conversation).write(path, content)

    try:
        await asyncio.gather(*(one(conversation) for conversation in ids))
    finally:
        await history.aclose()
        await database.aclose()
    return time.perf_counter() - started


def on_disk(workspace: Path) -> dict[str, int]:
    root = owner_root(workspace)
    database = sqlite3.connect(f"file:{workspace / DATABASE_FILE}?mode=ro", uri=True)
    with contextlib.closing(database):
        (histories,) = database.execute("SELECT count(*) FROM memory_conversations").fetchone()
    files_root = root / "files"
    plans_dir = root / "plans" / AGENT
    return {
        "histories": histories,
        "workspaces": sum(1 for entry in files_root.iterdir() if entry.is_dir()),
        "plans": sum(1 for entry in plans_dir.iterdir() if entry.suffix == ".json"),
        "database_bytes": sum(p.stat().st_size for p in workspace.glob(DATABASE_FILE + "*")),
    }


async def measure(workspace: Path, population: list[str], prompts: int) -> dict[str, Any]:
    """Start a server on `workspace`, time prompts to new and existing conversations."""
    port = free_port()
    command = [sys.executable, str(TURNS_SCRIPT), "--serve", str(port), str(workspace), "10"]
    started = time.perf_counter()
    server = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(TURNS_SCRIPT.parent)})
    rng = random.Random(7)
    existing_ids = [rng.choice(population) for _ in range(prompts)]
    root = owner_root(workspace)
    had = {
        "workspace": sum((root / "files" / c).is_dir() for c in existing_ids),
        "plan": sum((root / "plans" / AGENT / f"{c}.json").is_file() for c in existing_ids),
    }
    timings: dict[str, list[float]] = {"new": [], "existing": []}
    try:
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            await wait_until_serving(http, server)
            startup = time.perf_counter() - started

            async def one(conversation: str) -> float:
                body = {"message": f"plan {STEPS} 1", "conversationId": conversation}
                begin = time.perf_counter()
                response = await http.post(PATH, json=body)
                text = response.text
                elapsed = time.perf_counter() - begin
                if "event: complete" not in text or "event: plan-update" not in text:
                    raise AssertionError(f"scale: the prompt did not complete: {text[-300:]}")
                return elapsed * 1000 / TURNS_PER_PROMPT

            await one(uuid.uuid4().hex)  # warm-up: imports, first connection, first plan
            rss_start = rss_kib(server.pid)
            for existing in existing_ids:
                timings["new"].append(await one(uuid.uuid4().hex))
                timings["existing"].append(await one(existing))
            rss_end = rss_kib(server.pid)
    finally:
        server.terminate()
        server.wait(30)
    every = timings["new"] + timings["existing"]
    return {
        "ms_per_turn": round(statistics.median(every), 3),
        "ms_per_turn_new": round(statistics.median(timings["new"]), 3),
        "ms_per_turn_existing": round(statistics.median(timings["existing"]), 3),
        "ms_per_turn_p90": round(sorted(every)[int(0.9 * (len(every) - 1))], 3),
        "server_rss_kib": {"after_start": rss_start, "after_prompts": rss_end},
        "startup_seconds": round(startup, 2),
        "existing_sampled_with": had,
        "prompts": {"new": prompts, "existing": prompts},
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    levels = sorted(int(level) for level in args.levels.split(","))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        workspace = Path(tmp)
        population: list[str] = []
        for level in levels:
            fresh = [f"c{index:05d}" for index in range(len(population), level)]
            seconds = await populate(workspace, fresh)
            population += fresh
            # Write the population back before measuring: otherwise the kernel is still flushing
            # it while the server runs, and every fsync of a plan write waits behind that flush
            # (a turn looked 1.75x dearer at 10,000 conversations than at 10; 1.2-1.4x once
            # flushed, see docs/benchmarks.md).
            os.sync()
            disk = on_disk(workspace)
            results[str(level)] = {
                "populate_seconds": round(seconds, 1),
                "on_disk": disk,
                **await measure(workspace, population, args.prompts),
            }
    first, last = results[str(levels[0])], results[str(levels[-1])]
    return {
        "benchmark": "scale",
        "workload": {"levels": levels, "prompts": args.prompts, "turns_per_prompt": 3},
        "levels": results,
        "flat": {
            "ms_per_turn_last_over_first": round(last["ms_per_turn"] / first["ms_per_turn"], 2),
            "rss_after_prompts_last_over_first": round(
                last["server_rss_kib"]["after_prompts"] / first["server_rss_kib"]["after_prompts"],
                2,
            ),
        },
        "peer": None,
        "peer_reason": "deepagents has no per-owner workspace on disk to grow; its conversations "
        "live in a checkpointer",
        "env": machine(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="10,1000,10000")
    parser.add_argument("--prompts", type=int, default=40)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=1))
