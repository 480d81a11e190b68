"""Fake model providers for the runtime tests: real HTTP servers speaking each provider's wire.

A `FakeProvider` plays scripted replies in order (a stream of SSE events, or an error status)
and records every request it received (JSON body and headers). Serve its `app` with
`tests.support.serve` and point the official SDK at the URL: the SDK's whole HTTP path runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

KEEPALIVE_SECONDS = 0.05


@dataclass
class Stream:
    """One streamed reply: `(event name or None, JSON payload)` pairs, then the end.

    With `hold` set, the server sends the first `hold_after` events and then keeps the response
    open (SSE comments as keep-alives) until the event is set or the client goes away.
    """

    events: list[tuple[str | None, Any]]
    hold: asyncio.Event | None = None
    hold_after: int = 1
    break_after: int | None = None
    """Drop the connection after this many events, without ending the body."""
    raw_unicode: bool = False
    """JSON with non-ASCII text as is (`ensure_ascii=False`, as many servers write it)."""
    line_end: str = "\n"
    """What ends each line of the body (`\r\n` and `\r` are SSE line ends too)."""
    piece_bytes: int | None = None
    """Send the body in pieces of this many bytes (an event, a line end or a character cut
    across pieces), instead of an event a piece."""


@dataclass
class Status:
    """An error reply: HTTP status, JSON body, extra headers (e.g. `retry-after-ms`)."""

    code: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Recorded:
    body: dict[str, Any]
    headers: dict[str, str]
    client_port: int | None = None


class FakeProvider:
    """Scripted replies on `path`; `done` terminator for OpenAI-style streams."""

    def __init__(self, path: str, *, done_marker: bool) -> None:
        self.replies: list[Stream | Status] = []
        self.requests: list[Recorded] = []
        self.disconnected = asyncio.Event()
        self._done_marker = done_marker
        self.app = Starlette(routes=[Route(path, self._handle, methods=["POST"])])

    def script(self, *replies: Stream | Status) -> FakeProvider:
        self.replies.extend(replies)
        return self

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [request.body for request in self.requests]

    async def _handle(self, request: Request) -> Response:
        port = request.client.port if request.client else None
        self.requests.append(Recorded(await request.json(), dict(request.headers), port))
        if not self.replies:
            return JSONResponse({"error": {"message": "fake provider: no reply scripted"}}, 500)
        reply = self.replies.pop(0)
        if isinstance(reply, Status):
            return JSONResponse(reply.body, reply.code, headers=reply.headers)
        return StreamingResponse(self._events(reply), media_type="text/event-stream")

    async def _events(self, reply: Stream) -> AsyncIterator[str | bytes]:
        if reply.piece_bytes is None:
            async for text in self._texts(reply):
                yield text
            return
        size, held = reply.piece_bytes, b""
        async for text in self._texts(reply):
            held += text.encode()
            while len(held) >= size:
                yield held[:size]
                held = held[size:]
        if held:
            yield held

    async def _texts(self, reply: Stream) -> AsyncIterator[str]:
        finished = False
        end = reply.line_end
        try:
            for index, (name, payload) in enumerate(reply.events):
                if index == reply.break_after:
                    raise ConnectionAbortedError("the fake provider drops the connection")
                if reply.hold is not None and index == reply.hold_after:
                    while not reply.hold.is_set():
                        yield f": keep-alive{end}{end}"
                        await asyncio.sleep(KEEPALIVE_SECONDS)
                prefix = f"event: {name}{end}" if name else ""
                data = json.dumps(payload, ensure_ascii=not reply.raw_unicode)
                yield f"{prefix}data: {data}{end}{end}"
            if self._done_marker:
                yield f"data: [DONE]{end}{end}"
            finished = True
        finally:
            if not finished:
                self.disconnected.set()


class LoopbackTransport(httpx2.AsyncBaseTransport):
    """Sends every request to 127.0.0.1:`port`, whatever host its URL names.

    The Host header keeps the original name, so a runtime configured with
    `http://api.openai.com:PORT/v1` or an unknown host name talks to the fake over real HTTP
    while deciding everything (the prompt-cache-key host gate) from the name it was given.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.url = request.url.copy_with(host="127.0.0.1", port=self.port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1].split("/")[0])


# --- OpenAI Chat Completions chunks ---------------------------------------------------------


def fake_openai() -> FakeProvider:
    return FakeProvider("/v1/chat/completions", done_marker=True)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[None, dict[str, Any]]:
    return None, {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def openai_text(
    *pieces: str, usage: tuple[int, int, int] | None = (12, 5, 0)
) -> list[tuple[None, dict[str, Any]]]:
    """A text answer streamed in `pieces`, then `(prompt, completion, cached)` usage."""
    events = [_chunk({"role": "assistant", "content": ""})]
    events += [_chunk({"content": piece}) for piece in pieces]
    events.append(_chunk({}, "stop"))
    if usage is not None:
        events.append(openai_usage(*usage))
    return events


def openai_tool_calls(
    calls: Sequence[tuple[str, str, str]],
    *,
    split: int = 3,
    text: str | None = None,
    usage: tuple[int, int, int] | None = (20, 7, 0),
) -> list[tuple[None, dict[str, Any]]]:
    """Tool calls `(id, name, arguments JSON)`, each argument string split in `split` deltas."""
    events = [_chunk({"role": "assistant", "content": text})]
    for index, (call_id, name, arguments) in enumerate(calls):
        step = max(1, -(-len(arguments) // split))
        fragments = [arguments[i : i + step] for i in range(0, len(arguments), step)] or [""]
        first = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        events.append(_chunk({"tool_calls": [first]}))
        events += [
            _chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
            for fragment in fragments
        ]
    events.append(_chunk({}, "tool_calls"))
    if usage is not None:
        events.append(openai_usage(*usage))
    return events


def openai_usage(prompt: int, completion: int, cached: int = 0) -> tuple[None, dict[str, Any]]:
    return None, {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake-model",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


# --- Anthropic Messages events ---------------------------------------------------------------


def fake_anthropic() -> FakeProvider:
    return FakeProvider("/v1/messages", done_marker=False)


def _start(usage: tuple[int, int, int]) -> tuple[str, dict[str, Any]]:
    uncached, read, written = usage
    return "message_start", {
        "type": "message_start",
        "message": {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": "claude-fake",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": uncached,
                "output_tokens": 1,
                "cache_read_input_tokens": read,
                "cache_creation_input_tokens": written,
            },
        },
    }


def _stop(reason: str, output: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": None},
                "usage": {"output_tokens": output},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def _text_block(index: int, pieces: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "text", "text": ""},
            },
        )
    ]
    events += [
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": piece},
            },
        )
        for piece in pieces
    ]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def anthropic_text(
    *pieces: str, usage: tuple[int, int, int] = (10, 0, 0), output: int = 6
) -> list[tuple[str, dict[str, Any]]]:
    """A text answer in `pieces`; usage is `(uncached input, cache read, cache write)`."""
    return [
        _start(usage),
        ("ping", {"type": "ping"}),
        *_text_block(0, pieces),
        *_stop("end_turn", output),
    ]


def anthropic_tool_uses(
    calls: Sequence[tuple[str, str, str]],
    *,
    split: int = 3,
    text: str | None = None,
    usage: tuple[int, int, int] = (30, 0, 0),
    output: int = 9,
) -> list[tuple[str, dict[str, Any]]]:
    """`tool_use` blocks `(id, name, input JSON)`, the JSON split in `split` deltas."""
    events = [_start(usage)]
    offset = 0
    if text is not None:
        events += _text_block(0, [text])
        offset = 1
    for position, (call_id, name, arguments) in enumerate(calls):
        index = position + offset
        step = max(1, -(-len(arguments) // split))
        events.append(
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
                },
            )
        )
        events += [
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": arguments[i : i + step]},
                },
            )
            for i in range(0, len(arguments), step)
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return [*events, *_stop("tool_use", output)]
