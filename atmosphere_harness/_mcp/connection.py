"""`MCPConnection`: one long-lived session with one MCP server, shared by every request.

The session is opened by the primitive's `start()` and closed by its `stop()`, never per
request. The SDK's client runs anyio task groups whose scopes must be entered and left by the
same task, so each session lives in an *owner task* of its own: it connects, lists the tools,
then waits to be told to close. Requests from any task call through the live client.

Failure handling, so a server never takes a run down:

- a server that fails to start (spawn error, handshake error, no answer within the connect
  timeout) leaves the connection down with `error` saying why;
- a call that finds the connection closed (the process died, the HTTP server went away) marks it
  down and is answered with that reason; the *next* call restarts the server first;
- a call cut off by the tool deadline (a hung server) marks the connection suspect: the next call
  checks it first (a `tools/list` within `PING_TIMEOUT`) and restarts it if that fails;
- `tools/list_changed` (a notification on handshake-era connections, a `subscriptions/listen`
  event on 2026-07-28 ones) marks the tool list stale; `refresh()` lists it again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from .._errors import MCPServerError
from .._log import get_logger
from .servers import MCPServer, MCPServerHTTP

if TYPE_CHECKING:
    import mcp_types
    from mcp import Client

log = get_logger(__name__)

CLOSE_TIMEOUT = 10.0
"""Seconds a session gets to wind down (the SDK stops a stdio server within this too)."""
PING_TIMEOUT = 5.0
"""Seconds the health check of a suspect server may take."""
MAX_TOOL_PAGES = 100
"""`tools/list` pages read at most (a paginator that never ends cannot hang start-up)."""
INSTALL_HINT = "MCP servers need the MCP SDK: pip install 'atmosphere-harness[mcp]'"


def describe(exc: BaseException) -> str:
    """A one-line reason, unwrapping anyio's exception groups to their first leaf."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def sdk_available() -> bool:
    try:
        import mcp  # noqa: F401
    except ImportError:
        return False
    return True


class MCPConnection:
    """The shared session with one server (see the module docstring)."""

    def __init__(self, server: MCPServer, name: str, *, connect_timeout: float) -> None:
        self.server = server
        self.name = name
        self.connect_timeout = connect_timeout
        self.tools: list[mcp_types.Tool] = []
        """The server's tools as last listed (kept while it is down, for truth and sync)."""
        self.error: str | None = None
        """Why the server is down, or `None`."""
        self.stale = False
        self.suspect = False
        self.starts = 0
        """Sessions opened so far (1 after start-up; each restart adds one)."""
        self.on_change: list[Callable[[MCPConnection], None]] = []
        """Called after the tool list (or the up/down state) changed."""
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    # --- state ------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._client is not None and self._task is not None and not self._task.done()

    def state(self) -> str:
        """Runtime truth: `ACTIVE(<n> tools)` or `INACTIVE(<reason>)`."""
        if self.alive:
            return f"ACTIVE({len(self.tools)} tools)"
        return f"INACTIVE({self.error or 'not started'})"

    def _changed(self) -> None:
        for listener in list(self.on_change):
            try:
                listener(self)
            except Exception:
                log.exception("MCP tool-list listener failed", server=self.name)

    def _down(self, reason: str) -> None:
        if self.error is None or self.alive:
            log.warning("MCP server unavailable", server=self.name, reason=reason)
        self.error = reason
        self._client = None
        self._stop.set()
        self._changed()

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> bool:
        """Open the session unless it is up; `False` (with `error` set) when it fails."""
        async with self._lock:
            if self.alive:
                return True
            await self._close()
            return await self._open()

    async def close(self) -> None:
        async with self._lock:
            await self._close()

    async def _open(self) -> bool:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._stop = asyncio.Event()
        self.starts += 1
        self._task = asyncio.create_task(self._own(ready), name=f"mcp-session:{self.name}")
        try:
            async with asyncio.timeout(self.connect_timeout):
                await asyncio.shield(ready)
        except TimeoutError:
            ready.cancel()  # nobody waits for it any more
            await self._close(graceful=False)  # it is mid-handshake: nothing to wind down
            seconds = _seconds(self.connect_timeout)
            self._down(f"no answer within {seconds}s while starting")
            return False
        except Exception as exc:
            await self._close()
            self._down(f"failed to start: {describe(exc)}")
            return False
        self.error = None
        self.suspect = False
        log.info("MCP server started", server=self.name, tools=[tool.name for tool in self.tools])
        self._changed()
        return True

    async def _close(self, *, graceful: bool = True) -> None:
        task, self._task = self._task, None
        self._client = None
        if task is None:
            return
        self._stop.set()
        if not graceful:
            task.cancel()
        elif not task.done():
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await asyncio.shield(task)
            except TimeoutError:
                task.cancel()
        with contextlib.suppress(BaseException):
            await task

    async def _own(self, ready: asyncio.Future[None]) -> None:
        """The owner task: enter the SDK client, list tools, wait for the stop signal."""
        try:
            async with self._connect() as client:
                self.tools = await self._list(client)
                self.stale = False
                self._client = client
                listener = asyncio.create_task(self._listen(client))
                if not ready.done():
                    ready.set_result(None)
                try:
                    await self._stop.wait()
                finally:
                    listener.cancel()
                    with contextlib.suppress(BaseException):
                        await listener
        except asyncio.CancelledError:
            if not ready.done():
                ready.set_exception(MCPServerError("cancelled while starting"))
            raise
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else MCPServerError(str(exc)))
            elif self._client is not None:
                self._down(f"the session ended: {describe(exc)}")
        finally:
            self._client = None

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[Client]:
        try:
            from mcp import Client, StdioServerParameters
            from mcp.client.streamable_http import streamable_http_client
        except ImportError as exc:  # pragma: no cover - the extra is in `dev`
            raise MCPServerError(INSTALL_HINT) from exc
        import httpx2

        server = self.server
        async with contextlib.AsyncExitStack() as stack:
            if isinstance(server, MCPServerHTTP):
                http = await stack.enter_async_context(
                    httpx2.AsyncClient(
                        headers=server.headers,
                        timeout=httpx2.Timeout(30.0, read=300.0),
                    )
                )
                target: Any = streamable_http_client(server.url, http_client=http)
            else:
                target = StdioServerParameters(
                    command=server.command, args=list(server.args), env=server.env
                )
            client = Client(target, message_handler=self._message, cache=None)
            yield await stack.enter_async_context(client)

    async def _message(self, message: Any) -> None:
        """Handshake-era notifications: `tools/list_changed` marks the list stale."""
        import mcp_types

        if isinstance(message, mcp_types.ToolListChangedNotification):
            self.stale = True
            log.info("MCP server's tool list changed", server=self.name)

    async def _listen(self, client: Client) -> None:
        """2026-07-28 connections: the `subscriptions/listen` stream of list changes."""
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        capabilities = client.server_capabilities.tools
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS or capabilities is None:
            return
        try:
            async with client.listen(tools_list_changed=True) as events:
                async for _event in events:
                    self.stale = True
                    log.info("MCP server's tool list changed", server=self.name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("MCP server offers no change stream", server=self.name, reason=describe(exc))

    @staticmethod
    async def _list(client: Client) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    # --- use --------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """List the tools again if the server said they changed (quietly keeps the old list
        when it cannot)."""
        client = self._client
        if not self.stale or client is None:
            return
        self.stale = False
        try:
            async with asyncio.timeout(self.connect_timeout):
                self.tools = await self._list(client)
        except Exception as exc:
            log.warning(
                "could not list the MCP server's tools again", server=self.name, error=describe(exc)
            )
            return
        self._changed()

    async def call(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        """Call `name`; restarts a dead (or failed-ping) server first. `MCPServerError` when
        the server is unavailable; other errors are the server's own answers."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        client = self._client
        if client is not None and self.suspect and self.alive:
            # A health check that every protocol revision has (`ping` is gone in 2026-07-28).
            self.suspect = False
            try:
                async with asyncio.timeout(min(PING_TIMEOUT, self.connect_timeout)):
                    await self._list(client)
            except Exception as exc:
                self._down(f"it stopped answering ({describe(exc)})")
        if not self.alive and not await self.start():
            raise MCPServerError(f"MCP server '{self.name}' is unavailable: {self.error}")
        client = self._client
        if client is None:
            raise MCPServerError(f"MCP server '{self.name}' is unavailable: {self.error}")
        try:
            return await client.call_tool(name, arguments)
        except asyncio.CancelledError:
            self.suspect = True  # the deadline (or the run) cut the call off
            raise
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise
            self._down("the connection closed (the server exited or went away)")
        except Exception as exc:
            self._down(f"the connection failed ({describe(exc)})")
        raise MCPServerError(
            f"MCP server '{self.name}' is unavailable: {self.error}. It will be restarted on "
            "the next call."
        )


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
