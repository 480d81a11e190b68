"""The console's files over HTTP, and the demo's printed console URL."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
from pathlib import Path

import httpx2

from atmosphere_harness import ScriptedRuntime
from tests.http.test_memory_http import Keeper
from tests.support import client_for, make_app

ROOT = Path(__file__).resolve().parents[2]


async def test_the_console_is_served_with_a_strict_policy(workspace: Path) -> None:
    async with client_for(make_app([Keeper], runtime=ScriptedRuntime(), workspace=workspace)) as c:
        bare = await c.get("/atmosphere/console", follow_redirects=False)
        page = await c.get("/atmosphere/console/")
        script = await c.get("/atmosphere/console/console.js")
        style = await c.get("/atmosphere/console/console.css")
        missing = await c.get("/atmosphere/console/secrets.txt")
        escape = await c.get("/atmosphere/console/..%2F..%2Fpyproject.toml")
        schema = (await c.get("/openapi.json")).json()
    assert bare.status_code == 308
    assert bare.headers["location"] == "console/"
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert '<script src="console.js" defer></script>' in page.text
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "script-src 'self'" in policy
    assert "connect-src 'self' ws: wss:" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert script.headers["content-type"].startswith("text/javascript")
    assert "use strict" in script.text
    assert style.headers["content-type"].startswith("text/css")
    assert missing.status_code == 404
    assert escape.status_code == 404
    assert not any(path.startswith("/atmosphere/console") for path in schema["paths"])


def test_the_console_loads_nothing_from_elsewhere() -> None:
    """No CDN, no remote font: every URL in the page's files is relative to the app."""
    console = ROOT / "atmosphere_harness" / "_web" / "console"
    for name in ("index.html", "console.js", "console.css"):
        text = (console / name).read_text(encoding="utf-8")
        assert not re.search(r"https?://", text), name
        assert "@import" not in text, name
        assert "innerHTML" not in text, f"{name} writes server data as text only"


def test_the_console_ships_in_the_wheel() -> None:
    """The package data the router reads at start-up is inside the package directory."""
    from importlib.resources import files

    package = files("atmosphere_harness._web.console")
    for name in ("index.html", "console.js", "console.css"):
        assert package.joinpath(name).read_bytes()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_the_demo_prints_a_console_url_whose_token_opens_the_workspace(
    workspace: Path,
) -> None:
    port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ATMOSPHERE_", "LLM_"))
    }
    env |= {
        "LLM_RUNTIME": "scripted",
        "ATMOSPHERE_WORKSPACE_ROOT": str(workspace),
        "HOST": "127.0.0.1",
        "PORT": str(port),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "samples.personal_assistant",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        printed = ""
        while "console:" not in printed:
            line = await asyncio.wait_for(process.stdout.readline(), 30)
            assert line, "the demo exited before printing its console URL"
            printed += line.decode()
        match = re.search(r"console:\s+(\S+)/atmosphere/console/#token=(\S+)", printed)
        assert match, printed
        base, token = match.groups()
        assert base == f"http://127.0.0.1:{port}"
        assert len(token) >= 24
        async with httpx2.AsyncClient(base_url=base, timeout=10) as client:
            for _ in range(300):
                try:
                    page = await client.get("/atmosphere/console/")
                    break
                except httpx2.TransportError:
                    await asyncio.sleep(0.05)
            assert page.status_code == 200
            params = {"sessionId": "nothing-yet"}
            path = "/api/admin/agents/assistant/plan"
            denied = await client.get(path, params=params)
            allowed = await client.get(path, params=params, headers={"X-Atmosphere-Auth": token})
        assert denied.status_code == 401
        assert allowed.status_code == 404, "authorized: the conversation simply has no plan yet"
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 15)
