"""A real AG-UI client, the npm package `@ag-ui/client` under Node, consumes `POST P/ag-ui`.

The client validates the event sequence itself (its `verifyEvents` rejects a content event
without its start, a RUN_FINISHED while a message or a tool call is open, ...) and applies the
events to its own messages and state, so a passing run means the protocol was spoken right.

The package is installed with npm into a cache directory outside the repository
(`$ATMOSPHERE_NPM_CACHE`, default `~/.cache/atmosphere-harness/npm`); without node or npm the
test skips on a laptop and fails in CI.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import ScriptedRuntime
from tests.http.test_agui_http import Speaker, demo_like
from tests.http.test_memory_http import KEEPER, Keeper
from tests.support import make_app, require_service, serve

pytestmark = pytest.mark.node

CLIENT_PACKAGE = "@ag-ui/client@1.0.0"

RUNNER = """
const { HttpAgent } = require("@ag-ui/client");
const [url, threadId, message] = process.argv.slice(2);
const agent = new HttpAgent({
  url,
  threadId,
  initialMessages: [{ id: "user-1", role: "user", content: message }],
});
const events = [];
agent
  .runAgent({ runId: "run-1" }, { onEvent: ({ event }) => { events.push(event); } })
  .then((result) => {
    process.stdout.write(JSON.stringify({
      events, state: agent.state, messages: agent.messages, result: result.result,
    }));
  })
  .catch((error) => {
    // A protocol violation (or a transport failure) rejects: report what the client saw.
    const reason = String((error && error.message) || error);
    process.stdout.write(JSON.stringify({ events, error: reason }));
  });
"""


def npm_cache() -> Path:
    default = Path.home() / ".cache" / "atmosphere-harness" / "npm"
    return Path(os.environ.get("ATMOSPHERE_NPM_CACHE", default))


@pytest.fixture(scope="session")
def agui_client() -> Path:
    """The directory whose node_modules holds `@ag-ui/client` (installed once, then reused)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        require_service("node", "node and npm are needed to run the @ag-ui/client test")
    cache = npm_cache()
    installed = cache / "node_modules" / "@ag-ui" / "client" / "package.json"
    wanted = CLIENT_PACKAGE.rsplit("@", 1)[1]
    if not installed.is_file() or json.loads(installed.read_text())["version"] != wanted:
        cache.mkdir(parents=True, exist_ok=True)
        manifest = cache / "package.json"
        if not manifest.exists():
            manifest.write_text('{"private": true}\n')
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--silent", CLIENT_PACKAGE],
            cwd=cache,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            require_service("npm", f"npm install {CLIENT_PACKAGE} failed: {done.stderr[-500:]}")
    return cache


async def run_client(cache: Path, url: str, thread: str, message: str) -> dict[str, Any]:
    script = cache / "atmosphere-run-agent.cjs"
    script.write_text(RUNNER)
    process = await asyncio.create_subprocess_exec(
        "node",
        str(script),
        url,
        thread,
        message,
        cwd=cache,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    parsed: dict[str, Any] = json.loads(out)
    assert "error" not in parsed, f"the client rejected the run: {parsed['error']}"
    return parsed


async def test_the_ag_ui_client_runs_a_tool_and_plan_turn(
    workspace: Path, agui_client: Path
) -> None:
    app = make_app([Keeper], runtime=demo_like(), workspace=workspace)
    async with serve(app) as base:
        got = await run_client(agui_client, f"{base}{KEEPER}/ag-ui", "thread-node", "go")
    kinds = [event["type"] for event in got["events"]]
    assert kinds[0] == "RUN_STARTED"
    assert kinds[-1] == "RUN_FINISHED"
    assert kinds.count("TOOL_CALL_START") == kinds.count("TOOL_CALL_END") == 3
    assert kinds.count("TOOL_CALL_RESULT") == 3
    assert kinds.count("STATE_SNAPSHOT") == 1
    assert kinds.count("STATE_DELTA") == 1
    assert kinds.index("TEXT_MESSAGE_START") < kinds.index("TEXT_MESSAGE_END")
    assert got["result"] == "All done."
    # The client applied the snapshot and the JSON Patch delta to its own state.
    assert got["state"]["plan"]["steps"] == [{"content": "Write it", "status": "completed"}]
    assert got["state"]["plan"]["conversationId"] == "thread-node"
    # ... and rebuilt the transcript: tool calls with their results, then the answer.
    roles = [message["role"] for message in got["messages"]]
    assert roles[0] == "user"
    assert roles.count("tool") == 3
    assistant = [m for m in got["messages"] if m["role"] == "assistant"]
    calls = [call["function"]["name"] for m in assistant for call in m.get("toolCalls", [])]
    assert calls == ["write_todos", "write_file", "write_todos"]
    assert assistant[-1]["content"] == "All done."


async def test_the_ag_ui_client_follows_subagents_and_custom_events(
    workspace: Path, agui_client: Path
) -> None:
    app = make_app([Speaker], runtime=demo_like(), workspace=workspace)
    async with serve(app) as base:
        got = await run_client(agui_client, f"{base}/atmosphere/speaker/ag-ui", "t-sub", "go")
    kinds = [event["type"] for event in got["events"]]
    assert kinds.count("SUBAGENT_STARTED") == 3
    assert kinds.count("SUBAGENT_FINISHED") + kinds.count("SUBAGENT_ERROR") == 3
    assert "CUSTOM" in kinds
    assert got["state"]["subagentPlans"]["sub-1"]["steps"][0]["content"] == "Search"


async def test_the_ag_ui_client_sees_a_failed_run_end_with_run_error(
    workspace: Path, agui_client: Path
) -> None:
    app = make_app([Keeper], runtime=ScriptedRuntime([]), workspace=workspace)
    async with serve(app) as base:
        got = await run_client(agui_client, f"{base}{KEEPER}/ag-ui", "t-fail", "go")
    kinds = [event["type"] for event in got["events"]]
    assert kinds == ["RUN_STARTED", "RUN_ERROR"]
    assert got["events"][-1]["code"] == "ScriptExhausted"
    assert "no turn 1" in got["events"][-1]["message"]
    # The client's verifier accepted the sequence (a violation would reject the run), it added
    # nothing to the transcript, and it reports no result.
    assert got["messages"] == [{"id": "user-1", "role": "user", "content": "go"}]
    assert "result" not in got
