"""What a model call in flight keeps of the answer it streams: the text joined as it comes, not
one string object a token (the journal keeps the frames; this keeps the answer for the turn)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

from atmosphere_harness import Message, ModelRequest
from atmosphere_harness._runtimes import anthropic, openai
from atmosphere_harness._runtimes.base import ModelResponse
from atmosphere_harness._runtimes.provider import PIECES_JOINED, TextPieces

TOKENS = 2000


def _token(n: int) -> str:
    # A new 4-character string each time, as a parsed stream chunk gives it.
    return f"t{n:04d}"[:4]


def _held_per_token(feed: Callable[[int], None]) -> float:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(TOKENS):
            feed(n)
        return (tracemalloc.get_traced_memory()[0] - before) / TOKENS
    finally:
        tracemalloc.stop()


def test_text_pieces_join_back_to_the_whole_text_whatever_their_count() -> None:
    for count in (0, 1, PIECES_JOINED - 1, PIECES_JOINED, PIECES_JOINED + 1, 5 * PIECES_JOINED):
        pieces = TextPieces()
        texts = [("é\U0001d538" * (n % 3)) + str(n) for n in range(count)]
        for text in texts:
            pieces.append(text)
        assert "".join(pieces) == "".join(texts)
        assert bool(pieces) is (count > 0)


def test_an_openai_answer_in_flight_keeps_its_text_not_a_string_a_token() -> None:
    turn = openai._Turn()

    def feed(n: int) -> None:
        turn.add({"choices": [{"index": 0, "delta": {"content": _token(n)}}]})

    held = _held_per_token(feed)
    assert held < 16, f"{held:.0f} bytes a token"
    assert turn.response().text == "".join(_token(n) for n in range(TOKENS))


def test_an_openai_tool_call_in_flight_keeps_its_arguments_joined() -> None:
    turn = openai._Turn()
    turn.add(
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c1",
                                "function": {"name": "write_file", "arguments": '{"content": "'},
                            }
                        ]
                    }
                }
            ]
        }
    )

    def feed(n: int) -> None:
        part = {"index": 0, "function": {"arguments": _token(n)}}
        turn.add({"choices": [{"delta": {"tool_calls": [part]}}]})

    held = _held_per_token(feed)
    turn.add(
        {
            "choices": [
                {
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"}'}}]},
                    "finish_reason": "tool_calls",
                }
            ]
        }
    )
    assert held < 16, f"{held:.0f} bytes a fragment"
    [call] = turn.response().tool_calls
    assert call.arguments == {"content": "".join(_token(n) for n in range(TOKENS))}


def test_an_anthropic_answer_in_flight_keeps_its_text_not_a_string_a_token() -> None:
    turn = anthropic._Turn()
    turn.add({"type": "content_block_start", "index": 0, "content_block": {"type": "text"}})

    def feed(n: int) -> None:
        turn.add(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": _token(n)},
            }
        )

    held = _held_per_token(feed)
    assert held < 16, f"{held:.0f} bytes a token"
    assert turn.response().text == "".join(_token(n) for n in range(TOKENS))


async def test_a_model_call_streaming_its_answer_no_longer_holds_its_request_body() -> None:
    """The request's encoded body (the whole history and the tools' schemas) is not kept while
    the answer streams: a run in flight holds its answer, not a copy of what it sent. What the
    SDK and its HTTP client hold at the first token is the same for a tiny request and for one
    of 256 KB."""
    from tests.fake_providers import Stream, fake_openai, openai_text
    from tests.runtime_support import complete_streaming

    held: list[int] = []

    def runtime_for(base: str) -> openai.OpenAIRuntime:
        runtime = openai.OpenAIRuntime("fake-model", base_url=f"{base}/v1", api_key="sk-test")
        complete = runtime.complete

        async def measured(request: ModelRequest, *, on_text: Any = None) -> ModelResponse:
            first = True

            async def sink(text: str) -> None:
                nonlocal first
                if first:
                    first = False
                    snapshot = tracemalloc.take_snapshot().filter_traces(
                        [
                            tracemalloc.Filter(True, "*/openai/*"),
                            tracemalloc.Filter(True, "*/httpx2/*"),
                        ]
                    )
                    held.append(sum(stat.size for stat in snapshot.statistics("filename")))
                await on_text(text)

            return await complete(request, on_text=sink)

        runtime.complete = measured  # type: ignore[method-assign]
        return runtime

    tracemalloc.start()
    try:
        for message in ("hi", "hi", "history " * 32_000):  # (the first loads the SDK's modules)
            fake = fake_openai().script(Stream(openai_text("Hel", "lo")))
            request = ModelRequest(
                system_prompt="You help.", messages=(Message.user(message),), conversation_id="c"
            )
            response, _ = await complete_streaming(fake, runtime_for, request)
            assert response.text == "Hello"
            assert fake.bodies[0]["messages"][-1]["content"] == message
    finally:
        tracemalloc.stop()
    tiny, big = held[1], held[2]
    assert big - tiny < 16_000, f"{big - tiny} bytes more held for a 256 KB request"
