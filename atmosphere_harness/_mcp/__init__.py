"""MCP tool servers (DESIGN 8.4): `mcp_servers=[MCPServerStdio(...), MCPServerHTTP(...)]` on the
decorators, through the official `mcp` SDK (extra `[mcp]`).

- `servers`: the two declarations (no SDK import, so the package imports without the extra);
- `connection`: one shared, self-healing session per server;
- `tools`: an MCP tool as an ordinary harness `Tool`;
- `primitive`: `MCPPrimitive`, the attach engine.
"""

from .._errors import MCPServerError
from .connection import MCPConnection
from .primitive import MCPPrimitive
from .servers import MCPServerHTTP, MCPServerStdio

__all__ = [
    "MCPConnection",
    "MCPPrimitive",
    "MCPServerError",
    "MCPServerHTTP",
    "MCPServerStdio",
]
