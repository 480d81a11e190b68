"""The peer agent servers the benchmarks measure ours against: Aegra and `langgraph dev`.

Both are installed on first use into their own virtual environments under
`benchmarks/.work/peers/` (git-ignored), pinned, with Python >= 3.12 (which they need): the
interpreter named by `BENCH_PEER_PYTHON`, else `python3.12`/`python3.13` on the `PATH`, else a
pyenv one. Where none exists, `peer_python()` says why and the benchmarks report the peer as
skipped. Each serves `peer_graph.py` (a LangGraph ReAct agent on the same fake model as ours).

- **Aegra** (`aegra-api`, an open-source Agent Protocol server): `uvicorn aegra_api.main:app` on
  its own PostgreSQL database (the caller creates and drops it); with `redis_url`, its Redis
  broker too (`REDIS_BROKER_ENABLED`: runs queued and streamed through Redis, so a run started
  on one replica can be followed from another), on its own key prefix.
- **`langgraph dev`** (`langgraph-cli[inmem]`): LangGraph's in-memory development server.

Both speak the LangGraph API: a run is `POST /threads/{id}/runs/stream` (the thread created on
the fly), its tokens as `messages` events (`stream_mode: messages-tuple`), the stream ends when
the run does.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from inflight import Served, environment, free_port, wait_for_port

HERE = Path(__file__).resolve().parent
PEERS = HERE / ".work" / "peers"
PACKAGES = {
    "aegra": ["aegra-api==0.11.0", "langchain-openai>=1.7"],
    "langgraph": ["langgraph-cli[inmem]==0.4.40", "langchain-openai>=1.7"],
}


def runs(python: str) -> bool:
    """Whether `python` starts (a pyenv shim on the PATH may name a version that is not
    selected, and fails)."""
    try:
        return subprocess.run([python, "-c", ""], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def peer_python() -> tuple[str | None, str]:
    """(interpreter, "") or (None, why there is none)."""
    candidates = [os.environ.get("BENCH_PEER_PYTHON") or ""]
    candidates += [shutil.which(name) or "" for name in ("python3.12", "python3.13")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python")))
    for candidate in candidates:
        if candidate and Path(candidate).exists() and runs(candidate):
            return candidate, ""
    return None, (
        "the peers (Aegra, langgraph dev) need Python >= 3.12 and none was found: set "
        "BENCH_PEER_PYTHON, or put python3.12 on the PATH"
    )


def install(name: str) -> tuple[Path | None, str]:
    """The peer's venv (installed on first use), or (None, why not)."""
    python, why = peer_python()
    if python is None:
        return None, why
    venv = PEERS / name
    marker = venv / ".installed"
    wanted = " ".join(PACKAGES[name])
    if marker.exists() and marker.read_text() == wanted:
        return venv, ""
    try:
        if not (venv / "bin" / "python").exists():
            subprocess.run([python, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", *PACKAGES[name]],
            check=True,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        output = getattr(exc, "stderr", "") or ""
        return None, f"installing {name} failed: {output.strip()[-500:]}"
    marker.write_text(wanted)
    return venv, ""


def agent_protocol_request(
    port: int, message: str, thread: str, *, background: bool = False
) -> bytes:
    """A LangGraph API run on a new thread: streamed, or (`background`) only created."""
    body = json.dumps(
        {
            "assistant_id": "agent",
            "input": {"messages": [{"role": "user", "content": message}]},
            "stream_mode": ["messages-tuple"],
            "if_not_exists": "create",
        }
    ).encode()
    path = f"/threads/{thread}/runs" + ("" if background else "/stream")
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"accept: text/event-stream\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def join_request(port: int, thread: str, run: str) -> bytes:
    """Follow a run (on any replica): `GET /threads/{id}/runs/{run_id}/stream`."""
    return (
        f"GET /threads/{thread}/runs/{run}/stream?stream_mode=messages-tuple HTTP/1.1\r\n"
        f"host: 127.0.0.1:{port}\r\naccept: text/event-stream\r\nconnection: close\r\n\r\n"
    ).encode()


class PeerServer(Served):
    """A peer under its own interpreter: its process tree's CPU and memory, and a stop."""

    protocol = "agent-protocol"

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.port = free_port()
        self.log = log.open("ab")
        self.process = subprocess.Popen(
            [part.replace("{port}", str(self.port)) for part in command],
            env=environment(env),
            cwd=cwd,
            stdout=self.log,
            stderr=self.log,
        )
        self.workers = 1
        try:
            wait_for_port(self.port, self.process, timeout=180)
        except BaseException:
            self.close()
            raise

    def request(self, message: str, conversation: str) -> bytes:
        return agent_protocol_request(self.port, message, conversation)


def aegra(
    venv: Path,
    root: Path,
    model_port: int,
    database_url: str,
    redis_url: str | None = None,
    prefix: str = "",
) -> PeerServer:
    """An Aegra replica (several on one database and Redis prefix make a cluster)."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "aegra.json"
    config.write_text(json.dumps({"graphs": {"agent": f"{HERE / 'peer_graph.py'}:graph"}}))
    env = {
        "AEGRA_CONFIG": str(config),
        "DATABASE_URL": database_url,
        "FAKE_MODEL_URL": f"http://127.0.0.1:{model_port}/v1",
        "CRON_ENABLED": "false",
        "LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(HERE),
    }
    if redis_url is not None:
        env.update(
            {
                "REDIS_BROKER_ENABLED": "true",
                "REDIS_URL": redis_url,
                "REDIS_CHANNEL_PREFIX": f"{prefix}run:",
                "WORKER_QUEUE_KEY": f"{prefix}jobs",
            }
        )
    command = [
        str(venv / "bin" / "uvicorn"),
        "aegra_api.main:app",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    return PeerServer(command, env, root, root / f"aegra-{uuid.uuid4().hex[:6]}.log")


def langgraph_dev(venv: Path, root: Path, model_port: int) -> PeerServer:
    """`langgraph dev`: LangGraph's in-memory server (one process)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "langgraph.json").write_text(
        json.dumps({"dependencies": ["."], "graphs": {"agent": f"{HERE / 'peer_graph.py'}:graph"}})
    )
    env = {"FAKE_MODEL_URL": f"http://127.0.0.1:{model_port}/v1", "PYTHONPATH": str(HERE)}
    command = [
        str(venv / "bin" / "langgraph"),
        "dev",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--no-browser",
        "--no-reload",
    ]
    return PeerServer(command, env, root, root / "langgraph.log")
