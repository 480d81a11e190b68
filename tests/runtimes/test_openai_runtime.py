"""OpenAIRuntime through the official SDK against a fake Chat Completions server on loopback."""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path

import httpx2
import pytest

from atmosphere_harness import CacheHint, Message, ModelRequest, ToolCall
from atmosphere_harness._errors import ModelError
from atmosphere_harness._runtimes.base import ToolSpec
from atmosphere_harness._runtimes.openai import OpenAIRuntime
from tests.fake_providers import (
    LoopbackTransport,
    Status,
    Stream,
    fake_openai,
    openai_text,
    openai_tool_calls,
    port_of,
)
from tests.runtime_support import (
    ADD_SCHEMA,
    PATH,
    SHOUT_SCHEMA,
    SYSTEM,
    agent_client,
    complete_streaming,
    hang_up_after_first_text,
)
from tests.support import of_type, parse_sse, serve
from tests.support import prompt as post_prompt

ADD = ToolSpec("add", "Add two integers.", ADD_SCHEMA)


def runtime_for(base: str, **options) -> OpenAIRuntime:
    return OpenAIRuntime("fake-model", base_url=f"{base}/v1", api_key="sk-test", **options)


async def test_streams_text_and_sends_the_exact_body() -> None:
    fake = fake_openai().script(Stream(openai_text("Hel", "lo ", "there.", usage=(40, 3, 32))))
    history = (
        Message.user("add 2 and 3"),
        Message.assistant("", [ToolCall("add", {"a": 2, "b": 3}, "call_1")]),
        Message.tool(ToolCall("add", {}, "call_1"), "5"),
        Message.assistant("The sum is 5."),
        Message.user("thanks"),
    )
    request = ModelRequest(
        system_prompt=SYSTEM,
        messages=history,
        tools=(ADD,),
        conversation_id="conv-1",
        context=("Known facts: the user likes short answers.", "  "),
        cache_hint=CacheHint.conservative(),
    )
    response, deltas = await complete_streaming(fake, runtime_for, request)
    assert deltas == ["Hel", "lo ", "there."]
    assert response.text == "Hello there."
    assert response.tool_calls == ()
    assert response.stop_reason == "stop"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (40, 3)
    assert response.usage.cache_read_tokens == 32
    assert fake.bodies == [
        {
            "model": "fake-model",
            "stream": True,
            "stream_options": {"include_usage": True},
            "prompt_cache_key": "conv-1",
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "add 2 and 3"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "add", "arguments": '{"a":2,"b":3}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "5"},
                {"role": "assistant", "content": "The sum is 5."},
                {
                    "role": "user",
                    "content": "thanks\n\nKnown facts: the user likes short answers.",
                },
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "add",
                        "description": "Add two integers.",
                        "parameters": ADD_SCHEMA,
                    },
                }
            ],
        }
    ]
    assert fake.requests[0].headers["authorization"] == "Bearer sk-test"


@pytest.mark.parametrize("runtime_kind", ["openai", "anthropic"])
async def test_finished_streams_leave_the_connection_reusable(runtime_kind: str) -> None:
    from atmosphere_harness._runtimes.anthropic import AnthropicRuntime
    from tests.fake_providers import anthropic_text, fake_anthropic

    if runtime_kind == "openai":
        fake = fake_openai().script(Stream(openai_text("a")), Stream(openai_text("b")))
    else:
        fake = fake_anthropic().script(Stream(anthropic_text("a")), Stream(anthropic_text("b")))
    async with serve(fake.app) as base:
        runtime = (
            runtime_for(base)
            if runtime_kind == "openai"
            else AnthropicRuntime("claude-fake", base_url=base, api_key="k")
        )
        first = await runtime.complete(ModelRequest("", (Message.user("x"),)))
        second = await runtime.complete(ModelRequest("", (Message.user("y"),)))
        await runtime.aclose()
    assert (first.text, second.text) == ("a", "b")
    ports = [request.client_port for request in fake.requests]
    assert ports[0] is not None
    assert ports[0] == ports[1], "the second call reused the first call's connection"


async def test_context_after_tool_results_is_a_trailing_user_message() -> None:
    fake = fake_openai().script(Stream(openai_text("ok")))
    messages = (
        Message.user("go"),
        Message.assistant("", [ToolCall("add", {"a": 1, "b": 1}, "c1")]),
        Message.tool(ToolCall("add", {}, "c1"), "2"),
    )
    request = ModelRequest("sys", messages, context=("Plan: step 2 of 3",))
    async with serve(fake.app) as base:
        await runtime_for(base).complete(request)
    wire = fake.bodies[0]["messages"]
    assert [m["role"] for m in wire] == ["system", "user", "assistant", "tool", "user"]
    assert wire[1]["content"] == "go", "history is never rewritten"
    assert wire[-1] == {"role": "user", "content": "Plan: step 2 of 3"}


async def test_parallel_tool_calls_split_across_chunks() -> None:
    calls = [
        ("call_a", "add", json.dumps({"a": 2, "b": 3})),
        ("call_b", "shout", json.dumps({"text": "héllo, wörld"})),
    ]
    fake = fake_openai().script(Stream(openai_tool_calls(calls, split=4, text="On it.")))
    async with serve(fake.app) as base:
        response = await runtime_for(base).complete(ModelRequest("", (Message.user("x"),)))
    assert response.text == "On it."
    assert response.tool_calls == (
        ToolCall("add", {"a": 2, "b": 3}, "call_a"),
        ToolCall("shout", {"text": "héllo, wörld"}, "call_b"),
    )
    assert response.stop_reason == "tool_calls"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (20, 7)
    assert "tools" not in fake.bodies[0], "no tools offered, none sent"
    assert fake.bodies[0]["messages"] == [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(("line_end", "piece_bytes"), [("\n", None), ("\r\n", 5), ("\r", 3)])
async def test_line_separators_inside_json_strings_stay_in_the_answer(
    line_end: str, piece_bytes: int | None
) -> None:
    """U+2028, U+2029 and U+0085 may stand raw inside a JSON string (servers writing UTF-8 send
    them so) and end no SSE line: the text and a tool call's arguments arrive whole, however
    the body is cut (a piece may end inside a CRLF or a multi-byte character)."""
    pieces = ("one\u2028two", " thr\x85ee", " é\u2029😀")
    arguments = json.dumps({"a": 2, "b": "x\u2028y\x85z"}, ensure_ascii=False)
    events = [
        *openai_text(*pieces, usage=None)[:-1],
        *openai_tool_calls([("call_a", "add", arguments)], split=3)[1:],
    ]
    stream = Stream(events, raw_unicode=True, line_end=line_end, piece_bytes=piece_bytes)
    fake = fake_openai().script(stream)
    request = ModelRequest("", (Message.user("x"),), tools=(ADD,))
    response, deltas = await complete_streaming(fake, runtime_for, request)
    assert deltas == list(pieces)
    assert response.text == "".join(pieces)
    assert response.tool_calls == (ToolCall("add", {"a": 2, "b": "x\u2028y\x85z"}, "call_a"),)
    assert response.stop_reason == "tool_calls"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (20, 7)


async def test_full_agent_run_over_http(workspace: Path) -> None:
    fake = fake_openai().script(
        Stream(
            openai_tool_calls(
                [
                    ("call_a", "add", '{"a": 2, "b": 3}'),
                    ("call_b", "shout", '{"text": "done"}'),
                ],
                usage=(50, 10, 0),
            )
        ),
        Stream(openai_text("The sum ", "is 5.", usage=(80, 4, 48))),
    )
    async with agent_client(fake, runtime_for, workspace) as client:
        response = await client.post(PATH, json={"message": "add 2 and 3"})
        frames = parse_sse(response.text)
    kinds = [frame["event"] for frame in frames]
    assert kinds == [*(["tool-start", "tool-result"] * 2), "text", "text", "complete"]
    assert [frame["seq"] for frame in frames] == list(range(1, len(frames) + 1))
    results = of_type(frames, "tool-result")
    assert [(r["data"]["toolCallId"], r["data"]["result"]) for r in results] == [
        ("call_a", "5"),
        ("call_b", "DONE"),
    ]
    complete = frames[-1]["data"]
    assert complete["summary"] == "The sum is 5."
    assert complete["usage"] == {
        "inputTokens": 130,
        "outputTokens": 14,
        "cacheReadTokens": 48,
        "cacheWriteTokens": 0,
    }
    conversation = response.headers["x-conversation-id"]
    first, second = fake.bodies
    assert first["prompt_cache_key"] == second["prompt_cache_key"] == conversation
    assert [tool["function"]["name"] for tool in first["tools"]] == ["add", "shout"]
    assert first["tools"][1]["function"]["parameters"] == SHOUT_SCHEMA
    assert second["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "add 2 and 3"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a":2,"b":3}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "shout", "arguments": '{"text":"done"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "5"},
        {"role": "tool", "tool_call_id": "call_b", "content": "DONE"},
    ]


async def test_a_500_is_retried_then_the_run_completes(workspace: Path) -> None:
    fake = fake_openai().script(
        Status(500, {"error": {"message": "upstream hiccup"}}, {"retry-after-ms": "10"}),
        Stream(openai_text("recovered")),
    )
    async with agent_client(fake, runtime_for, workspace) as client:
        frames = await post_prompt(client, PATH, "hi")
    assert frames[-1]["event"] == "complete"
    assert frames[-1]["data"]["summary"] == "recovered"
    assert len(fake.requests) == 2
    assert fake.bodies[0] == fake.bodies[1], "the retry sends the same request"


async def test_retries_are_bounded_and_the_error_says_so(workspace: Path) -> None:
    failure = Status(503, {"error": {"message": "overloaded"}}, {"retry-after-ms": "5"})
    fake = fake_openai().script(failure, failure, failure)
    retry_once = functools.partial(runtime_for, max_retries=1)
    async with agent_client(fake, retry_once, workspace) as client:
        frames = await post_prompt(client, PATH, "hi")
    assert [frame["event"] for frame in frames] == ["error"]
    assert frames[0]["data"] == {
        "message": "OpenAI failed (HTTP 503) after 1 retry: overloaded",
        "type": "ModelError",
    }
    assert len(fake.requests) == 2, "one try plus one retry, then it stops"


async def test_a_400_is_an_error_frame_without_retry(workspace: Path) -> None:
    fake = fake_openai().script(
        Status(400, {"error": {"message": "Invalid value for 'model'", "type": "invalid"}})
    )
    async with agent_client(fake, runtime_for, workspace) as client:
        frames = await post_prompt(client, PATH, "hi")
    assert [frame["event"] for frame in frames] == ["error"]
    assert frames[0]["data"]["message"] == (
        "OpenAI rejected the request (HTTP 400): Invalid value for 'model'"
    )
    assert len(fake.requests) == 1


@pytest.mark.parametrize(
    ("status", "hint"), [(401, "check LLM_API_KEY"), (404, "check LLM_MODEL and LLM_BASE_URL")]
)
async def test_auth_and_not_found_errors_say_what_to_check(status: int, hint: str) -> None:
    fake = fake_openai().script(Status(status, {"error": {"message": "nope"}}))
    async with serve(fake.app) as base:
        with pytest.raises(ModelError) as caught:
            await runtime_for(base).complete(ModelRequest("", (Message.user("x"),)))
    assert str(caught.value) == f"OpenAI rejected the request (HTTP {status}): nope ({hint})"


async def test_unreachable_server_is_a_clear_error() -> None:
    async with serve(fake_openai().app) as base:
        dead = base  # the port is free again once the server stopped
    runtime = runtime_for(dead, max_retries=0)
    with pytest.raises(ModelError) as caught:
        await runtime.complete(ModelRequest("", (Message.user("x"),)))
    assert str(caught.value).startswith(f"cannot reach OpenAI at {dead}/v1")


async def test_a_stream_that_breaks_off_is_an_error_frame(workspace: Path) -> None:
    fake = fake_openai().script(Stream(openai_text("half ", "an ", "answer"), break_after=3))
    async with agent_client(fake, runtime_for, workspace) as client:
        frames = await post_prompt(client, PATH, "hi")
    assert [frame["event"] for frame in frames] == ["text", "text", "error"]
    assert frames[-1]["data"]["message"].startswith("OpenAI at http://127.0.0.1:")
    assert "broke off mid-answer" in frames[-1]["data"]["message"]


async def test_client_disconnect_closes_the_provider_stream(workspace: Path) -> None:
    release = asyncio.Event()
    fake = fake_openai().script(Stream(openai_text("first ", "second"), hold=release, hold_after=2))
    async with agent_client(fake, runtime_for, workspace) as client:
        await hang_up_after_first_text(client)
        # The SSE client is gone: the run is cancelled and the SDK stream closed, which the
        # fake sees as its response being dropped mid-stream.
        await asyncio.wait_for(fake.disconnected.wait(), 10)
        release.set()
    assert len(fake.requests) == 1


async def test_malformed_tool_arguments_reach_the_model_as_invalid_arguments(
    workspace: Path,
) -> None:
    fake = fake_openai().script(
        Stream(openai_tool_calls([("call_x", "add", '{"a": 2, "b": ')])),
        Stream(openai_text("Sorry.")),
    )
    async with agent_client(fake, runtime_for, workspace) as client:
        frames = await post_prompt(client, PATH, "add")
    result = of_type(frames, "tool-result")[0]["data"]["result"]
    assert json.loads(result)["error"] == "invalid_arguments"
    assert frames[-1]["event"] == "complete"
    sent_back = fake.bodies[1]["messages"][2]["tool_calls"][0]["function"]["arguments"]
    assert sent_back == '{"a": 2, "b": ', "the model's own text goes back unchanged"


def test_a_leading_summary_joins_the_system_prompt_after_it() -> None:
    runtime = OpenAIRuntime("m", base_url="http://127.0.0.1:9/v1")
    history = (Message.system("Summary of 12 earlier messages: ..."), Message.user("and now?"))
    wire = runtime.wire_request(ModelRequest(SYSTEM, history))["messages"]
    assert wire == [
        {"role": "system", "content": f"{SYSTEM}\n\nSummary of 12 earlier messages: ..."},
        {"role": "user", "content": "and now?"},
    ]


async def test_unpaired_history_is_repaired_before_sending() -> None:
    fake = fake_openai().script(Stream(openai_text("ok")))
    broken = (
        Message.tool(ToolCall("add", {}, "orphan"), "stale"),
        Message.user("hi"),
        Message.assistant("", [ToolCall("add", {"a": 1, "b": 2}, "lost")]),
        Message.user("again"),
    )
    async with serve(fake.app) as base:
        await runtime_for(base).complete(ModelRequest("", broken))
    wire = fake.bodies[0]["messages"]
    assert [m["role"] for m in wire] == ["user", "assistant", "tool", "user"]
    assert wire[2]["tool_call_id"] == "lost"
    assert json.loads(wire[2]["content"])["error"] == "tool_result_missing"


# --- the prompt_cache_key gate, per mode and host ---------------------------------------------

HOSTS = {
    "127.0.0.1": True,
    "localhost": True,
    "api.openai.com": True,
    "myres.openai.azure.com": True,
    "models.example.test": False,
    "generativelanguage.googleapis.com": False,
}


@pytest.mark.parametrize("mode", ["auto", "true", "false"])
@pytest.mark.parametrize("host", list(HOSTS))
async def test_prompt_cache_key_by_mode_and_host(mode: str, host: str) -> None:
    fake = fake_openai().script(Stream(openai_text("ok")))
    async with serve(fake.app) as base:
        port = port_of(base)
        transport = None if host in ("127.0.0.1", "localhost") else LoopbackTransport(port)
        async with httpx2.AsyncClient(transport=transport) as http:
            runtime = OpenAIRuntime(
                "fake-model",
                base_url=f"http://{host}:{port}/v1",
                api_key="sk-test",
                prompt_cache_key=mode,
                http_client=http,
            )
            request = ModelRequest(
                "", (Message.user("x"),), conversation_id="c-9", cache_hint=CacheHint.aggressive()
            )
            await runtime.complete(request)
    expected = {"auto": HOSTS[host], "true": True, "false": False}[mode]
    assert ("prompt_cache_key" in fake.bodies[0]) is expected
    assert fake.requests[0].headers["host"] == f"{host}:{port}"
    if expected:
        assert fake.bodies[0]["prompt_cache_key"] == "c-9"


@pytest.mark.parametrize(
    ("hint", "conversation", "expected"),
    [
        (None, "c-1", None),
        (CacheHint.none(), "c-1", None),
        (CacheHint.none(), "", None),
        (CacheHint.conservative(), "c-1", "c-1"),
        (CacheHint.aggressive(), "c-1", "c-1"),
        (CacheHint.conservative(key="tenant-7"), "c-1", "tenant-7"),
        (CacheHint.aggressive(key="  "), "c-1", "c-1"),
        (CacheHint.conservative(), "", None),
    ],
)
async def test_cache_hint_decides_the_key(hint, conversation: str, expected: str | None) -> None:
    runtime = OpenAIRuntime("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    body = runtime.wire_request(
        ModelRequest("", (Message.user("x"),), conversation_id=conversation, cache_hint=hint)
    )
    assert body.get("prompt_cache_key") == expected


def test_capabilities_report_prompt_caching_only_when_the_key_is_sent() -> None:
    local = OpenAIRuntime("m", base_url="http://localhost:11434/v1")
    other = OpenAIRuntime("m", base_url="https://api.groq.com/openai/v1", api_key="k")
    forced = OpenAIRuntime("m", base_url="https://api.groq.com/openai/v1", api_key="k",
                           prompt_cache_key=True)  # fmt: skip
    assert "prompt-caching" in {c.value for c in local.capabilities}
    assert "prompt-caching" not in {c.value for c in other.capabilities}
    assert "prompt-caching" in {c.value for c in forced.capabilities}
    assert local.name == "openai"


def test_configuration_errors_are_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="needs a model name: set LLM_MODEL"):
        OpenAIRuntime("  ")
    with pytest.raises(ValueError, match="needs an API key for OpenAI: set LLM_API_KEY"):
        OpenAIRuntime("gpt-4.1-mini")
    # A local server (Ollama, vLLM) needs no key.
    assert OpenAIRuntime("llama3.1", base_url="http://localhost:11434/v1").model == "llama3.1"


async def test_max_tokens_and_parallel_tool_calls_are_sent_when_set() -> None:
    runtime = OpenAIRuntime(
        "m", base_url="http://127.0.0.1:9/v1", max_tokens=256, parallel_tool_calls=False
    )
    body = runtime.wire_request(ModelRequest("", (Message.user("x"),), tools=(ADD,)))
    assert body["max_completion_tokens"] == 256
    assert body["parallel_tool_calls"] is False
    bare = OpenAIRuntime("m", base_url="http://127.0.0.1:9/v1")
    assert {"max_completion_tokens", "parallel_tool_calls"}.isdisjoint(
        bare.wire_request(ModelRequest("", (Message.user("x"),), tools=(ADD,)))
    )


async def test_llm_max_connections_bounds_the_calls_in_flight_and_keeps_them_alive() -> None:
    """With `LLM_MAX_CONNECTIONS=2` a third concurrent call waits for one of the two
    connections and then reuses it (the SDK's own pool would open a third at once)."""
    from atmosphere_harness import HarnessSettings

    release = asyncio.Event()
    fake = fake_openai().script(
        Stream(openai_text("a", "b"), hold=release),
        Stream(openai_text("c", "d"), hold=release),
        Stream(openai_text("e")),
    )
    async with serve(fake.app) as base:
        settings = HarnessSettings(
            llm_model="fake-model", llm_base_url=f"{base}/v1", llm_max_connections=2
        )
        runtime = OpenAIRuntime.from_settings(settings)
        calls = [
            asyncio.create_task(runtime.complete(ModelRequest("", (Message.user(str(n)),))))
            for n in range(3)
        ]
        while len(fake.requests) < 2:
            await asyncio.sleep(0.01)
        release.set()
        answers = await asyncio.wait_for(asyncio.gather(*calls), 20)
        await runtime.aclose()
    assert sorted(answer.text for answer in answers) == ["ab", "cd", "e"]
    ports = [request.client_port for request in fake.requests]
    assert ports[2] in ports[:2], "the third call waited for a pooled connection and reused it"
