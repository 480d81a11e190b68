"""Transport cost: one streamed answer served over AG-UI (ours vs the peer), SSE and WebSocket.

    python benchmarks/transports.py [--runs 20] [--repeats 3]

Every server runs in its own subprocess (one uvicorn worker) and asks the same fake
OpenAI-compatible model server (`benchmarks/fake_model_server.py`, workload `text`: one answer in
2,000 word-sized deltas), so what differs is the serving stack: request parsing, the agent loop,
persistence, event translation and encoding.

- ours: a default `@agent` (memory, planning, filesystem attached) on `OpenAIRuntime`, asked over
  `POST P/ag-ui`, `POST P` (SSE) and `WS P/ws`;
- peer: a `deepagents.create_deep_agent` graph on `langchain_openai.ChatOpenAI` with a
  `MemorySaver` checkpointer, served by `ag-ui-langgraph`'s FastAPI endpoint (how LangChain
  documents serving a deep agent to AG-UI clients).

The client (this process) sends `--runs` prompts one after another, each in a new thread or
conversation, reads each response to its end and checks the text it carried. Reported per
transport: wall time per run (client side) and server CPU time per run (`/proc/{pid}/stat`),
medians over `--repeats`; `ratios` divide the peer's AG-UI figures by ours.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx2
from common import free_port
from fastapi import FastAPI

from atmosphere_harness import (
    HarnessSettings,
    OpenAIRuntime,
    StreamingSession,
    agent,
    create_harness_router,
    prompt,
)

ROOT = Path(__file__).resolve().parents[1]
AGENT = "/atmosphere/agent/bench"
PEER_PATH = "/agent"
WORKLOAD = "text"
EXPECTED = "".join(f"word{index % 97} " for index in range(2000))
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- the servers (run as `transports.py --serve ours|peer`) -------------------------------------


@agent(name="bench")
class Bench:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


def ours_app(model_base: str, workspace: str) -> FastAPI:
    runtime = OpenAIRuntime(WORKLOAD, base_url=f"{model_base}/v1", api_key="x", max_retries=0)
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=Path(workspace)), agents=[Bench], runtime=runtime
        )
    )
    return app


def peer_app(model_base: str) -> FastAPI:
    from ag_ui_langgraph import LangGraphAgent, add_langgraph_fastapi_endpoint
    from deepagents import create_deep_agent
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import MemorySaver

    model = ChatOpenAI(
        model=WORKLOAD, base_url=f"{model_base}/v1", api_key="x", max_retries=0, streaming=True
    )
    graph = create_deep_agent(model=model, checkpointer=MemorySaver())
    app = FastAPI()
    add_langgraph_fastapi_endpoint(app, LangGraphAgent(name="bench", graph=graph), PEER_PATH)
    return app


def serve(kind: str, port: int, model_base: str, workspace: str) -> None:
    import uvicorn

    app = ours_app(model_base, workspace) if kind == "ours" else peer_app(model_base)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# --- processes ---------------------------------------------------------------------------------


def start(command: list[str], port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{command} did not start")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


# --- the client --------------------------------------------------------------------------------


def run_input(thread: str) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": uuid.uuid4().hex,
        "state": {},
        "messages": [{"id": uuid.uuid4().hex, "role": "user", "content": "Write the notes."}],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }


def streamed_text(body: str, kind: str) -> str:
    """The answer an SSE body carried: AG-UI `TEXT_MESSAGE_CONTENT` deltas or `text` frames."""
    text = []
    for line in body.splitlines():
        if not line.startswith("data:"):
            continue
        event = json.loads(line[5:])
        if kind == "agui" and event.get("type") == "TEXT_MESSAGE_CONTENT":
            text.append(event["delta"])
        elif kind == "frames" and event.get("event") == "text":
            text.append(event["data"]["text"])
    return "".join(text)


async def one_agui(client: httpx2.AsyncClient, url: str) -> str:
    response = await client.post(url, json=run_input(str(uuid.uuid4())))
    response.raise_for_status()
    return streamed_text(response.text, "agui")


async def one_sse(client: httpx2.AsyncClient, url: str) -> str:
    body = {"message": "Write the notes.", "conversationId": str(uuid.uuid4())}
    response = await client.post(url, json=body)
    response.raise_for_status()
    return streamed_text(response.text, "frames")


async def one_ws(url: str) -> str:
    from websockets.asyncio.client import connect

    text = []
    async with connect(f"{url}?conversationId={uuid.uuid4()}", max_size=None) as socket_:
        await socket_.send(json.dumps({"message": "Write the notes."}))
        while True:
            frame = json.loads(await socket_.recv())
            if frame["event"] == "text":
                text.append(frame["data"]["text"])
            elif frame["event"] in ("complete", "error"):
                return "".join(text)


async def measure(label: str, runs: int, pid: int, once: Any) -> dict[str, float]:
    await once()  # warm-up: imports, first connection, first SQLite page
    cpu_before = cpu_seconds(pid)
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        text = await once()
        walls.append(time.perf_counter() - started)
        if text != EXPECTED:
            raise AssertionError(f"{label}: the answer arrived incomplete ({len(text)} chars)")
    cpu = cpu_seconds(pid) - cpu_before
    return {
        "wall_ms_per_run": round(1000 * statistics.median(walls), 2),
        "server_cpu_ms_per_run": round(1000 * cpu / runs, 2),
    }


def median_of(samples: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(s[key] for s in samples), 2) for key in samples[0]}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    model_port, ours_port = free_port(), free_port()
    model = start(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "benchmarks.fake_model_server:app",
            "--port",
            str(model_port),
            "--log-level",
            "warning",
        ],
        model_port,
    )
    model_base = f"http://127.0.0.1:{model_port}"
    processes = [model]
    peer_reason = None
    if importlib.util.find_spec("deepagents") is None or (
        importlib.util.find_spec("ag_ui_langgraph") is None
    ):
        peer_reason = "deepagents or ag-ui-langgraph is not installed (pip install -e '.[bench]')"
    try:
        with tempfile.TemporaryDirectory() as workspace:
            me = Path(__file__).resolve()
            ours = start(
                [sys.executable, str(me), "--serve", "ours", "--port", str(ours_port),
                 "--model-base", model_base, "--workspace", workspace],
                ours_port,
            )  # fmt: skip
            processes.append(ours)
            peer = None
            if peer_reason is None:
                peer_port = free_port()
                peer = start(
                    [sys.executable, str(me), "--serve", "peer", "--port", str(peer_port),
                     "--model-base", model_base, "--workspace", workspace],
                    peer_port,
                )  # fmt: skip
                processes.append(peer)
            base = f"http://127.0.0.1:{ours_port}"
            results: dict[str, list[dict[str, float]]] = {}
            async with httpx2.AsyncClient(timeout=60) as client:
                for _ in range(args.repeats):
                    cases: list[tuple[str, int, Any]] = [
                        ("ours_agui", ours.pid, lambda: one_agui(client, f"{base}{AGENT}/ag-ui")),
                        ("ours_sse", ours.pid, lambda: one_sse(client, f"{base}{AGENT}")),
                        (
                            "ours_websocket",
                            ours.pid,
                            lambda: one_ws(f"ws://127.0.0.1:{ours_port}{AGENT}/ws"),
                        ),
                    ]
                    if peer is not None:
                        url = f"http://127.0.0.1:{peer_port}{PEER_PATH}"
                        cases.append(("peer_agui", peer.pid, lambda u=url: one_agui(client, u)))
                    for label, pid, once in cases:
                        results.setdefault(label, []).append(
                            await measure(label, args.runs, pid, once)
                        )
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(15)
    figures = {label: median_of(samples) for label, samples in results.items()}
    ratios = None
    if "peer_agui" in figures:
        ratios = {
            key: round(figures["peer_agui"][key] / figures["ours_agui"][key], 2)
            for key in figures["ours_agui"]
        }
    return {
        "benchmark": "transports",
        "workload": {"model": WORKLOAD, "text_deltas": 2000, "runs": args.runs},
        "repeats": args.repeats,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "ours": {k: v for k, v in figures.items() if k.startswith("ours")},
        "peer": figures.get("peer_agui"),
        "peer_reason": peer_reason,
        "ratios": {"agui_peer_over_ours": ratios} if ratios else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serve", choices=("ours", "peer"))
    parser.add_argument("--port", type=int)
    parser.add_argument("--model-base")
    parser.add_argument("--workspace")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.model_base, args.workspace)
        return
    print(json.dumps(asyncio.run(bench(args)), indent=2))


if __name__ == "__main__":
    main()
