"""The SSE reader and the history repair every provider adapter shares."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx2
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

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


class Pieces(httpx2.AsyncByteStream):
    """A response body arriving in the given pieces."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self.pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece


async def ours(pieces: Sequence[bytes]) -> list[Any]:
    response = httpx2.Response(200, stream=Pieces(pieces))
    return [event async for event in sse_events(response)]


async def the_sdks(pieces: Sequence[bytes]) -> list[Any]:
    """The payloads the `openai` SDK's own SSE decoder reads from the same pieces, up to
    `[DONE]` (what its `AsyncStream` would parse)."""

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    found = []
    async for event in SSEDecoder().aiter_bytes(body()):
        if event.data.startswith("[DONE]"):
            break
        if event.data:
            found.append(json.loads(event.data))
    return found


# Text a model streams, with what a line reader of `str` would break at (U+2028, U+2029,
# U+0085) and multi-byte characters a piece may cut in two.
TEXT = st.text(st.sampled_from([*'ab é\u2028\u2029\x85\t"\\{}:', "\U0001f600"]), max_size=12)
PAYLOADS = st.lists(st.fixed_dictionaries({"content": TEXT}, optional={"id": TEXT}), max_size=4)


def sse_body(payloads: list[Any], end: str, extras: bool, multiline: bool) -> bytes:
    out = []
    for index, payload in enumerate(payloads):
        if extras:
            out.append(f": keep-alive{end}{end}event: chunk{end}id: {index}{end}")
        text = json.dumps(payload, ensure_ascii=False, indent=1 if multiline else None)
        out += [f"data: {line}{end}" for line in text.split("\n")]
        out.append(end)
    out.append(f"data: [DONE]{end}{end}")
    return "".join(out).encode()


@settings(max_examples=300, deadline=None)
@given(
    payloads=PAYLOADS,
    end=st.sampled_from(["\n", "\r\n", "\r"]),
    extras=st.booleans(),
    multiline=st.booleans(),
    size=st.integers(0, 64),
)
@example(
    payloads=[{"content": "a\u2028b"}, {"content": "\x85"}],
    end="\r\n",
    extras=False,
    multiline=False,
    size=7,
)
def test_events_are_the_ones_the_openai_sdk_decodes(
    payloads: list[Any], end: str, extras: bool, multiline: bool, size: int
) -> None:
    """However the body is cut (`size` 0: an event a piece, as a model streams) and whichever
    line ends it uses, the payloads read are the SDK's: lines end only at CR, LF or CRLF, never
    at a separator inside a JSON string."""
    body = sse_body(payloads, end, extras, multiline)
    if size:
        pieces = [body[start : start + size] for start in range(0, len(body), size)]
    else:
        blank = (end * 2).encode()
        pieces = [piece + blank for piece in body.split(blank)[:-1]]
    read = asyncio.run(ours(pieces))
    assert read == asyncio.run(the_sdks(pieces))
    assert read == payloads


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


@pytest.mark.parametrize(
    "payload",
    [
        b'{"a": "\xed\xa0\x80"}',  # an encoded lone surrogate: json.loads lets it through
        b'{"a": "\\ud83d\\ude00 \xe2\x80\xa8"} \t\r\n',  # escapes, U+2028, JSON whitespace after
        b'{"a": NaN, "b": [1.5e3, true, null]}',
        b'\xef\xbb\xbf{"a": 1}',  # a UTF-8 BOM: json.loads reads past it
        b'{"a": 1} x',  # extra data
        b'{"a": 1}{"b": 2}',
        b'{"a": 1}\x0c',  # a form feed is no JSON whitespace
        b'{"a": "\xff"}',  # not UTF-8
        b'{"a": 1',  # cut
    ],
)
async def test_an_event_is_decoded_as_json_loads_decodes_its_bytes(payload: bytes) -> None:
    """The payload is decoded without `json.loads`'s layers (one event a token) but accepts
    exactly what `json.loads(bytes)` accepts, with the same result; what it rejects is a
    `ModelError` (pins the behaviour of the cheaper path)."""
    try:
        expected: Any = json.loads(payload)
    except ValueError:
        expected = ModelError
    body = b"data: " + payload + b"\n\n"
    if expected is ModelError:
        with pytest.raises(ModelError, match="malformed JSON"):
            await events_of(body)
    else:
        assert await events_of(body) == [expected]
