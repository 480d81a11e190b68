"""The README's quick start on a fresh clone: `make demo` serves and answers a prompt."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.heavy
def test_make_demo_from_a_fresh_clone(tmp_path: Path) -> None:
    if shutil.which("git") is None or shutil.which("make") is None:
        pytest.skip("git and make are needed to test the quick start")
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    port = _free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ATMOSPHERE_", "LLM_", "VIRTUAL_ENV"))
    }
    env["PORT"] = str(port)
    process = subprocess.Popen(
        ["make", "demo"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(
                    f"make demo exited early:\n{process.stdout.read() if process.stdout else ''}"
                )
            try:
                with urllib.request.urlopen(f"{base}/api/console/info", timeout=2) as reply:
                    info = json.load(reply)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("make demo did not start serving within 10 minutes")
        assert info["runtime"]["name"] == "scripted"
        request = urllib.request.Request(
            f"{base}/atmosphere/agent/assistant",
            data=json.dumps({"message": "hello demo"}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.headers["content-type"].startswith("text/event-stream")
            body = reply.read().decode()
        frames = [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:")]
        assert frames[-1]["event"] == "complete"
        text = "".join(f["data"]["text"] for f in frames if f["event"] == "text")
        assert text == "You said: hello demo"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
    assert "POST http://127.0.0.1:" in output, "the demo prints its URLs"
