"""`MCPServerStdio` and `MCPServerHTTP`: how an agent names an MCP tool server.

They are plain declarations (no I/O, no SDK import), so `atmosphere_harness` imports without the
`[mcp]` extra; the SDK is imported when the harness starts a server. One instance is one session:
an instance shared by several agents is started once and shared by them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,31}$")


def _check_prefix(prefix: str | None) -> str | None:
    if prefix is None:
        return None
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise ValueError(
            f"invalid MCP tool prefix {prefix!r}: 1-32 letters, digits, '_' or '-', starting "
            "with a letter or '_' (it is prepended to every tool name, e.g. 'gh_')"
        )
    return prefix


def _slug(text: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._:-]+", "-", text).strip("-.:")
    return cleaned[:64] or "mcp"


class MCPServerStdio:
    """An MCP server the harness runs as a subprocess and talks to over stdin/stdout.

    Example:
        ```python
        @agent("coder", mcp_servers=[MCPServerStdio("python", ["-m", "my_tools"], prefix="t_")])
        class Coder: ...
        ```

    `env` is added to a minimal default environment (the SDK's: `PATH`, `HOME`, ...), not to
    this process's whole environment, so secrets are passed on purpose. `prefix` is prepended to
    every tool name the server offers (to avoid a collision with a built-in tool).
    """

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        prefix: str | None = None,
    ) -> None:
        if not isinstance(command, str) or not command.strip():
            raise ValueError("MCPServerStdio needs a command, e.g. MCPServerStdio('python', ...)")
        if isinstance(args, str):
            raise TypeError("MCPServerStdio args must be a sequence of strings, not one string")
        self.command = command
        self.args: tuple[str, ...] = tuple(str(arg) for arg in args)
        self.env: dict[str, str] | None = dict(env) if env is not None else None
        self.prefix = _check_prefix(prefix)

    @property
    def name(self) -> str:
        """What truth and the console call it: the prefix, else the module, script or package
        it runs (`python -m weather` -> `weather`), else the command."""
        if self.prefix:
            return self.prefix.strip("_-") or self.prefix
        args = list(self.args)
        if "-m" in args and args.index("-m") + 1 < len(args):
            return _slug(args[args.index("-m") + 1])
        for arg in args:
            if not arg.startswith("-"):
                base = os.path.basename(arg.rstrip("/")) or arg
                return _slug(re.sub(r"\.(py|js|mjs|ts)$", "", base))
        return _slug(os.path.basename(self.command))

    def __repr__(self) -> str:
        return f"MCPServerStdio({self.command!r}, {list(self.args)!r}, prefix={self.prefix!r})"


class MCPServerHTTP:
    """An MCP server reached over streamable HTTP at `url` (e.g. `http://127.0.0.1:8000/mcp`).

    `headers` go with every request (an `Authorization` bearer token, say); `prefix` as on
    `MCPServerStdio`.
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        prefix: str | None = None,
    ) -> None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"MCPServerHTTP needs an http(s) URL, got {url!r}")
        self.url = url
        self.headers: dict[str, str] = dict(headers or {})
        self.prefix = _check_prefix(prefix)

    @property
    def name(self) -> str:
        """The prefix, else `host:port` (never the URL's credentials or query)."""
        if self.prefix:
            return self.prefix.strip("_-") or self.prefix
        parts = urlsplit(self.url)
        host = parts.hostname or "mcp"
        return _slug(f"{host}:{parts.port}" if parts.port else host)

    def __repr__(self) -> str:
        return f"MCPServerHTTP({self.name!r}, prefix={self.prefix!r})"


MCPServer = MCPServerStdio | MCPServerHTTP
