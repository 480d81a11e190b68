"""Helpers for the MCP tests: the test server as a subprocess or over HTTP, and a model that
asks for tool calls then quotes their results."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from atmosphere_harness import (
    MCPServerHTTP,
    MCPServerStdio,
    ModelRequest,
    ScriptedRuntime,
    ToolCall,
)
from tests.mcp.server import build
from tests.support import serve

SERVER = Path(__file__).with_name("server.py")
ROOT = Path(__file__).parents[2]


def stdio_server(*, prefix: str | None = None, **env: str) -> MCPServerStdio:
    """The test server as a subprocess (`env` is added to the SDK's minimal environment)."""
    return MCPServerStdio(
        sys.executable, [str(SERVER)], env={"PYTHONPATH": str(ROOT), **env}, prefix=prefix
    )


@asynccontextmanager
async def http_server(prefix: str | None = None) -> AsyncIterator[MCPServerHTTP]:
    """The test server over streamable HTTP on a free loopback port (a real uvicorn)."""
    app = build().streamable_http_app()
    async with serve(app) as base:  # type: ignore[arg-type]
        yield MCPServerHTTP(f"{base}/mcp", headers={"X-Test": "1"}, prefix=prefix)


def since_user(request: ModelRequest) -> list[Any]:
    last = max(i for i, m in enumerate(request.messages) if m.role == "user")
    return list(request.messages[last + 1 :])


def rounds(*batches: Sequence[ToolCall]) -> ScriptedRuntime:
    """Each model turn asks for the next batch of calls; then the tool results, ' | '-joined."""

    def turn(request: ModelRequest) -> Any:
        after = since_user(request)
        done = sum(1 for m in after if m.role == "assistant")
        if done < len(batches):
            return list(batches[done])
        return " | ".join(m.content for m in after if m.role == "tool")

    return ScriptedRuntime((), default=turn)


def calling(*calls: ToolCall) -> ScriptedRuntime:
    return rounds(calls)


def each_turn(fn: Callable[[ModelRequest], Any]) -> ScriptedRuntime:
    return ScriptedRuntime((), default=fn)
