"""Plan-update fan-out: N concurrent SSE viewers of one conversation, U `write_todos` calls.

    python benchmarks/plan_fanout.py [--subscribers 1000] [--updates 200] [--repeat 3]

The server runs in a subprocess (one uvicorn worker, the default install: h11 + asyncio), so the
RSS figures are the server's alone. The viewers are raw asyncio sockets in this process speaking
HTTP/1.1 to `GET /atmosphere/agent/bench/plan/events`; the updates are real prompts
(`POST /atmosphere/agent/bench`) whose scripted model calls `write_todos` once each, sent one after
another. The server records when each update is published on the plan bus
(`time.monotonic_ns`, which is system-wide on Linux), the viewers record when its bytes arrive.

Prints one JSON document: per-run figures and their medians (delivered/expected, publish->receive
latency p50/p99/max, server RSS per viewer). No peer is measured: LangChain deepagents has no
live plan stream to fan out (todos reach UIs only as LangGraph state snapshots), so `peer` is null.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
from common import free_port, rss_kib, wait_until_serving
from fastapi import FastAPI

from atmosphere_harness import (
    HarnessSettings,
    ModelRequest,
    ScriptedRuntime,
    StreamingSession,
    ToolCall,
    agent,
    create_harness_router,
    prompt,
)
from atmosphere_harness._planning import InProcessPlanBus, PlanEvent, PlanningPrimitive

AGENT = "bench"
CONVERSATION = "fanout"
EVENTS_PATH = f"/atmosphere/agent/{AGENT}/plan/events?conversationId={CONVERSATION}"
ID_LINE = re.compile(rb"\nid: ([0-9a-f]+-(\d+))\r\n")


# --- the server subprocess ----------------------------------------------------------------------


@agent(name=AGENT)
class Bench:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


def serve(port: int, workspace: str) -> None:
    published: dict[str, int] = {}

    class TimedBus(InProcessPlanBus):
        async def publish(self, owner: str, conversation_id: str, data: Any) -> PlanEvent:
            event = await super().publish(owner, conversation_id, data)
            if conversation_id == CONVERSATION:
                published[event.id] = time.monotonic_ns()
            return event

    def turn(request: ModelRequest) -> str | list[ToolCall]:
        last = request.messages[-1]
        if last.role != "user":
            return "ok"
        n = int(last.content)
        todos = [
            {
                "content": f"Step {i} of update {n}: do the next small thing",
                "status": "completed"
                if i < n % 5
                else ("in_progress" if i == n % 5 else "pending"),
                "activeForm": f"Doing step {i}",
            }
            for i in range(5)
        ]
        return [ToolCall("write_todos", {"todos": todos, "goal": f"Benchmark update {n}"})]

    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace),
            agents=[Bench],
            runtime=ScriptedRuntime(default=turn),
            primitives=[PlanningPrimitive(bus=TimedBus())],
        )
    )

    @app.get("/bench/published")
    async def get_published() -> dict[str, int]:
        return published

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --- the viewers and the driver -------------------------------------------------------------


class Viewer(asyncio.Protocol):
    """One raw-socket SSE client that records when each event id arrives.

    A protocol (callbacks straight from the event loop, no task per viewer) keeps the client's
    own overhead out of the latency figures as far as Python allows.
    """

    def __init__(self) -> None:
        self.received: dict[str, int] = {}
        self.snapshot = asyncio.Event()
        self.transport: asyncio.Transport | None = None
        self._buffer = b""

    async def connect(self, port: int) -> None:
        await asyncio.get_running_loop().create_connection(lambda: self, "127.0.0.1", port)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        request = (
            f"GET {EVENTS_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
        )
        transport.write(request.encode())

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        buffer = self._buffer + data
        end = buffer.rfind(b"\r\n\r\n")
        if end < 0:
            self._buffer = buffer
            return
        complete, self._buffer = buffer[: end + 4], buffer[end + 4 :]
        for frame in complete.split(b"\r\n\r\n"):
            if b"event: plan-snapshot" in frame:
                self.snapshot.set()
                continue
            for match in ID_LINE.finditer(b"\n" + frame + b"\r\n"):
                self.received.setdefault(match.group(1).decode(), now)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def one_run(subscribers: int, updates: int, interval: float) -> dict[str, Any]:
    port = free_port()
    workspace = tempfile.mkdtemp(prefix="plan-fanout-")
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), workspace],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    viewers: list[Viewer] = []
    try:
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            await wait_until_serving(http, server)
            # Warm every code path once (imports, first plan file, first stream). The first
            # prompt also makes the conversation exist: a plan stream of a conversation no
            # prompt used answers 404.
            await http.post(
                f"/atmosphere/agent/{AGENT}", json={"message": "0", "conversationId": CONVERSATION}
            )
            warm = Viewer()
            await warm.connect(port)
            await asyncio.wait_for(warm.snapshot.wait(), 30)
            warm.close()
            await asyncio.sleep(1.0)
            baseline = rss_kib(server.pid)

            viewers = [Viewer() for _ in range(subscribers)]
            connect_started = time.monotonic()
            for viewer in viewers:
                await viewer.connect(port)
            await asyncio.wait_for(
                asyncio.gather(*(viewer.snapshot.wait() for viewer in viewers)), 120
            )
            connect_seconds = time.monotonic() - connect_started
            await asyncio.sleep(0.5)
            connected = rss_kib(server.pid)

            started = time.monotonic()
            peak = connected
            for n in range(1, updates + 1):
                response = await http.post(
                    f"/atmosphere/agent/{AGENT}",
                    json={"message": str(n), "conversationId": CONVERSATION},
                )
                response.raise_for_status()
                if interval:
                    await asyncio.sleep(interval)
                if n % 20 == 0:
                    peak = max(peak, rss_kib(server.pid))
            publish_seconds = time.monotonic() - started
            expected = subscribers * updates
            last, idle_since = -1, time.monotonic()
            while time.monotonic() - idle_since < 5:
                total = sum(len(viewer.received) for viewer in viewers)
                if total >= expected:
                    break
                if total != last:
                    last, idle_since = total, time.monotonic()
                await asyncio.sleep(0.05)
            drain_seconds = time.monotonic() - started
            peak = max(peak, rss_kib(server.pid))
            published = (await http.get("/bench/published")).json()
    finally:
        for viewer in viewers:
            viewer.close()
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

    ours: dict[str, int] = published
    latencies_ms = [
        (received - ours[event_id]) / 1e6
        for viewer in viewers
        for event_id, received in viewer.received.items()
        if event_id in ours
    ]
    delivered = len(latencies_ms)
    return {
        "delivered": delivered,
        "expected": subscribers * updates,
        "delivered_ratio": round(delivered / (subscribers * updates), 4),
        "published": len(ours),
        "latency_ms": {
            "p50": round(percentile(latencies_ms, 0.50), 2) if latencies_ms else None,
            "p99": round(percentile(latencies_ms, 0.99), 2) if latencies_ms else None,
            "max": round(max(latencies_ms), 2) if latencies_ms else None,
        },
        "server_rss_kib": {"baseline": baseline, "connected": connected, "peak": peak},
        "rss_kib_per_subscriber": round((connected - baseline) / subscribers, 2),
        "peak_rss_kib_per_subscriber": round((peak - baseline) / subscribers, 2),
        "connect_seconds": round(connect_seconds, 2),
        "publish_seconds": round(publish_seconds, 2),
        "updates_per_second": round(updates / publish_seconds, 1),
        "drain_seconds": round(drain_seconds, 2),
        "events_per_second": round(delivered / drain_seconds, 0),
    }


def median_of(runs: list[dict[str, Any]], *path: str) -> float | None:
    values = []
    for run in runs:
        value: Any = run
        for key in path:
            value = value[key]
        if value is not None:
            values.append(value)
    return statistics.median(values) if values else None


async def main(args: argparse.Namespace) -> None:
    runs = []
    for _ in range(args.repeat):
        runs.append(await one_run(args.subscribers, args.updates, args.interval_ms / 1000))
    paths = [
        ("delivered_ratio",),
        ("latency_ms", "p50"),
        ("latency_ms", "p99"),
        ("latency_ms", "max"),
        ("rss_kib_per_subscriber",),
        ("peak_rss_kib_per_subscriber",),
        ("updates_per_second",),
        ("events_per_second",),
    ]
    report = {
        "benchmark": "plan_fanout",
        "subscribers": args.subscribers,
        "updates": args.updates,
        "interval_ms": args.interval_ms,
        "server": {
            "workers": 1,
            "http": "h11",
            "loop": "asyncio",
            "python": sys.version.split()[0],
        },
        "median": {"_".join(path): median_of(runs, *path) for path in paths},
        "runs": runs,
        "peer": None,
        "peer_reason": "deepagents has no live plan stream: todos reach UIs only as LangGraph "
        "state snapshots, so there is no fan-out to compare",
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), sys.argv[3])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--interval-ms", type=float, default=0.0, help="pause between updates (0: back to back)"
    )
    asyncio.run(main(parser.parse_args()))
