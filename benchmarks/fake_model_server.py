"""A fake OpenAI-compatible and Anthropic model server for the runtime benchmark.

Every request gets the same pre-rendered stream for its workload (named by the request's
`model`), one SSE event per write, so the server costs the same for every client measured.
Run it as `uvicorn benchmarks.fake_model_server:app --port N`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fake_providers import (
    anthropic_text,
    anthropic_tool_uses,
    openai_text,
    openai_tool_calls,
)

TEXT_DELTAS = 2000
PARALLEL_CALLS = 8
CALL_ARGUMENT_BYTES = 2048
BIG_ARGUMENT_BYTES = 64 * 1024
DELTA_BYTES = 50


def _words(count: int) -> list[str]:
    return [f"word{index % 97} " for index in range(count)]


def _content(size: int) -> str:
    line = "the quick brown fox jumps over the lazy dog, again and again\n"
    return (line * (size // len(line) + 1))[:size]


def _calls(count: int, size: int) -> list[tuple[str, str, str]]:
    return [
        (
            f"call_{index}",
            "write_file",
            json.dumps({"path": f"notes/{index}.md", "content": _content(size)}),
        )
        for index in range(count)
    ]


Builder = Callable[[list[tuple[str, str, str]], int], list[tuple[str | None, Any]]]


def _tool_workloads(build: Builder) -> dict[str, list[tuple[str | None, Any]]]:
    small = _calls(PARALLEL_CALLS, CALL_ARGUMENT_BYTES)
    big = _calls(1, BIG_ARGUMENT_BYTES)
    return {
        "tools": build(small, CALL_ARGUMENT_BYTES // DELTA_BYTES),
        "big-argument": build(big, BIG_ARGUMENT_BYTES // DELTA_BYTES),
    }


def _render(events: list[tuple[str | None, Any]], done: bool) -> list[bytes]:
    rendered = [
        (f"event: {name}\n" if name else "") + f"data: {json.dumps(payload)}\n\n"
        for name, payload in events
    ]
    if done:
        rendered.append("data: [DONE]\n\n")
    return [part.encode() for part in rendered]


OPENAI = {
    name: _render(events, done=True)
    for name, events in {
        "text": openai_text(*_words(TEXT_DELTAS)),
        **_tool_workloads(lambda calls, split: openai_tool_calls(calls, split=split)),
    }.items()
}
ANTHROPIC = {
    name: _render(events, done=False)
    for name, events in {
        "text": anthropic_text(*_words(TEXT_DELTAS)),
        **_tool_workloads(lambda calls, split: anthropic_tool_uses(calls, split=split)),
    }.items()
}


async def _stream(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def _endpoint(workloads: dict[str, list[bytes]]) -> Callable[[Request], Any]:
    async def handle(request: Request) -> Response:
        body = await request.json()
        parts = workloads.get(body.get("model", ""))
        if parts is None:
            return JSONResponse(
                {"error": {"message": f"unknown workload {body.get('model')}"}}, 404
            )
        return StreamingResponse(_stream(parts), media_type="text/event-stream")

    return handle


app = Starlette(
    routes=[
        Route("/v1/chat/completions", _endpoint(OPENAI), methods=["POST"]),
        Route("/v1/messages", _endpoint(ANTHROPIC), methods=["POST"]),
    ]
)
