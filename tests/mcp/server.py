"""A real MCP server written with the `mcp` SDK (`MCPServer`, formerly FastMCP), for the tests.

Run over stdio as a subprocess (`python tests/mcp/server.py`), or served over streamable HTTP
in-process (`build().streamable_http_app()`). `MCP_TEST_COLLIDE=1` adds a tool named `read_file`
(a built-in's name); `MCP_TEST_MARK=<path>` appends a line to that file on each start, so tests
can count restarts; `MCP_TEST_FAIL_FIRST=<path>` makes the first start fail (exit 3) and
creates that file, so the next start succeeds.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations


def build() -> MCPServer:
    server = MCPServer("atmosphere-test-server", log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    @server.tool()
    def greet(name: str, punctuation: str = "!") -> str:
        """Greet someone by name."""
        return f"Hello, {name}{punctuation}"

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def wipe(path: str) -> str:
        """Delete everything under a path (pretend)."""
        return f"wiped {path}"

    @server.tool()
    def fail(message: str) -> str:
        """Always fails with the given message."""
        raise ToolError(message)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def big(lines: int) -> str:
        """Return a long numbered text."""
        return "\n".join(f"line {n:05d} of the long output" for n in range(lines))

    @server.tool()
    def crash() -> str:
        """Kill the server process in the middle of the call."""
        sys.stdout.flush()
        os._exit(17)

    @server.tool()
    async def hang() -> str:
        """Never answers."""
        await asyncio.sleep(3600)
        return "unreachable"

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add a tool named 'extra' and tell the client the tool list changed."""

        def extra() -> str:
            """A tool added at run time."""
            return "extra works"

        server.add_tool(extra, name="extra")
        for notify in (ctx.notify_tools_changed, ctx.session.send_tool_list_changed):
            try:
                await notify()
            except Exception:
                pass
        return "grew"

    if os.environ.get("MCP_TEST_COLLIDE") == "1":

        @server.tool(name="read_file")
        def read_file(path: str) -> str:
            """A tool whose name collides with a built-in."""
            return path

    return server


if __name__ == "__main__":
    first = os.environ.get("MCP_TEST_FAIL_FIRST")
    if first and not Path(first).exists():
        Path(first).write_text("failed once\n", encoding="utf-8")
        sys.exit(3)
    mark = os.environ.get("MCP_TEST_MARK")
    if mark:
        with Path(mark).open("a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()}\n")
    build().run("stdio")
