"""Model-runtime overhead: our runtimes vs LangChain's chat models (deepagents' model layer).

Both sides drive the official SDK against the same fake server (a separate process on
loopback, `benchmarks/fake_model_server.py`) that answers every call with the same pre-rendered
stream, and both assemble the full turn: the text, and every tool call with its parsed
arguments. What differs is only the client-side work per call: request building, stream
parsing, delta accumulation. We report wall time and this process's CPU time per call.

Workloads, per provider (OpenAI Chat Completions, Anthropic Messages):
  text          one answer streamed in 2,000 word-sized deltas
  tools         8 parallel tool calls, 2 KiB of arguments each, in 50-byte deltas
  big-argument  one tool call with a 64 KiB argument (a file body) in 50-byte deltas

Peer: `langchain_openai.ChatOpenAI` / `langchain_anthropic.ChatAnthropic` with tools bound,
streamed with `astream` and merged chunk by chunk (`acc + chunk`), as LangChain agents and
deepagents do.

Usage:
  .venv/bin/pip install -e '.[bench]'
  .venv/bin/python -m benchmarks.bench_runtimes --repeats 5 --calls 10 --big-calls 1
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata as md
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from atmosphere_harness import Message, ModelRequest
from atmosphere_harness._runtimes.anthropic import AnthropicRuntime
from atmosphere_harness._runtimes.base import ToolSpec
from atmosphere_harness._runtimes.openai import OpenAIRuntime

WORKLOADS = ("text", "tools", "big-argument")
SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
    "additionalProperties": False,
}
TOOL = ToolSpec("write_file", "Create or overwrite a workspace file.", SCHEMA)
SYSTEM = "You are a careful assistant."
PROMPT = "Write the notes."

Call = Callable[[], Awaitable[tuple[int, list[tuple[str, Any]]]]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_server() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "benchmarks.fake_model_server:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise RuntimeError("the fake model server did not start")


# --- ours ------------------------------------------------------------------------------------


def ours(provider: str, workload: str, base: str) -> Call:
    runtime: OpenAIRuntime | AnthropicRuntime
    if provider == "openai":
        runtime = OpenAIRuntime(workload, base_url=f"{base}/v1", api_key="x", max_retries=0)
    else:
        runtime = AnthropicRuntime(workload, base_url=base, api_key="x", max_retries=0)
    request = ModelRequest(SYSTEM, (Message.user(PROMPT),), tools=(TOOL,), conversation_id="c")

    async def sink(_: str) -> None:
        return None

    async def call() -> tuple[int, list[tuple[str, Any]]]:
        response = await runtime.complete(request, on_text=sink)
        return len(response.text), [(c.name, dict(c.arguments)) for c in response.tool_calls]

    return call


# --- the peer --------------------------------------------------------------------------------


def peer(provider: str, workload: str, base: str) -> Call:
    from langchain_core.messages import HumanMessage, SystemMessage

    model: Any
    if provider == "openai":
        from langchain_openai import ChatOpenAI

        model = ChatOpenAI(
            model=workload, base_url=f"{base}/v1", api_key="x", max_retries=0, stream_usage=True
        )
    else:
        from langchain_anthropic import ChatAnthropic

        model = ChatAnthropic(
            model=workload, base_url=base, api_key="x", max_retries=0, max_tokens=8192
        )
    function = {"name": TOOL.name, "description": TOOL.description, "parameters": SCHEMA}
    bound = model.bind_tools([{"type": "function", "function": function}])
    messages = [SystemMessage(SYSTEM), HumanMessage(PROMPT)]

    async def call() -> tuple[int, list[tuple[str, Any]]]:
        merged = None
        async for chunk in bound.astream(messages):
            merged = chunk if merged is None else merged + chunk
        assert merged is not None
        content = merged.content
        if not isinstance(content, str):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        text = content
        return len(text), [(c["name"], c["args"]) for c in merged.tool_calls]

    return call


# --- measuring -------------------------------------------------------------------------------


async def measure(call: Call, calls: int, repeats: int) -> tuple[float, float, Any]:
    """Median over `repeats` of the mean wall and CPU milliseconds per call."""
    outcome = await call()  # warm-up (connection, imports, caches)
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            await call()
        walls.append((time.perf_counter() - wall) * 1000 / calls)
        cpus.append((time.process_time() - cpu) * 1000 / calls)
    return statistics.median(walls), statistics.median(cpus), outcome


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--big-calls", type=int, default=1, help="calls per repeat of big-argument")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    server, base = _start_server()
    results = []
    try:
        for provider in ("openai", "anthropic"):
            for workload in WORKLOADS:
                calls = args.big_calls if workload == "big-argument" else args.calls
                our_wall, our_cpu, our_outcome = await measure(
                    ours(provider, workload, base), calls, args.repeats
                )
                peer_wall, peer_cpu, peer_outcome = await measure(
                    peer(provider, workload, base), calls, args.repeats
                )
                if our_outcome != peer_outcome:
                    raise AssertionError(f"{provider}/{workload}: the two sides disagree")
                results.append(
                    {
                        "provider": provider,
                        "workload": workload,
                        "calls_per_repeat": calls,
                        "ours_wall_ms": round(our_wall, 2),
                        "peer_wall_ms": round(peer_wall, 2),
                        "wall_ratio_peer_over_ours": round(peer_wall / our_wall, 2),
                        "ours_cpu_ms": round(our_cpu, 2),
                        "peer_cpu_ms": round(peer_cpu, 2),
                        "cpu_ratio_peer_over_ours": round(peer_cpu / our_cpu, 2),
                    }
                )
    finally:
        server.terminate()
        server.wait(10)
    report = {
        "benchmark": "runtimes",
        "repeats": args.repeats,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "versions": {
            name: md.version(name)
            for name in ("openai", "anthropic", "langchain-openai", "langchain-anthropic")
        },
        "results": results,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    asyncio.run(main())
