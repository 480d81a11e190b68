"""Pieces several benchmarks share: deepagents' benchmark workload, the scripted deepagents model,
and small measuring helpers.

Scripts import it as `common` (they run as `python benchmarks/<name>.py`, which puts this
directory on `sys.path`). Nothing here imports `atmosphere_harness` or `deepagents` at module
level: a peer side may run in an interpreter that has only one of them.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import os
import platform
import random
import socket
import statistics
import subprocess
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx2

# fmt: off
WORDS = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi",
    "psi", "omega", "def", "class", "return", "import", "self", "value", "result", "config",
    "data", "path", "file", "async", "await", "yield", "lambda", "none", "true",
]
# fmt: on
LINE_LEN = 63


def _line(rng: random.Random, tag: str = "") -> str:
    parts = [tag] if tag else []
    while len(" ".join(parts)) < LINE_LEN:
        parts.append(rng.choice(WORDS))
    return " ".join(parts)[:LINE_LEN].ljust(LINE_LEN) + "\n"


def make_workload(
    n_files: int = 200, size_kib: int = 50, seed: int = 1234
) -> list[tuple[str, str]]:
    """`(relative path, content)` pairs, byte for byte deepagents' benchmark workload.

    800 lines of exactly 64 bytes per 50 KiB file in `pkg{0..9}/sub{0,1}/`; `needle_token` on
    every 50th line, one `UNIQUE_SENTINEL_XYZ` line in the middle file, one `EDIT_ANCHOR_<i>`
    line per file. Using the same bytes on both sides is what makes the ratios comparable.
    """
    n_lines = (size_kib * 1024) // (LINE_LEN + 1)
    rare = n_files // 2
    files = []
    for i in range(n_files):
        rng = random.Random(seed + i)
        name = f"mod_{i:03d}.py" if i % 2 == 0 else f"doc_{i:03d}.md"
        lines = []
        for n in range(n_lines):
            if n == 3:
                lines.append(_line(rng, f"EDIT_ANCHOR_{i}"))
            elif i == rare and n == n_lines - 2:
                lines.append(_line(rng, "UNIQUE_SENTINEL_XYZ"))
            elif n % 50 == 10:
                lines.append(_line(rng, "needle_token"))
            else:
                lines.append(_line(rng))
        files.append((f"pkg{i % 10}/sub{(i // 10) % 2}/{name}", "".join(lines)))
    return files


def written_bytes(files: Sequence[tuple[str, str]]) -> int:
    return sum(len(content.encode()) for _, content in files)


# --- measuring ----------------------------------------------------------------------------


def summary(samples: Sequence[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(samples), 3),
        "min_ms": round(min(samples), 3),
        "max_ms": round(max(samples), 3),
        "n": len(samples),
    }


def ratio(peer: float | None, ours: float | None, digits: int = 2) -> float | None:
    """`peer / ours`: above 1 means we take less (time, bytes) than the peer."""
    if peer is None or not ours:
        return None
    return round(peer / ours, digits)


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "atmosphere-harness": version("atmosphere-harness"),
        "deepagents": version("deepagents"),
        "langgraph": version("langgraph"),
    }


def peer_missing() -> str | None:
    """Why the peer cannot run here, or `None` when deepagents is importable."""
    if importlib.util.find_spec("deepagents") is None:
        return "deepagents is not installed; pip install '.[bench]' (make bench does)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_until_serving(
    http: httpx2.AsyncClient, server: subprocess.Popen[bytes], timeout: float = 60.0
) -> None:
    """Wait until the benchmark server in `server` answers `GET /api/console/info`."""
    async with asyncio.timeout(timeout):
        while True:
            if server.poll() is not None:
                raise RuntimeError("the benchmark server exited")
            try:
                await http.get("/api/console/info")
                return
            except httpx2.TransportError:
                await asyncio.sleep(0.05)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def disk_bytes(root: Path) -> int:
    """Apparent size of every file under `root` (what the files hold, not the blocks)."""
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


def checkpoint_bytes(value: Any, depth: int = 0) -> int:
    """Serialized bytes a LangGraph `InMemorySaver` holds (deepagents' own measure of its state).

    Pass the saver's `storage`, `blobs` and `writes` together: the sum of every `bytes` leaf.
    """
    if isinstance(value, bytes | bytearray):
        return len(value)
    if depth > 8:
        return 0
    if isinstance(value, dict):
        return sum(checkpoint_bytes(item, depth + 1) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(checkpoint_bytes(item, depth + 1) for item in value)
    return 0


def saver_bytes(saver: Any) -> int:
    return checkpoint_bytes([getattr(saver, name, {}) for name in ("storage", "blobs", "writes")])


# --- the peer's scripted model ------------------------------------------------------------


def peer_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """One LangChain tool call, as a chat model puts it in an `AIMessage`."""
    return {"name": name, "args": args, "id": "call_" + uuid.uuid4().hex[:12], "type": "tool_call"}


def peer_model(respond: Callable[[int], Any]) -> Any:
    """A LangChain chat model that answers instantly with `respond(turn)` (an `AIMessage`).

    `turn` counts the calls since `.stamps` was last cleared: the script is indexed by call, not
    read back from the messages, because deepagents' summarization rewrites them mid-run. Its
    own prompt (it contains `<messages>`) is answered with `SUMMARY` and counted in
    `.summaries`, never passed to `respond`. Every other call's `time.perf_counter()` is
    appended to `.stamps`, so a benchmark can time what happens between two model calls.
    """
    import time

    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class Scripted(BaseChatModel):
        summaries: int = 0
        stamps: list[float] = []
        job: str = ""
        """Free for the benchmark: what the current run is asked to do."""

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> Any:
            if messages and "<messages>" in str(messages[-1].content):
                self.summaries += 1
                reply = AIMessage(content="SUMMARY")
            else:
                self.stamps.append(time.perf_counter())
                reply = respond(len(self.stamps) - 1)
            return ChatResult(generations=[ChatGeneration(message=reply)])

    return Scripted()
