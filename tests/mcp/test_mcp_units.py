"""The declarations and the result rendering, without a server."""

from __future__ import annotations

import mcp_types
import pytest

from atmosphere_harness import MCPServerHTTP, MCPServerStdio, ToolKind
from atmosphere_harness._mcp.tools import idempotent, kind_of, render


@pytest.mark.parametrize(
    ("server", "name"),
    [
        (MCPServerStdio("python", ["-m", "weather.server"]), "weather.server"),
        (MCPServerStdio("python", ["tools/my_server.py"]), "my_server"),
        (MCPServerStdio("npx", ["-y", "@modelcontextprotocol/server-github"]), "server-github"),
        (MCPServerStdio("/usr/local/bin/mcp-fetch"), "mcp-fetch"),
        (MCPServerStdio("uvx", ["mcp-server-time"], prefix="time_"), "time"),
        (MCPServerHTTP("https://user:secret@tools.example.com/mcp?k=v"), "tools.example.com"),
        (MCPServerHTTP("http://127.0.0.1:8123/mcp"), "127.0.0.1:8123"),
    ],
)
def test_servers_are_named_for_truth_without_secrets(server: object, name: str) -> None:
    assert server.name == name  # type: ignore[attr-defined]


def test_bad_declarations_are_refused_early() -> None:
    with pytest.raises(ValueError, match="needs a command"):
        MCPServerStdio(" ")
    with pytest.raises(TypeError, match="not one string"):
        MCPServerStdio("python", "-m x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid MCP tool prefix"):
        MCPServerStdio("python", prefix="has space")
    with pytest.raises(ValueError, match="needs an http"):
        MCPServerHTTP("ftp://example.com")


def _tool(**hints: bool) -> mcp_types.Tool:
    annotations = mcp_types.ToolAnnotations(**hints) if hints else None
    return mcp_types.Tool(name="t", input_schema={"type": "object"}, annotations=annotations)


def test_annotations_map_to_tool_kinds() -> None:
    assert kind_of(_tool(destructive_hint=True)) is ToolKind.DELETE
    assert kind_of(_tool(read_only_hint=True)) is ToolKind.READ
    assert kind_of(_tool(destructive_hint=False)) is ToolKind.OTHER
    assert kind_of(_tool()) is ToolKind.OTHER, "an unannotated tool is not assumed destructive"


def test_only_annotated_mcp_tools_may_run_again_after_a_restart() -> None:
    # Durable runs answer an MCP call a restart cut off `interrupted` unless the server says a
    # second call is harmless.
    assert idempotent(_tool(idempotent_hint=True))
    assert idempotent(_tool(read_only_hint=True))
    assert not idempotent(_tool(destructive_hint=True))
    assert not idempotent(_tool()), "an unannotated tool runs at most once"


def test_results_render_text_exactly_and_describe_the_rest() -> None:
    result = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(text="  first\n"),
            mcp_types.ImageContent(data="aGVsbG8=", mime_type="image/png"),
            mcp_types.TextContent(text="second"),
        ]
    )
    assert render(result) == "  first\n\n[image: image/png, 8 bytes base64]\nsecond"
    structured = mcp_types.CallToolResult(content=[], structured_content={"temp": 21.5})
    assert render(structured) == '{"temp": 21.5}'
