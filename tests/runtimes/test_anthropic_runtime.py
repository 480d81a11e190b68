"""AnthropicRuntime through the official SDK against a fake Messages server on loopback."""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path

import pytest

from atmosphere_harness import AiCapability, CacheHint, Message, ModelRequest, ToolCall
from atmosphere_harness._contracts import Primitive
from atmosphere_harness._errors import ModelError
from atmosphere_harness._filesystem.base import AgentFileSystem
from atmosphere_harness._runtimes import provider
from atmosphere_harness._runtimes.anthropic import AnthropicRuntime
from atmosphere_harness._runtimes.base import ToolSpec
from atmosphere_harness._runtimes.memory_tool import memory_tool
from tests.fake_providers import (
    Status,
    Stream,
    anthropic_text,
    anthropic_tool_uses,
    fake_anthropic,
)
from tests.memory_fs import DictFileSystem
from tests.runtime_support import (
    ADD_SCHEMA,
    PATH,
    SYSTEM,
    agent_client,
    complete_streaming,
    hang_up_after_first_text,
    without_provider_credentials,
)
from tests.support import of_type, parse_sse, serve
from tests.support import prompt as post_prompt

ADD = ToolSpec("add", "Add two integers.", ADD_SCHEMA)
MEMORY = memory_tool().spec()
EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}


def runtime_for(base: str, **options) -> AnthropicRuntime:
    return AnthropicRuntime("claude-fake", base_url=base, api_key="sk-ant-test", **options)


HISTORY = (
    Message.user("add 2 and 3, then 4 and 5"),
    Message.assistant(
        "Adding.",
        [ToolCall("add", {"a": 2, "b": 3}, "tu_1"), ToolCall("add", {"a": 4, "b": 5}, "tu_2")],
    ),
    Message.tool(ToolCall("add", {}, "tu_1"), "5"),
    Message.tool(ToolCall("add", {}, "tu_2"), "9"),
)
WIRE_HISTORY = [
    {"role": "user", "content": [{"type": "text", "text": "add 2 and 3, then 4 and 5"}]},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Adding."},
            {"type": "tool_use", "id": "tu_1", "name": "add", "input": {"a": 2, "b": 3}},
            {"type": "tool_use", "id": "tu_2", "name": "add", "input": {"a": 4, "b": 5}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "tu_1", "content": "5"},
            {"type": "tool_result", "tool_use_id": "tu_2", "content": "9"},
        ],
    },
]


async def test_streams_text_and_sends_the_exact_body() -> None:
    fake = fake_anthropic().script(Stream(anthropic_text("5 and ", "9.", usage=(7, 1200, 300))))
    request = ModelRequest(
        system_prompt=SYSTEM,
        messages=HISTORY,
        tools=(ADD, MEMORY),
        conversation_id="conv-1",
        context=("Known facts: the user likes short answers.",),
        cache_hint=CacheHint.conservative(),
    )
    response, deltas = await complete_streaming(fake, runtime_for, request)
    assert deltas == ["5 and ", "9."]
    assert response.text == "5 and 9."
    assert response.stop_reason == "end_turn"
    usage = response.usage
    assert (usage.input_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (
        1507,
        1200,
        300,
    )
    assert usage.output_tokens == 6
    last_turn = WIRE_HISTORY[-1]["content"] + [
        {"type": "text", "text": "Known facts: the user likes short answers."}
    ]
    assert fake.bodies == [
        {
            "model": "claude-fake",
            "max_tokens": 8192,
            "stream": True,
            "system": [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}],
            "tools": [
                {"name": "add", "description": "Add two integers.", "input_schema": ADD_SCHEMA},
                {"type": "memory_20250818", "name": "memory", "cache_control": EPHEMERAL},
            ],
            "messages": [*WIRE_HISTORY[:-1], {"role": "user", "content": last_turn}],
        }
    ]
    headers = fake.requests[0].headers
    assert "sk-ant-test" in (headers.get("x-api-key") or headers["authorization"])
    assert "anthropic-version" in headers


async def test_aggressive_uses_the_hour_ttl_and_marks_the_history_end() -> None:
    fake = fake_anthropic().script(Stream(anthropic_text("ok")))
    request = ModelRequest(
        SYSTEM, HISTORY, tools=(ADD,), context=("ctx",), cache_hint=CacheHint.aggressive()
    )
    async with serve(fake.app) as base:
        await runtime_for(base).complete(request)
    body = fake.bodies[0]
    assert body["system"][0]["cache_control"] == HOUR
    assert body["tools"][-1]["cache_control"] == HOUR
    last = body["messages"][-1]["content"]
    assert last[-2] == {
        "type": "tool_result",
        "tool_use_id": "tu_2",
        "content": "9",
        "cache_control": EPHEMERAL,
    }, "the history breakpoint is 5 minutes, after the 1-hour ones"
    assert last[-1] == {"type": "text", "text": "ctx"}, "context stays after every breakpoint"
    marks = json.dumps(body).count('"cache_control"')
    assert marks == 3, "within the API's four breakpoints"


@pytest.mark.parametrize(
    ("hint", "control"),
    [
        (None, None),
        (CacheHint.none(), None),
        (CacheHint.conservative(), EPHEMERAL),
        (CacheHint.conservative(ttl=300), EPHEMERAL),
        (CacheHint.conservative(ttl=3600), HOUR),
        (CacheHint.aggressive(), HOUR),
    ],
)
def test_cache_control_by_hint(hint: CacheHint | None, control: dict | None) -> None:
    runtime = AnthropicRuntime("claude-fake", base_url="http://127.0.0.1:9", api_key="k")
    body = runtime.wire_request(ModelRequest(SYSTEM, HISTORY, tools=(ADD,), cache_hint=hint))
    assert body["system"][0].get("cache_control") == control
    assert body["tools"][-1].get("cache_control") == control
    assert body["tools"][0].get("cache_control") is None or len(body["tools"]) == 1
    history_marked = "cache_control" in body["messages"][-1]["content"][-1]
    assert history_marked is (hint is not None and hint.policy.value == "aggressive")


async def test_tool_use_json_split_across_deltas() -> None:
    calls = [
        ("tu_a", "add", json.dumps({"a": 2, "b": 3})),
        (
            "tu_b",
            "memory",
            json.dumps({"command": "create", "path": "/memories/n.md", "file_text": "é" * 50}),
        ),
    ]
    fake = fake_anthropic().script(Stream(anthropic_tool_uses(calls, split=7, text="On it.")))
    async with serve(fake.app) as base:
        response = await runtime_for(base).complete(ModelRequest("", (Message.user("x"),)))
    assert response.text == "On it."
    assert response.tool_calls == (
        ToolCall("add", {"a": 2, "b": 3}, "tu_a"),
        ToolCall(
            "memory", {"command": "create", "path": "/memories/n.md", "file_text": "é" * 50}, "tu_b"
        ),
    )
    assert response.stop_reason == "tool_use"
    assert "system" not in fake.bodies[0]
    assert "tools" not in fake.bodies[0]


class NativeFiles(Primitive):
    """Stands in for the filesystem primitive: binds a store, registers the native surface."""

    name = "test-native-files"

    def __init__(self, fs: DictFileSystem) -> None:
        self.fs = fs

    def attach(self, endpoint, host) -> None:
        endpoint.provide(AgentFileSystem, lambda run: self.fs)
        for tool in host.runtime.native_tools(AiCapability.VIRTUAL_FILESYSTEM):
            endpoint.add_builtin_tool(tool)


async def test_full_agent_run_with_the_memory_tool(workspace: Path) -> None:
    fs = DictFileSystem()
    note = {"command": "create", "path": "/memories/plan.md", "file_text": "1. add\n"}
    fake = fake_anthropic().script(
        Stream(
            anthropic_tool_uses(
                [("tu_1", "add", '{"a": 2, "b": 3}'), ("tu_2", "memory", json.dumps(note))],
                usage=(40, 0, 900),
            )
        ),
        Stream(anthropic_text("Saved; ", "the sum is 5.", usage=(12, 900, 0), output=8)),
    )
    async with agent_client(fake, runtime_for, workspace, primitives=[NativeFiles(fs)]) as client:
        response = await client.post(PATH, json={"message": "add 2 and 3 and note it"})
        frames = parse_sse(response.text)
    assert [frame["event"] for frame in frames] == [
        *(["tool-start", "tool-result"] * 2),
        "text",
        "text",
        "complete",
    ]
    results = [frame["data"]["result"] for frame in of_type(frames, "tool-result")]
    assert results == ["5", "File created successfully at: /memories/plan.md"]
    assert fs.files == {"plan.md": "1. add\n"}
    assert frames[-1]["data"]["usage"] == {
        "inputTokens": 40 + 900 + 12 + 900,
        "outputTokens": 9 + 8,
        "cacheReadTokens": 900,
        "cacheWriteTokens": 900,
    }
    first, second = fake.bodies
    assert first["tools"][-1] == {
        "type": "memory_20250818",
        "name": "memory",
        "cache_control": EPHEMERAL,
    }, "the native declaration replaces the schema"
    assert first["system"] == [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
    assert second["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "tu_1", "name": "add", "input": {"a": 2, "b": 3}},
                {"type": "tool_use", "id": "tu_2", "name": "memory", "input": note},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "tu_1", "content": "5"},
                {
                    "type": "tool_result",
                    "tool_use_id": "tu_2",
                    "content": "File created successfully at: /memories/plan.md",
                },
            ],
        },
    ]


@pytest.mark.parametrize(
    ("status", "kind", "message"),
    [(529, "overloaded_error", "Overloaded"), (500, "api_error", "Internal server error")],
)
async def test_a_failure_then_ok_is_retried(
    workspace: Path, status: int, kind: str, message: str
) -> None:
    failure = {"type": "error", "error": {"type": kind, "message": message}}
    fake = fake_anthropic().script(
        Status(status, failure, {"retry-after-ms": "10"}), Stream(anthropic_text("back"))
    )
    async with agent_client(fake, runtime_for, workspace) as client:
        frames = await post_prompt(client, PATH, "hi")
    assert frames[-1]["event"] == "complete"
    assert frames[-1]["data"]["summary"] == "back"
    assert len(fake.requests) == 2


async def test_retries_are_bounded(workspace: Path) -> None:
    failure = Status(500, {"type": "error", "error": {"type": "api_error", "message": "boom"}},
                     {"retry-after-ms": "5"})  # fmt: skip
    fake = fake_anthropic().script(failure, failure, failure, failure)
    async with agent_client(
        fake, functools.partial(runtime_for, max_retries=2), workspace
    ) as client:
        frames = await post_prompt(client, PATH, "hi")
    assert frames == [frames[0]]
    assert frames[0]["event"] == "error"
    assert frames[0]["data"]["message"] == "Anthropic failed (HTTP 500) after 2 retries: boom"
    assert len(fake.requests) == 3


async def test_a_400_is_an_error_frame_without_retry(workspace: Path) -> None:
    invalid = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: too large"},
    }
    fake = fake_anthropic().script(Status(400, invalid))
    async with agent_client(fake, runtime_for, workspace) as client:
        frames = await post_prompt(client, PATH, "hi")
    assert [frame["event"] for frame in frames] == ["error"]
    assert frames[0]["data"] == {
        "message": "Anthropic rejected the request (HTTP 400): max_tokens: too large",
        "type": "ModelError",
    }
    assert len(fake.requests) == 1


async def test_an_error_event_mid_stream_is_an_error_frame(workspace: Path) -> None:
    events = anthropic_text("partial ")[:5]
    events.append(
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    )
    fake = fake_anthropic().script(Stream(events))
    async with agent_client(fake, runtime_for, workspace) as client:
        frames = await post_prompt(client, PATH, "hi")
    assert [frame["event"] for frame in frames] == ["text", "error"]
    assert frames[-1]["data"]["message"] == "Anthropic stream failed: Overloaded"
    assert len(fake.requests) == 1, "text already streamed: a mid-stream failure is not retried"


async def test_client_disconnect_closes_the_provider_stream(workspace: Path) -> None:
    release = asyncio.Event()
    fake = fake_anthropic().script(
        Stream(anthropic_text("first ", "second"), hold=release, hold_after=5)
    )
    async with agent_client(fake, runtime_for, workspace) as client:
        await hang_up_after_first_text(client)
        await asyncio.wait_for(fake.disconnected.wait(), 10)
        release.set()


async def test_unreachable_server_is_a_clear_error() -> None:
    async with serve(fake_anthropic().app) as base:
        dead = base
    with pytest.raises(ModelError) as caught:
        await runtime_for(dead, max_retries=0).complete(ModelRequest("", (Message.user("x"),)))
    assert str(caught.value).startswith(f"cannot reach Anthropic at {dead}")


def test_base_url_with_v1_and_native_surfaces() -> None:
    runtime = AnthropicRuntime("claude-fake", base_url="http://127.0.0.1:9/v1/", api_key="k")
    assert runtime.base_url.rstrip("/") == "http://127.0.0.1:9"
    assert runtime.name == "anthropic"
    assert AiCapability.VIRTUAL_FILESYSTEM in runtime.capabilities
    assert [tool.name for tool in runtime.native_tools(AiCapability.VIRTUAL_FILESYSTEM)] == [
        "memory"
    ]
    assert runtime.native_tools(AiCapability.PLANNING) == []
    with pytest.raises(ValueError, match="needs a model name"):
        AnthropicRuntime("")


@pytest.fixture
def no_anthropic_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    without_provider_credentials(monkeypatch, tmp_path / "home")


@pytest.mark.usefixtures("no_anthropic_credentials")
@pytest.mark.parametrize(
    "base_url", [None, "https://api.anthropic.com", "https://api.anthropic.com/v1"]
)
def test_a_missing_api_key_for_anthropic_is_a_clear_error(base_url: str | None) -> None:
    # Without the check the SDK builds the client and every call fails with a raw TypeError.
    with pytest.raises(ValueError, match=r"needs an API key for Anthropic: set LLM_API_KEY"):
        AnthropicRuntime("claude-sonnet-4-5", base_url=base_url)
    with pytest.raises(ValueError, match=r"needs an API key for Anthropic"):
        AnthropicRuntime("claude-sonnet-4-5", base_url=base_url, api_key="")


@pytest.mark.usefixtures("no_anthropic_credentials")
def test_an_environment_credential_is_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    assert AnthropicRuntime("claude-sonnet-4-5").model == "claude-sonnet-4-5"
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "bearer-env")
    assert AnthropicRuntime("claude-sonnet-4-5").model == "claude-sonnet-4-5"


@pytest.mark.usefixtures("no_anthropic_credentials")
@pytest.mark.parametrize("through", ["argument", "ANTHROPIC_BASE_URL"])
async def test_a_server_of_your_own_needs_no_key(
    monkeypatch: pytest.MonkeyPatch, through: str
) -> None:
    # A proxy or gateway gets the placeholder key, and the call goes through (no TypeError).
    fake = fake_anthropic().script(Stream(anthropic_text("hello")))
    async with serve(fake.app) as base:
        if through == "argument":
            runtime = AnthropicRuntime("claude-fake", base_url=base)
        else:
            monkeypatch.setenv("ANTHROPIC_BASE_URL", base)
            runtime = AnthropicRuntime("claude-fake")
        response = await runtime.complete(ModelRequest("", (Message.user("x"),)))
        await runtime.aclose()
    assert response.text == "hello"
    headers = fake.requests[0].headers
    assert "unused" in (headers.get("x-api-key") or headers["authorization"])


def test_system_messages_in_history_become_user_text() -> None:
    runtime = AnthropicRuntime("claude-fake", base_url="http://127.0.0.1:9", api_key="k")
    history = (Message.system("Summary: earlier we added numbers."), Message.user("and now?"))
    body = runtime.wire_request(ModelRequest(SYSTEM, history))
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Summary: earlier we added numbers."},
                {"type": "text", "text": "and now?"},
            ],
        }
    ]
    assert body["system"] == [{"type": "text", "text": SYSTEM}], "the system prompt is untouched"


async def test_a_huge_retry_after_cannot_hold_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # The Anthropic SDK obeys any Retry-After; the harness bounds the start of every call.
    monkeypatch.setattr(provider, "RETRY_WAIT_SECONDS", 1.0)
    limited = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    fake = fake_anthropic().script(Status(429, limited, {"retry-after": "86400"}))
    async with serve(fake.app) as base:
        runtime = runtime_for(base, max_retries=1, timeout=1.0)
        with pytest.raises(ModelError) as caught:
            await runtime.complete(ModelRequest("", (Message.user("x"),)))
    assert str(caught.value) == (
        "Anthropic did not start answering within 3s, retries included "
        "(see LLM_TIMEOUT and LLM_MAX_RETRIES)"
    )
    assert len(fake.requests) == 1
