"""The prompt-cache primitive: hints, the key-mode gate, precedence, and a stable prefix.

Covers Atmosphere's suite's CacheHintTest, PromptCacheKeyModeTest and the precedence rows of
AiEndpointProcessorHarnessPresetTest for this API; the wire emission per provider is pinned in
test_openai_runtime.py and test_anthropic_runtime.py.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from atmosphere_harness import (
    CacheHint,
    ModelRequest,
    PromptCache,
    ScriptedRuntime,
    StreamingSession,
    ToolCall,
    agent,
    ai_endpoint,
    prompt,
)
from atmosphere_harness._cache import cache_key_host_allowed
from atmosphere_harness._contracts import Key, Primitive
from atmosphere_harness._runtimes.anthropic import AnthropicRuntime
from atmosphere_harness._runtimes.openai import OpenAIRuntime
from atmosphere_harness._settings import PromptCacheKeyMode
from tests.agents import echo
from tests.runtime_support import PATH, SYSTEM, harness_app
from tests.support import client_for
from tests.support import prompt as post_prompt

# --- CacheHint --------------------------------------------------------------------------------


def test_factories_and_defaults() -> None:
    assert CacheHint.none() == CacheHint(PromptCache.NONE)
    assert CacheHint.conservative() == CacheHint(PromptCache.CONSERVATIVE, None, None)
    assert CacheHint.aggressive(key="k", ttl=60) == CacheHint(PromptCache.AGGRESSIVE, "k", 60)
    assert not CacheHint.none().enabled
    assert CacheHint.conservative().enabled
    assert CacheHint.aggressive().enabled


@pytest.mark.parametrize(
    ("hint", "long_lived"),
    [
        (CacheHint.none(), False),
        (CacheHint(PromptCache.NONE, ttl=7200), False),
        (CacheHint.conservative(), False),
        (CacheHint.conservative(ttl=3599), False),
        (CacheHint.conservative(ttl=3600), True),
        (CacheHint.aggressive(), True),
    ],
)
def test_long_lived(hint: CacheHint, long_lived: bool) -> None:
    assert hint.long_lived is long_lived


@pytest.mark.parametrize(
    ("hint", "conversation", "key"),
    [
        (CacheHint.none(), "c", None),
        (CacheHint(PromptCache.NONE, key="k"), "c", None),
        (CacheHint.conservative(key="k"), "c", "k"),
        (CacheHint.conservative(key="   "), "c", "c"),
        (CacheHint.aggressive(), "c", "c"),
        (CacheHint.aggressive(), "", None),
        (CacheHint.aggressive(), None, None),
    ],
)
def test_resolved_key(hint: CacheHint, conversation: str | None, key: str | None) -> None:
    assert hint.resolved_key(conversation) == key


@pytest.mark.parametrize("ttl", [0, -5, math.inf, math.nan])
def test_ttl_must_be_positive_and_finite(ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl must be a positive number of seconds"):
        CacheHint.conservative(ttl=ttl)


def test_policy_must_be_a_prompt_cache() -> None:
    with pytest.raises(TypeError, match="must be a PromptCache"):
        CacheHint("aggressive")  # type: ignore[arg-type]


# --- the prompt_cache_key host allow-list ------------------------------------------------------


@pytest.mark.parametrize(
    ("base_url", "allowed"),
    [
        (None, False),
        ("", False),
        ("   ", False),
        ("https://api.openai.com/v1", True),
        ("HTTPS://API.OPENAI.COM/v1", True),
        ("api.openai.com", True),
        ("https://my-resource.openai.azure.com/openai/v1", True),
        ("http://localhost:11434/v1", True),
        ("http://LOCALHOST:8000/v1", True),
        ("http://127.0.0.1:8000/v1", True),
        ("https://generativelanguage.googleapis.com/v1beta/openai/", False),
        ("https://api.groq.com/openai/v1", False),
        ("http://vllm.internal:8000/v1", False),
        ("https://evil.example/v1?localhost", False),
        ("https://evil.example/127.0.0.1/v1", False),
        ("https://api.openai.com.evil.example/v1", False),
        ("https://localhost.evil.example/v1", False),
        ("https://openai.azure.com.evil.example/v1", False),
        ("http://[::1", False),
    ],
)
def test_auto_allow_list(base_url: str | None, allowed: bool) -> None:
    assert cache_key_host_allowed(base_url) is allowed


@pytest.mark.parametrize(
    ("raw", "mode"),
    [
        *[(token, PromptCacheKeyMode.ENABLED) for token in ("true", "1", "yes", "ON", "enabled")],
        *[
            (token, PromptCacheKeyMode.DISABLED)
            for token in ("false", "0", "no", "Off", "disabled")
        ],
        *[(token, PromptCacheKeyMode.AUTO) for token in ("auto", "", None, "maybe")],
        (True, PromptCacheKeyMode.ENABLED),
        (False, PromptCacheKeyMode.DISABLED),
    ],
)
def test_key_mode_parse(raw: object, mode: PromptCacheKeyMode) -> None:
    assert PromptCacheKeyMode.parse(raw) is mode


@pytest.mark.parametrize("url", ["https://api.openai.com/v1", "https://unknown.example/v1", None])
def test_key_mode_resolution(url: str | None) -> None:
    assert PromptCacheKeyMode.ENABLED.allows(url) is True
    assert PromptCacheKeyMode.DISABLED.allows(url) is False
    assert PromptCacheKeyMode.AUTO.allows(url) is cache_key_host_allowed(url)


def test_key_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from atmosphere_harness import HarnessSettings

    monkeypatch.setenv("LLM_PROMPT_CACHE_KEY", "off")
    runtime = OpenAIRuntime.from_settings(
        HarnessSettings(
            llm_model="gpt-x", llm_base_url="https://api.openai.com/v1", llm_api_key="k"
        )
    )
    assert runtime.cache_key_mode is PromptCacheKeyMode.DISABLED
    assert runtime.sends_cache_key is False


# --- precedence, through a running host --------------------------------------------------------


def hints_seen(runtime: ScriptedRuntime) -> list[CacheHint | None]:
    return [request.cache_hint for request in runtime.requests]


AggressiveEndpoint = echo(
    ai_endpoint("/atmosphere/cache-aggressive", prompt_cache=PromptCache.AGGRESSIVE),
    "AggressiveEndpoint",
)


ConservativeEndpoint = echo(
    ai_endpoint("/atmosphere/cache-conservative", prompt_cache=PromptCache.CONSERVATIVE),
    "ConservativeEndpoint",
)


BareEndpoint = echo(ai_endpoint("/atmosphere/cache-bare"), "BareEndpoint")


DefaultAgent = echo(agent(name="cache-default-agent"), "DefaultAgent")


@agent(name="cache-caller-agent")
class CallerHintAgent:
    """The caller's hint wins over the endpoint default: none here, a keyed one there."""

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        if message == "no cache":
            await session.stream(message, cache_hint=CacheHint.none())
        else:
            await session.stream(message, cache_hint=CacheHint.aggressive(key="tenant-1", ttl=7200))


CASES = [
    # (agent class, path, settings, expected policy of the request hint or None)
    (
        AggressiveEndpoint,
        "/atmosphere/cache-aggressive",
        {"prompt_cache_default": "none"},
        "aggressive",
    ),
    # The annotation beats a setting that is not `none`, whichever is the stronger policy.
    (
        AggressiveEndpoint,
        "/atmosphere/cache-aggressive",
        {"prompt_cache_default": "conservative"},
        "aggressive",
    ),
    (
        ConservativeEndpoint,
        "/atmosphere/cache-conservative",
        {"prompt_cache_default": "aggressive"},
        "conservative",
    ),
    (BareEndpoint, "/atmosphere/cache-bare", {"prompt_cache_default": "aggressive"}, "aggressive"),
    (BareEndpoint, "/atmosphere/cache-bare", {}, None),
    (DefaultAgent, "/atmosphere/agent/cache-default-agent", {}, "conservative"),
    # The setting beats the CACHE feature's `conservative` seed on a default @agent.
    (
        DefaultAgent,
        "/atmosphere/agent/cache-default-agent",
        {"prompt_cache_default": "aggressive"},
        "aggressive",
    ),
    (DefaultAgent, "/atmosphere/agent/cache-default-agent", {"prompt_cache_default": "none"}, None),
    (DefaultAgent, "/atmosphere/agent/cache-default-agent", {"enabled": False}, None),
    (
        DefaultAgent,
        "/atmosphere/agent/cache-default-agent",
        {"enabled": False, "prompt_cache_default": "conservative"},
        "conservative",
    ),
    (BareEndpoint, "/atmosphere/cache-bare", {"enabled": True}, "conservative"),
]


@pytest.mark.parametrize(("cls", "path", "settings", "expected"), CASES)
async def test_effective_policy_reaches_the_request(
    workspace: Path, cls: type, path: str, settings: dict, expected: str | None
) -> None:
    runtime = ScriptedRuntime(["ok"])
    app = harness_app(runtime, workspace, agents=[cls], **settings)
    async with client_for(app) as client:
        frames = await post_prompt(client, path, "hi")
        info = (await client.get("/api/console/info")).json()
    assert frames[-1]["event"] == "complete"
    [hint] = hints_seen(runtime)
    assert (hint.policy.value if hint is not None else None) == expected
    truth = info["endpoints"][0]["harness"]["prompt-cache-default"]
    assert truth == (expected or "none"), "runtime truth reports the same effective policy"


async def test_a_caller_supplied_hint_wins(workspace: Path) -> None:
    runtime = ScriptedRuntime(["a", "b"])
    app = harness_app(runtime, workspace, agents=[CallerHintAgent])
    async with client_for(app) as client:
        await post_prompt(client, "/atmosphere/agent/cache-caller-agent", "keyed", "c-1")
        await post_prompt(client, "/atmosphere/agent/cache-caller-agent", "no cache", "c-1")
    keyed, off = hints_seen(runtime)
    assert keyed == CacheHint.aggressive(key="tenant-1", ttl=7200)
    assert off == CacheHint.none()
    openai_body = OpenAIRuntime("m", base_url="http://127.0.0.1:9/v1").wire_request(
        runtime.requests[1]
    )
    assert "prompt_cache_key" not in openai_body, "an explicit none switches the key off"


# --- the stable prefix: context never rewrites what was already sent --------------------------


ROUNDS: Key[int] = Key("test.rounds")


class RoundContext(Primitive):
    """Adds per-round context, as long-term memory or a plan reminder would."""

    name = "test-round-context"

    def attach(self, endpoint, host) -> None:
        endpoint.interceptors.append(self)

    async def before_request(self, run, request: ModelRequest) -> ModelRequest:
        rounds = run.state.get(ROUNDS, 0) + 1
        run.state.set(ROUNDS, rounds)
        return ModelRequest(
            request.system_prompt,
            request.messages,
            request.tools,
            request.conversation_id,
            (*request.context, f"Reminder for round {rounds}."),
            request.cache_hint,
            request.metadata,
        )

    async def after_turn(self, run, messages) -> None:
        return None


async def test_context_stays_behind_the_cached_prefix(workspace: Path) -> None:
    runtime = ScriptedRuntime(
        [[ToolCall("add", {"a": 1, "b": 2})], [ToolCall("add", {"a": 3, "b": 4})], "done"]
    )
    app = harness_app(runtime, workspace, primitives=[RoundContext()])
    async with client_for(app) as client:
        await post_prompt(client, PATH, "add twice")
    requests = runtime.requests
    assert [r.context for r in requests] == [(f"Reminder for round {n}.",) for n in (1, 2, 3)]
    assert {r.system_prompt for r in requests} == {SYSTEM}, "the system prompt never changes"

    anthropic = AnthropicRuntime("claude-fake", base_url="http://127.0.0.1:9", api_key="k")
    openai = OpenAIRuntime("m", base_url="http://127.0.0.1:9/v1")
    for before, after in itertools.pairwise(requests):
        old, new = anthropic.wire_request(before), anthropic.wire_request(after)
        assert old["system"] == new["system"]
        assert old["tools"] == new["tools"]
        sent = _without_context(_blocks(old), before.context[0])
        assert _blocks(new)[: len(sent)] == sent, "Anthropic: the sent blocks are a prefix"

        old_wire = openai.wire_request(before)["messages"]
        new_wire = openai.wire_request(after)["messages"]
        sent_messages = _without_context_message(old_wire, before.context[0])
        assert new_wire[: len(sent_messages)] == sent_messages, "OpenAI: the sent messages too"


def _blocks(body: dict) -> list[tuple[str, dict]]:
    return [
        (message["role"], block) for message in body["messages"] for block in message["content"]
    ]


def _without_context(blocks: list[tuple[str, dict]], context: str) -> list[tuple[str, dict]]:
    assert blocks[-1] == ("user", {"type": "text", "text": context}), "context is the last block"
    return blocks[:-1]


def _without_context_message(messages: list[dict], context: str) -> list[dict]:
    last = messages[-1]
    assert last["role"] == "user"
    assert last["content"].endswith(context), "context comes last"
    if last["content"] == context:
        return messages[:-1]
    return [*messages[:-1], {**last, "content": last["content"][: -len(context) - 2]}]
