"""An MCP server's tools as ordinary harness `Tool`s.

Each MCP tool becomes a `Tool` with the server's JSON schema as given, so a call goes the one
path every tool goes (`kernel.executor`): argument bounds and validation, governance admission,
approvals, the tool deadline (`tool_execution_timeout`), tool-output offload, frames. Annotations
map to `ToolKind`: `destructiveHint: true` is `DELETE` (an approval policy that gates deletes gates
it), `readOnlyHint: true` is `READ`, anything else `OTHER`.

Results: the text blocks of the result, joined by newlines, exactly as the server sent them;
other blocks are described in one line each (`[image: image/png, 1234 bytes base64]`); with no
content, the structured content as JSON. A result the server flags `isError` and a protocol
error come back as the executor's `tool_error` shape, naming the server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._errors import MCPServerError
from .._tools.base import Tool, ToolContext, ToolKind
from .._tools.results import json_result
from .connection import MCPConnection, describe

if TYPE_CHECKING:
    import mcp_types

ORIGIN_PREFIX = "mcp:"
"""`Tool.origin` of an MCP tool: `mcp:<server>` (the console shows it on the tool's card)."""
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


def origin(server: str) -> str:
    return ORIGIN_PREFIX + server


def server_of(tool: Tool) -> str | None:
    """The MCP server a tool came from, or `None` for any other tool."""
    return tool.origin[len(ORIGIN_PREFIX) :] if tool.origin.startswith(ORIGIN_PREFIX) else None


def valid_name(name: str) -> bool:
    """Model APIs accept `^[A-Za-z0-9_-]{1,64}$` (and the harness starts names with a letter)."""
    return bool(_NAME.match(name))


def kind_of(tool: mcp_types.Tool) -> ToolKind:
    hints = tool.annotations
    if hints is None:
        return ToolKind.OTHER
    if hints.destructive_hint is True:
        return ToolKind.DELETE
    if hints.read_only_hint is True:
        return ToolKind.READ
    return ToolKind.OTHER


def idempotent(tool: mcp_types.Tool) -> bool:
    """Whether a durable run may call `tool` again after a restart cut a call off: only when
    the server says so (`idempotentHint` or `readOnlyHint`); any other MCP call has effects
    outside the harness, so, like a user tool, it runs at most once."""
    hints = tool.annotations
    return hints is not None and (hints.idempotent_hint is True or hints.read_only_hint is True)


def schema_of(tool: mcp_types.Tool) -> dict[str, Any]:
    schema = dict(tool.input_schema or {})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


def as_tool(connection: MCPConnection, remote: mcp_types.Tool, name: str) -> Tool:
    """The harness `Tool` for `remote` on `connection`, offered to the model as `name`."""
    remote_name = remote.name

    async def handler(arguments: Mapping[str, Any], context: ToolContext) -> str:
        from mcp.shared.exceptions import MCPError

        try:
            result = await connection.call(remote_name, dict(arguments))
        except MCPServerError as exc:
            return _error(name, connection.name, str(exc))
        except MCPError as exc:
            return _error(name, connection.name, f"the server refused the call: {exc}")
        except Exception as exc:
            return _error(name, connection.name, f"the call failed: {describe(exc)}")
        text = render(result)
        if result.is_error:
            return _error(name, connection.name, text or "the tool reported an error")
        return text

    description = remote.description or remote.title or remote.name
    return Tool(
        name=name,
        description=description,
        parameters=schema_of(remote),
        handler=handler,
        kind=kind_of(remote),
        origin=origin(connection.name),
        idempotent=idempotent(remote),
    )


def render(result: mcp_types.CallToolResult) -> str:
    """The model-facing text of an MCP tool result (see the module docstring)."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(str(getattr(block, "text", "")))
        elif kind in ("image", "audio"):
            data = str(getattr(block, "data", ""))
            mime = getattr(block, "mime_type", "") or "unknown"
            parts.append(f"[{kind}: {mime}, {len(data)} bytes base64]")
        elif kind == "resource_link":
            parts.append(f"[resource: {getattr(block, 'uri', '')}]")
        elif kind == "resource":
            resource = getattr(block, "resource", None)
            text = getattr(resource, "text", None)
            uri = getattr(resource, "uri", "")
            parts.append(str(text) if isinstance(text, str) else f"[resource: {uri}]")
        else:
            parts.append(f"[{kind or 'content'}]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _error(tool: str, server: str, message: str) -> str:
    return json_result(error="tool_error", tool=tool, server=server, message=message)
