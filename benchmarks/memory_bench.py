"""Memory benchmarks: per-turn overhead with history, storage amplification, recall, close latency.

    .venv/bin/python benchmarks/memory_bench.py [--repeats 3] [--peer-python PATH] [--json OUT]

Prints one JSON document. Sections:

- `turns`: 60 model turns, one `write_file` of 1 KiB or 50 KiB each, driven by a scripted model
  through the real loop (tool executor, SQLite history). Two shapes: one prompt with 60 tool
  rounds (the peer's shape), and 60 prompts in one conversation (history loaded, compacted and
  stored on every prompt). `per_turn_ms` is wall time per model turn, the model costing ~0.
  `amplification` is bytes on disk (workspace files + the SQLite database) per byte written.
  The workspace files come from a stand-in `write_file` tool (temp file + `os.replace`); the
  filesystem primitive is not part of this measurement.
- `peer`: the same 60-turn runs on LangChain deepagents (`create_deep_agent`, a scripted model,
  `InMemorySaver` for the 50 KiB run), when `--peer-python` names an interpreter that has it;
  `ratio` = peer per-turn time / ours, and peer amplification / ours.
- `recall`: 100k facts across 1k users in `SqliteLongTermMemory`; latency of `get_facts`,
  FTS5 `search` and the interceptor's full recall, per call.
- `close`: `POST P/conversations/{id}/close` over loopback HTTP while extraction takes
  `--extraction-ms`: the close answers without waiting for it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

try:
    from atmosphere_harness import StreamingSession, ToolContext
except ImportError:  # the peer side runs in the peer's own environment
    StreamingSession = ToolContext = Any  # type: ignore[misc,assignment]

from common import disk_bytes, make_workload, peer_call, peer_model, saver_bytes


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


# --- ours: turns --------------------------------------------------------------------------


async def run_turns(files: list[tuple[str, str]], shape: str, memory: bool) -> dict[str, Any]:
    from atmosphere_harness import Harness, HarnessSettings, ScriptedRuntime, ToolCall, agent
    from atmosphere_harness import prompt as prompt_method
    from atmosphere_harness._assembly import default_primitives
    from atmosphere_harness._kernel.host import HarnessHost
    from atmosphere_harness._kernel.run import execute_prompt
    from atmosphere_harness._registry import spec_of
    from atmosphere_harness._tools.base import tool

    workspace = Path(tempfile.mkdtemp(prefix="memory-bench-"))
    files_root = workspace / "files"

    @tool
    async def write_file(path: str, content: str, context: ToolContext) -> str:
        """Stand-in for the filesystem primitive's tool: an atomic write in the workspace."""
        target = files_root / context.conversation_id / path
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(target.name + ".tmp")
        temporary.write_text(content, encoding="utf-8")
        os.replace(temporary, target)
        return f"Wrote {path}"

    @agent(name="bench", harness=(Harness.MEMORY,) if memory else ())
    class Bench:
        tools = [write_file]

        @prompt_method
        async def chat(self, message: str, session: StreamingSession) -> None:
            await session.stream(message)

    if shape == "one-prompt":
        turns: list[Any] = [[ToolCall("write_file", {"path": p, "content": c})] for p, c in files]
        turns.append("done")
    else:
        turns = []
        for path, content in files:
            turns += [[ToolCall("write_file", {"path": path, "content": content})], "done"]
    runtime = ScriptedRuntime(turns)
    runtime.record_requests = False
    settings = HarnessSettings(
        workspace_root=workspace, conversation_idle_timeout=0, max_tool_rounds=100
    )
    host = HarnessHost(
        settings, runtime=runtime, specs=[spec_of(Bench)], primitives=default_primitives()
    )
    await host.start()
    endpoint = host.endpoints["/atmosphere/agent/bench"]

    async def sink(frame: Any) -> None:
        return None

    prompts = 1 if shape == "one-prompt" else len(files)
    started = time.perf_counter()
    for _ in range(prompts):
        run = await execute_prompt(
            host, endpoint, message="go", conversation_id="c1", user_id=None, sink=sink
        )
        assert run.session.last_text == "done", run.session.last_text
    elapsed = time.perf_counter() - started
    await host.stop()
    written = sum(len(content.encode()) for _, content in files)
    on_disk = disk_bytes(workspace)
    shutil.rmtree(workspace, ignore_errors=True)
    model_turns = len(files) + 1 if shape == "one-prompt" else 2 * len(files)
    return {
        "per_turn_ms": elapsed * 1000 / len(files),
        "per_model_call_ms": elapsed * 1000 / model_turns,
        "amplification": on_disk / written,
        "written_bytes": written,
        "disk_bytes": on_disk,
    }


def turns_section(repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for size in (1, 50):
        files = make_workload(60, size)
        for shape in ("one-prompt", "60-prompts"):
            for memory in (True, False):
                samples = [asyncio.run(run_turns(files, shape, memory)) for _ in range(repeats)]
                key = f"{size}k/{shape}/{'memory' if memory else 'bare'}"
                results[key] = {
                    "per_turn_ms": median([s["per_turn_ms"] for s in samples]),
                    "per_model_call_ms": median([s["per_model_call_ms"] for s in samples]),
                    "amplification": round(
                        statistics.median(s["amplification"] for s in samples), 4
                    ),
                    "written_mib": round(samples[0]["written_bytes"] / 2**20, 3),
                    "disk_mib": round(
                        statistics.median(s["disk_bytes"] for s in samples) / 2**20, 3
                    ),
                    "samples_per_turn_ms": [round(s["per_turn_ms"], 3) for s in samples],
                }
    return results


# --- the peer -----------------------------------------------------------------------------


def peer_turns(size_kib: int, checkpointer: bool) -> dict[str, Any]:
    """deepagents: one invoke, 60 model turns each with one write_file (the shared workload)."""
    import uuid

    from deepagents import create_deep_agent
    from langchain_core.messages import AIMessage, HumanMessage

    files = make_workload(60, size_kib)

    script = [
        AIMessage(
            content="",
            tool_calls=[peer_call("write_file", {"file_path": "/" + path, "content": content})],
        )
        for path, content in files
    ]

    def respond(turn: int) -> Any:
        return script[turn] if turn < len(script) else AIMessage("done")

    saver = None
    if checkpointer:
        from langgraph.checkpoint.memory import InMemorySaver

        saver = InMemorySaver()
    graph = create_deep_agent(model=peer_model(respond), checkpointer=saver)
    started = time.perf_counter()
    graph.invoke(
        {"messages": [HumanMessage("go")]},
        {"configurable": {"thread_id": "t" + uuid.uuid4().hex[:6]}},
    )
    elapsed = time.perf_counter() - started
    result: dict[str, Any] = {"per_turn_ms": elapsed * 1000 / len(files)}
    if saver is not None:
        stored = saver_bytes(saver)
        result["amplification"] = stored / sum(len(c.encode()) for _, c in files)
    return result


def peer_main(repeats: int) -> None:
    out: dict[str, Any] = {}
    for size, checkpointer in ((1, False), (50, True)):
        samples = [peer_turns(size, checkpointer) for _ in range(repeats)]
        entry: dict[str, Any] = {"per_turn_ms": median([s["per_turn_ms"] for s in samples])}
        if checkpointer:
            entry["amplification"] = round(
                statistics.median(s["amplification"] for s in samples), 3
            )
        entry["samples_per_turn_ms"] = [round(s["per_turn_ms"], 3) for s in samples]
        out[f"{size}k/one-prompt" + ("+checkpointer" if checkpointer else "")] = entry
    import importlib.metadata

    out["version"] = importlib.metadata.version("deepagents")
    print(json.dumps(out))


def peer_section(python: str, repeats: int) -> dict[str, Any]:
    done = subprocess.run(
        [python, __file__, "--side", "peer", "--repeats", str(repeats)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["peer run failed"]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --- recall -------------------------------------------------------------------------------

TOPICS = ("garden", "piano", "cycling", "coffee", "python", "montreal")


async def recall_section(users: int, facts_per_user: int, samples: int) -> dict[str, Any]:
    from atmosphere_harness import SqliteLongTermMemory
    from atmosphere_harness._memory.interceptor import LongTermMemoryInterceptor

    workspace = Path(tempfile.mkdtemp(prefix="memory-recall-"))
    store = SqliteLongTermMemory(workspace / "facts.db", max_facts_per_user=facts_per_user)
    rng = random.Random(7)
    started = time.perf_counter()
    for user in range(users):
        facts = [
            f"User {user} mentioned {rng.choice(TOPICS)} and {rng.choice(TOPICS)} on day {day}"
            for day in range(facts_per_user)
        ]
        await store.save_facts(f"user-{user}", facts)
    load_s = time.perf_counter() - started
    interceptor = LongTermMemoryInterceptor(store)

    async def measure(call: Callable[[str], Awaitable[Any]]) -> dict[str, float]:
        timings = []
        for _ in range(samples):
            user = f"user-{rng.randrange(users)}"
            begin = time.perf_counter()
            await call(user)
            timings.append((time.perf_counter() - begin) * 1000)
        timings.sort()
        return {"median_ms": median(timings), "p95_ms": round(timings[int(0.95 * len(timings))], 3)}

    query = "Shall we talk about jazz and hiking this weekend?"
    result = {
        "facts": users * facts_per_user,
        "users": users,
        "load_s": round(load_s, 2),
        "get_facts_20": await measure(lambda user: store.get_facts(user, 20)),
        "search_fts5_20": await measure(lambda user: store.search(user, query, 20)),
        "interceptor_recall": await measure(lambda user: interceptor.recall(user, query)),
        "fact_count": await measure(lambda user: store.fact_count(user)),
    }
    await store.aclose()
    result["db_mib"] = round(disk_bytes(workspace) / 2**20, 2)
    shutil.rmtree(workspace, ignore_errors=True)
    return result


# --- close latency ------------------------------------------------------------------------


async def close_section(closes: int, extraction_ms: float) -> dict[str, Any]:
    import httpx2
    import uvicorn
    from fastapi import FastAPI

    from atmosphere_harness import (
        HarnessSettings,
        ModelRequest,
        ScriptedRuntime,
        agent,
        create_harness_router,
    )
    from atmosphere_harness import prompt as prompt_method
    from atmosphere_harness._web.deps import user_id_from_header

    extraction_times: list[float] = []

    async def turn(request: ModelRequest) -> str:
        if request.metadata.get("purpose") == "memory-extraction":
            begin = time.perf_counter()
            await asyncio.sleep(extraction_ms / 1000)
            extraction_times.append((time.perf_counter() - begin) * 1000)
            return '["Likes benchmarks"]'
        return "ok"

    @agent(name="closer")
    class Closer:
        @prompt_method
        async def chat(self, message: str, session: StreamingSession) -> None:
            await session.stream(message)

    workspace = Path(tempfile.mkdtemp(prefix="memory-close-"))
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace, conversation_idle_timeout=0),
            agents=[Closer],
            runtime=ScriptedRuntime((), default=turn),
            user_id=user_id_from_header,
        )
    )
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    path = "/atmosphere/agent/closer"
    close_ms: list[float] = []
    async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        for index in range(closes):
            headers = {"X-User-Id": f"user-{index}"}
            body = {"message": "I like benchmarks", "conversationId": f"c{index}"}
            assert (await client.post(path, json=body, headers=headers)).status_code == 200
            begin = time.perf_counter()
            response = await client.post(f"{path}/conversations/c{index}/close", headers=headers)
            close_ms.append((time.perf_counter() - begin) * 1000)
            assert response.status_code == 200
    server.should_exit = True
    await task
    shutil.rmtree(workspace, ignore_errors=True)
    return {
        "closes": closes,
        "close_request_median_ms": median(close_ms),
        "close_request_max_ms": round(max(close_ms), 3),
        "extraction_median_ms": median(extraction_times) if extraction_times else None,
        "extractions_completed": len(extraction_times),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=("ours", "peer"), default="ours")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peer-python", default=os.environ.get("ATMOSPHERE_BENCH_PEER_PYTHON"))
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--facts-per-user", type=int, default=100)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--closes", type=int, default=20)
    parser.add_argument("--extraction-ms", type=float, default=500)
    parser.add_argument("--skip", default="", help="comma list of sections to skip")
    parser.add_argument("--json", default=None, help="also write the document to this path")
    args = parser.parse_args()
    if args.side == "peer":
        peer_main(args.repeats)
        return
    skip = set(filter(None, args.skip.split(",")))
    logging_quiet()
    document: dict[str, Any] = {"python": sys.version.split()[0], "repeats": args.repeats}
    if "turns" not in skip:
        document["turns"] = turns_section(args.repeats)
    if args.peer_python and "peer" not in skip:
        peer = peer_section(args.peer_python, args.repeats)
        document["peer"] = peer
        ours = document.get("turns", {})
        if "1k/one-prompt" in peer and "1k/one-prompt/memory" in ours:
            document["ratio"] = {
                "per_turn_1k": round(
                    peer["1k/one-prompt"]["per_turn_ms"]
                    / ours["1k/one-prompt/memory"]["per_turn_ms"],
                    1,
                ),
                "per_turn_50k": round(
                    peer["50k/one-prompt+checkpointer"]["per_turn_ms"]
                    / ours["50k/one-prompt/memory"]["per_turn_ms"],
                    1,
                ),
                "amplification_50k": round(
                    peer["50k/one-prompt+checkpointer"]["amplification"]
                    / ours["50k/60-prompts/memory"]["amplification"],
                    1,
                ),
            }
    if "recall" not in skip:
        document["recall"] = asyncio.run(
            recall_section(args.users, args.facts_per_user, args.samples)
        )
    if "close" not in skip:
        document["close"] = asyncio.run(close_section(args.closes, args.extraction_ms))
    text = json.dumps(document, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


def logging_quiet() -> None:
    import logging

    logging.getLogger("atmosphere_harness").setLevel(logging.ERROR)


if __name__ == "__main__":
    main()
