"""The tool decorator's schema, argument validation and the scripted runtime, without HTTP."""

from __future__ import annotations

import pytest

from atmosphere_harness import ModelRequest, ScriptedRuntime, ToolCall, ToolContext, ToolKind, tool
from atmosphere_harness._errors import ScriptExhausted
from atmosphere_harness._runtimes.base import Message, ToolSpec
from atmosphere_harness._runtimes.scripted import demo_turn
from atmosphere_harness._tools.base import build_tool, render_result
from atmosphere_harness._tools.validation import validate_arguments


@tool(name="search_notes", kind=ToolKind.READ, requires_approval=True)
async def search(query: str, limit: int = 5, context: ToolContext | None = None) -> list[str]:
    """Search the user's notes.

    Longer explanation that is not part of the summary.

    Args:
        query: Words to look for.
        limit: At most this many hits,
            counted after de-duplication.

    Returns:
        Matching note titles.
    """
    return [query] * limit


def test_schema_comes_from_signature_and_docstring() -> None:
    built = build_tool(search)
    assert built.name == "search_notes"
    assert built.kind is ToolKind.READ
    assert built.requires_approval
    assert built.description == "Search the user's notes."
    assert built.parameters == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "query": {"type": "string", "description": "Words to look for."},
            "limit": {
                "type": "integer",
                "default": 5,
                "description": "At most this many hits, counted after de-duplication.",
            },
        },
        "required": ["query"],
    }


def test_decorated_function_stays_callable() -> None:
    import asyncio

    assert asyncio.run(search("x", 2)) == ["x", "x"]


def test_invalid_tool_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="invalid tool name"):
        tool(name="has space")


@pytest.mark.parametrize(
    ("arguments", "coerced", "problems"),
    [
        (
            {"n": "3", "items": "[1, 2]", "flag": "true"},
            {"n": 3, "items": [1, 2], "flag": True},
            [],
        ),
        ({"n": 3.0, "items": [], "flag": False}, {"n": 3, "items": [], "flag": False}, []),
        (
            {"n": True, "items": [], "flag": False},
            None,
            ["parameter 'n' must be integer, got boolean"],
        ),
        (
            {"items": "not json"},
            None,
            [
                "missing required parameter 'n'",
                "parameter 'items' must be array, got string",
            ],
        ),
        ({"n": None, "items": []}, None, ["missing required parameter 'n'"]),
        ({"n": 1, "items": [], "extra": 1}, None, ["unexpected parameter 'extra'"]),
        (
            {"n": 1, "items": [], "mode": "z"},
            None,
            ['parameter \'mode\' must be one of ["a", "b"]'],
        ),
        ([1, 2], None, ["arguments must be a JSON object, got array"]),
    ],
)
def test_validate_arguments(arguments, coerced, problems) -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "n": {"type": "integer"},
            "items": {"type": "array"},
            "flag": {"type": "boolean"},
            "mode": {"type": "string", "enum": ["a", "b"]},
        },
        "required": ["n"],
    }
    result, found = validate_arguments(schema, arguments)
    assert found == problems
    if coerced is not None:
        assert result == coerced


def test_render_result() -> None:
    assert render_result("text") == "text"
    assert render_result(None) == ""
    assert render_result({"é": [1, 2]}) == '{"é": [1, 2]}'


def _request(conversation: str, text: str = "hi", tools: tuple[str, ...] = ()) -> ModelRequest:
    return ModelRequest(
        system_prompt="s",
        messages=(Message.user(text),),
        tools=tuple(ToolSpec(name, "", {}) for name in tools),
        conversation_id=conversation,
    )


async def test_scripted_turns_are_consumed_per_conversation() -> None:
    runtime = ScriptedRuntime(["first", [ToolCall("t", {"x": 1})]])
    assert (await runtime.complete(_request("a"))).text == "first"
    assert (await runtime.complete(_request("b"))).text == "first"
    second = await runtime.complete(_request("a"))
    assert second.tool_calls[0].name == "t"
    assert second.tool_calls[0].arguments == {"x": 1}
    with pytest.raises(ScriptExhausted):
        await runtime.complete(_request("a"))


async def test_scripted_callable_and_async_turns_and_streaming() -> None:
    async def later(request: ModelRequest) -> str:
        return "async " + request.messages[-1].content

    runtime = ScriptedRuntime([lambda request: "sync " + request.conversation_id, later])
    chunks: list[str] = []

    async def sink(chunk: str) -> None:
        chunks.append(chunk)

    assert (await runtime.complete(_request("c"), on_text=sink)).text == "sync c"
    assert "".join(chunks) == "sync c"
    assert len(chunks) == 2
    assert (await runtime.complete(_request("c", "hey"))).text == "async hey"


def test_demo_echoes_and_plans_when_tools_exist() -> None:
    assert demo_turn(_request("x", "hello there")) == "You said: hello there"
    planned = demo_turn(
        _request(
            "x", "plan a short task and save the result to a file", ("write_todos", "write_file")
        )
    )
    assert isinstance(planned, list)
    assert planned[0].name == "write_todos"
    todos = planned[0].arguments["todos"]
    assert [t["status"] for t in todos] == ["in_progress", "pending", "pending"]
    without_tools = demo_turn(_request("x", "plan a short task and save the result to a file"))
    assert without_tools.startswith("You said:")
