"""A text frame's SSE event is written around its text: the very bytes `Frame.to_json` gives,
whatever the text holds (quotes, back-slashes, line breaks and separators, a lone surrogate,
non-ASCII), over a real server and for the encoder alone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import ScriptedRuntime, StreamingSession, ai_endpoint, prompt
from atmosphere_harness._events import Frame
from atmosphere_harness._web.sse import frame_bytes
from tests.support import make_app, post_chunks, serve

PACED = "/atmosphere/paced"
FRAMES = 60
TEXTS = (
    "plain",
    'a "quote", a back\\slash, a tab\t and a new\nline',
    "line\u2028separators\u2029and \x85 next line",
    "a lone \ud800 surrogate",
    "non-ASCII: été, 漢字, 🙂",
    "control \x00\x1f and \x7f",
)


@ai_endpoint(PACED)
class Paced:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        for index in range(FRAMES):
            await session.send(f"{TEXTS[index % len(TEXTS)]} {index}")
            await asyncio.sleep(0.002)  # each frame published on its own


def events_of(chunks: list[bytes]) -> list[tuple[bytes, bytes, bytes]]:
    """(id, event, data line) of every SSE event, in order."""
    found = []
    for event in b"".join(chunks).split(b"\r\n\r\n"):
        if not event.startswith(b"id: "):
            continue
        lines = dict(line.split(b": ", 1) for line in event.split(b"\r\n"))
        found.append((lines[b"id"], lines[b"event"], lines[b"data"]))
    return found


async def test_a_paced_stream_writes_each_text_frame_as_to_json_does(workspace: Path) -> None:
    app = make_app([Paced], runtime=ScriptedRuntime(["hi"]), workspace=workspace)
    async with serve(app) as base:
        chunks = await post_chunks(base, PACED)
    events = events_of(chunks)
    texts = [event for event in events if event[1] == b"text"]
    assert len(texts) == FRAMES
    assert events[-1][1] == b"complete"
    for index, (seq, _, data) in enumerate(texts):
        assert b"\n" not in data
        assert b"\r" not in data
        wire = json.loads(data)
        assert wire["data"] == {"text": f"{TEXTS[index % len(TEXTS)]} {index}"}
        # The very bytes `Frame.to_json` gives (one line, line separators escaped).
        frame = Frame("text", wire["data"], wire["sessionId"], wire["conversationId"], wire["seq"])
        assert data == frame.to_json().encode()
        assert int(seq) == wire["seq"]


@pytest.mark.parametrize("text", [*TEXTS, "", "x" * 70_000])
@pytest.mark.parametrize(
    ("session_id", "conversation_id"),
    [("s-1", "c-1"), ("", 'c "\u2028\ud800 é'), ('s\\"\n', "c")],
)
def test_frame_bytes_of_a_text_frame_is_the_generic_encoding(
    text: str, session_id: str, conversation_id: str
) -> None:
    frame = Frame("text", {"text": text}, session_id, conversation_id, 12345)
    expected = f"id: 12345\r\nevent: text\r\ndata: {frame.to_json()}\r\n\r\n".encode()
    assert frame_bytes(frame) == expected


@pytest.mark.parametrize(
    "frame",
    [
        Frame("text", {"text": "a", "role": "assistant"}, "s", "c", 1),  # more than its text
        Frame("text", {"text": 7}, "s", "c", 2),  # not a string
        Frame("tool-start", {"text": "a"}, "s", "c", 3),  # not a text frame
    ],
)
def test_frame_bytes_of_other_frames_is_the_generic_encoding(frame: Frame) -> None:
    expected = f"id: {frame.seq}\r\nevent: {frame.event}\r\ndata: {frame.to_json()}\r\n\r\n"
    assert frame_bytes(frame) == expected.encode()


def test_a_text_subclass_is_encoded_as_json_encodes_it() -> None:
    class Text(str):
        pass

    frame = Frame("text", {"text": Text('a "b"')}, "s", "c", 4)
    data: Any = json.loads(frame_bytes(frame).split(b"data: ", 1)[1])
    assert data["data"] == {"text": 'a "b"'}
    assert frame_bytes(frame).split(b"data: ", 1)[1] == frame.to_json().encode() + b"\r\n\r\n"


def test_an_ascii_text_is_line_safe_without_a_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token in ASCII holds none of the characters `line_safe` escapes: the string's own
    flag says so, and the regular expression is not run (one a token); any other text is
    scanned as before."""
    from atmosphere_harness import _events

    scanned: list[str] = []
    pattern = _events._LINE_UNSAFE

    class Spy:
        def search(self, text: str) -> object:
            scanned.append(text)
            return pattern.search(text)

        def sub(self, *args: Any) -> str:
            return pattern.sub(*args)

    monkeypatch.setattr(_events, "_LINE_UNSAFE", Spy())
    assert _events.line_safe('"a \\"plain\\" token"') == '"a \\"plain\\" token"'
    assert scanned == []
    assert _events.line_safe('"\u2028 é"') == '"\\u2028 é"'
    assert scanned == ['"\u2028 é"']
