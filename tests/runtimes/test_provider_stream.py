"""The SSE reader and the history repair every provider adapter shares."""

from __future__ import annotations

import httpx2
import pytest

from atmosphere_harness import Message, ToolCall
from atmosphere_harness._errors import ModelError
from atmosphere_harness._runtimes.provider import (
    MISSING_RESULT,
    paired,
    parse_arguments,
    sse_events,
)


async def events_of(body: bytes) -> list[dict]:
    response = httpx2.Response(200, stream=httpx2.ByteStream(body))
    return [event async for event in sse_events(response)]


async def test_data_lines_comments_and_event_names() -> None:
    body = (
        b": keep-alive\n\n"
        b'event: message_start\ndata: {"type": "a"}\n\n'
        b'data:{"type":"b"}\r\n\r\n'
        b'data: {"type":\n'
        b'data:  "c"}\n\n'
        b"data: [DONE]\n\n"
        b'data: {"type": "after-done"}\n\n'
    )
    assert await events_of(body) == [{"type": "a"}, {"type": "b"}, {"type": "c"}]


async def test_a_last_event_without_its_blank_line_still_counts() -> None:
    assert await events_of(b'data: {"n": 1}\n\ndata: {"n": 2}') == [{"n": 1}, {"n": 2}]


@pytest.mark.parametrize("body", [b"data: not json\n\n", b"data: [1, 2]\n\n"])
async def test_garbage_is_a_model_error(body: bytes) -> None:
    with pytest.raises(ModelError, match="the model server sent"):
        await events_of(body)


def test_paired_keeps_a_good_history_unchanged() -> None:
    call = ToolCall("add", {"a": 1}, "c1")
    history = [Message.user("x"), Message.assistant("", [call]), Message.tool(call, "1")]
    assert paired(history) == history


def test_paired_repairs_orphans_duplicates_and_missing_results() -> None:
    a, b = ToolCall("add", {}, "a"), ToolCall("add", {}, "b")
    history = [
        Message.tool(ToolCall("x", {}, "ghost"), "orphan"),
        Message.user("go"),
        Message.assistant("", [a, b]),
        Message.tool(a, "1"),
        Message.tool(a, "1 again"),
        Message.user("next"),
    ]
    repaired = paired(history)
    assert [(m.role, m.tool_call_id, m.content) for m in repaired] == [
        ("user", None, "go"),
        ("assistant", None, ""),
        ("tool", "a", "1"),
        ("tool", "b", MISSING_RESULT),
        ("user", None, "next"),
    ]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("", {}), ("  ", {}), ('{"a": 1}', {"a": 1}), ('{"a": ', '{"a": '), ("[1]", "[1]")],
)
def test_parse_arguments(text: str, parsed: object) -> None:
    assert parse_arguments(text) == parsed
