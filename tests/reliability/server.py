"""A reliability app under uvicorn in its own process, which a test can measure and SIGKILL.

`python -m tests.reliability.server KIND` binds 127.0.0.1 on a free port, prints `PORT <n>` and
serves `tests.reliability.apps.create(KIND)` with settings from the environment. A separate
process is what makes the fault test real (SIGKILL takes the whole server down mid-write, the
way a crash or an OOM kill does) and what lets the hostile test read the server's own resident
memory without the client's allocations mixed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

import httpx2

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0
"""Hang guard for start-up (imports and the lifespan), not a speed expectation."""


class ServerProcess:
    """One server subprocess: start, probe, measure, stop or kill it."""

    def __init__(
        self,
        kind: str,
        workspace: Path,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        module: str = "tests.reliability.server",
    ) -> None:
        self.kind = kind
        self.module = module
        """The module `python -m` runs: it prints `PORT <n>` and serves (see `serve_app`)."""
        self.workspace = workspace
        self.log_path = log_path
        self.env = dict(env or {})
        self.process: subprocess.Popen[str] | None = None
        self.url = ""
        self._log: IO[str] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> ServerProcess:
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("ATMOSPHERE_", "LLM_", "RELIABILITY_", "TEST_SERVER_"))
        }
        env.update(
            {
                "ATMOSPHERE_WORKSPACE_ROOT": str(self.workspace),
                "LLM_RUNTIME": "scripted",
                "PYTHONUNBUFFERED": "1",
                **self.env,
            }
        )
        self._log = self.log_path.open("a", encoding="utf-8")
        self.process = subprocess.Popen(
            [sys.executable, "-m", self.module, self.kind],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if not line.startswith("PORT "):
            self.kill()
            raise RuntimeError(f"server did not start: {line!r}\n{self.log_tail()}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if httpx2.get(self.url + "/api/console/info", timeout=5).status_code == 200:
                    return self
            except httpx2.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"server never became ready\n{self.log_tail()}")
            time.sleep(0.05)

    def _status(self, field: str) -> int:
        """A `/proc/{pid}/status` memory field, in bytes."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise LookupError(field)

    def rss(self) -> int:
        """Resident memory now."""
        return self._status("VmRSS")

    def peak_rss(self) -> int:
        """The most resident memory the process ever had."""
        return self._status("VmHWM")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self._close()

    def stop(self) -> int:
        """SIGTERM and wait for the graceful shutdown (SIGKILL after a hang guard).

        Returns the exit status: uvicorn re-raises the SIGTERM it handled once its shutdown is
        done, so a clean stop reads `-SIGTERM` (see `stopped_cleanly`).
        """
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self._close()
        return self.process.returncode

    def stopped_cleanly(self) -> bool:
        """Stopped by `stop`, and the lifespan's shutdown ran to its end: the SQLite WAL was
        checkpointed into the database and truncated (a killed server leaves it behind)."""
        code = self.stop()
        wal = self.workspace / "atmosphere.db-wal"
        return code in (0, -signal.SIGTERM) and (not wal.exists() or wal.stat().st_size == 0)

    def _close(self) -> None:
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def running(
    kind: str, workspace: Path, log_path: Path, env: Mapping[str, str] | None = None
) -> Iterator[ServerProcess]:
    """A started server, stopped (or killed, if it will not stop) when the block ends."""
    server = ServerProcess(kind, workspace, log_path, env).start()
    try:
        yield server
    finally:
        if server.process is not None and server.process.poll() is None:
            server.stop()


def _serve(kind: str) -> None:
    from tests.reliability.apps import create

    serve_app(create(kind))


def serve_app(app: object) -> None:
    """Serve `app` on a free loopback port, printing `PORT <n>` first (what `start` reads)."""
    import uvicorn

    level = os.environ.get("TEST_SERVER_LOG_LEVEL", "WARNING")
    logging.basicConfig(level=level, format="%(levelname)s %(name)s %(message)s")
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY on accepted connections only
    # when the socket says it is TCP, and without it every response waits ~40 ms (Nagle
    # against the client's delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        log_level="warning",
        lifespan="on",
        backlog=2048,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    _serve(sys.argv[1])
