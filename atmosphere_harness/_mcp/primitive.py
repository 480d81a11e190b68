"""`MCPPrimitive`: MCP tool servers declared with `mcp_servers=` on the decorators.

`start()` opens one session per declared server (an instance shared by several agents is one
session) and lists its tools; `stop()` closes them. `attach()` offers each server's tools to the
endpoints that declared it, as ordinary `Tool`s (`mcp.tools`), under their own names or with the
server's `prefix=`. A name that collides with a tool the endpoint already has (a built-in or the
agent's own) or with another server's fails start-up with a message naming both; this primitive
attaches last, so every built-in is known.

Before each model request of an endpoint it refreshes a tool list the server said changed, and
when a server is down it starts it again in the background (at most every `RETRY_SECONDS`), so a
server that failed at start-up offers its tools from the request after it comes back. A call to
a down server restarts it first (`MCPConnection.call`).

Per-endpoint truth `mcp`: `{"<server>": "ACTIVE(<n> tools)" | "INACTIVE(<reason>)"}`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence

from .._contracts import Endpoint, Host, Primitive, Run
from .._log import get_logger
from .._preset import MCP
from .._runtimes.base import Message, ModelRequest
from .._tools.base import Tool
from .connection import INSTALL_HINT, MCPConnection, sdk_available
from .servers import MCPServerHTTP, MCPServerStdio
from .tools import as_tool, server_of, valid_name

log = get_logger(__name__)

RETRY_SECONDS = 5.0
"""How often a request may trigger a new start of a server that is down."""


class MCPPrimitive(Primitive):
    name = "mcp"

    def __init__(self) -> None:
        self.connections: dict[int, MCPConnection] = {}
        self._host: Host | None = None

    async def start(self, host: Host) -> None:
        self._host = host
        names: set[str] = set()
        connect_timeout = host.settings.groups.mcp.connect_timeout
        for spec in host.specs:
            if spec.headless:
                continue  # no prompt loop, so nothing would ever call its tools
            for server in spec.mcp_servers:
                if not isinstance(server, MCPServerStdio | MCPServerHTTP):
                    raise TypeError(
                        f"{spec.cls.__name__}: mcp_servers entries must be MCPServerStdio or "
                        f"MCPServerHTTP, got {server!r}"
                    )
                if id(server) in self.connections:
                    continue
                name = _unique(server.name, names)
                names.add(name)
                self.connections[id(server)] = MCPConnection(
                    server, name, connect_timeout=connect_timeout
                )
        if not self.connections:
            return
        if not sdk_available():
            raise RuntimeError(INSTALL_HINT)
        await asyncio.gather(*(connection.start() for connection in self.connections.values()))

    async def stop(self, host: Host) -> None:
        await asyncio.gather(
            *(connection.close() for connection in self.connections.values()),
            return_exceptions=True,
        )

    def attach(self, endpoint: Endpoint, host: Host) -> None:
        spec = endpoint.spec
        if spec is None or not spec.mcp_servers:
            return
        connections = [self.connections[id(server)] for server in spec.mcp_servers]
        binding = _Binding(endpoint, connections, host)
        binding.sync(strict=True)
        for connection in connections:
            connection.on_change.append(binding.changed)
        endpoint.interceptors.append(binding)


class _Binding:
    """One endpoint's MCP servers: keeps its tools and truth in step with them."""

    def __init__(self, endpoint: Endpoint, connections: Sequence[MCPConnection], host: Host):
        self.endpoint = endpoint
        self.connections = list(connections)
        self.host = host
        self._retry_at: dict[str, float] = {}

    def changed(self, connection: MCPConnection) -> None:
        self.sync(strict=False)

    def sync(self, *, strict: bool) -> None:
        """Offer exactly the servers' current tools; at start-up (`strict`) a collision raises."""
        endpoint = self.endpoint
        ours = {connection.name for connection in self.connections}
        wanted: dict[str, Tool] = {}
        for connection in self.connections:
            prefix = connection.server.prefix or ""
            for remote in connection.tools:
                name = prefix + remote.name
                problem = self._problem(name, connection, wanted, ours)
                if problem is not None:
                    if strict:
                        raise ValueError(problem)
                    log.warning(problem)
                    continue
                wanted[name] = as_tool(connection, remote, name)
        for name, tool in list(endpoint.tools.items()):
            if server_of(tool) in ours and name not in wanted:
                del endpoint.tools[name]
        endpoint.tools.update(wanted)
        endpoint.report_detail(
            MCP, {connection.name: connection.state() for connection in self.connections}
        )

    def _problem(
        self, name: str, connection: MCPConnection, wanted: dict[str, Tool], ours: set[str]
    ) -> str | None:
        where = f"on {self.endpoint.path}"
        if not valid_name(name):
            return (
                f"MCP server '{connection.name}' offers a tool named {name!r}, which is not a "
                f"valid tool name (letters, digits, '_' or '-', at most 64) {where}; it is skipped"
            )
        other = wanted.get(name)
        if other is not None:
            return (
                f"MCP server '{connection.name}' offers a tool named '{name}', which collides "
                f"with the tool '{name}' of MCP server '{server_of(other)}' {where}; pass "
                "prefix= to one of them (e.g. prefix='gh_')"
            )
        existing = self.endpoint.tools.get(name)
        if existing is not None and server_of(existing) not in ours:
            owner = (
                "the agent's own tool"
                if existing.origin == "user"
                else f"the built-in tool ({existing.origin})"
            )
            return (
                f"MCP server '{connection.name}' offers a tool named '{name}', which collides "
                f"with {owner} '{name}' {where}; pass prefix= to the server (e.g. "
                f"{type(connection.server).__name__}(..., prefix='{_suggest(connection.name)}'))"
            )
        return None

    # --- RunInterceptor ------------------------------------------------------------------------

    async def before_request(self, run: Run, request: ModelRequest) -> ModelRequest:
        refreshed = False
        for connection in self.connections:
            if connection.stale:
                await connection.refresh()
                refreshed = True
            elif not connection.alive:
                self._restart_soon(connection)
        if refreshed:
            return dataclasses.replace(request, tools=self.endpoint.tool_specs())
        return request

    async def after_turn(self, run: Run, messages: Sequence[Message]) -> None:
        return None

    def _restart_soon(self, connection: MCPConnection) -> None:
        now = time.monotonic()
        if now < self._retry_at.get(connection.name, 0.0):
            return
        self._retry_at[connection.name] = now + RETRY_SECONDS
        self.host.spawn(connection.start(), name=f"mcp-restart:{connection.name}")


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    index = 2
    while f"{name}-{index}" in taken:
        index += 1
    return f"{name}-{index}"


def _suggest(name: str) -> str:
    cleaned = "".join(char if char.isalnum() else "_" for char in name).strip("_") or "mcp"
    return (cleaned if cleaned[0].isalpha() else "m" + cleaned)[:24] + "_"
