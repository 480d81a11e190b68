"""Compaction strategies: what each keeps, that tool pairs never split, the summary model."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st

from atmosphere_harness import (
    HarnessSettings,
    Message,
    ModelRequest,
    ScriptedRuntime,
    ToolCall,
    agent,
    create_harness_router,
)
from atmosphere_harness._memory.compaction import (
    SUMMARIZER_SYSTEM_PROMPT,
    SlidingWindowCompaction,
    SummarizingCompaction,
    Summary,
    TokenWindowCompaction,
    build_strategy,
    estimate_tokens,
    local_summary,
    model_summarizer,
    token_budget,
    units,
)
from atmosphere_harness._memory.primitive import CONVERSATION_MEMORY_SERVICE
from atmosphere_harness._preset import COMPACTION
from atmosphere_harness._runtimes.anthropic import AnthropicRuntime
from atmosphere_harness._runtimes.base import AgentRuntime
from atmosphere_harness._runtimes.openai import OpenAIRuntime
from atmosphere_harness._runtimes.windows import model_context_window
from atmosphere_harness._settings import Compaction
from atmosphere_harness._web.deps import STATE_KEY
from tests.agents import echo
from tests.support import client_for, make_app
from tests.support import prompt as post_prompt


def chat(n: int) -> list[Message]:
    """`n` alternating user/assistant messages: u0, a1, u2, ..."""
    return [Message.user(f"u{i}") if i % 2 == 0 else Message.assistant(f"a{i}") for i in range(n)]


def tool_turn(tag: str, calls: int = 1) -> list[Message]:
    requests = [ToolCall("lookup", {"q": f"{tag}-{k}"}, id=f"{tag}-{k}") for k in range(calls)]
    return [
        Message.user(f"question {tag}"),
        Message.assistant("", requests),
        *[Message.tool(call, f"result {call.id}") for call in requests],
        Message.assistant(f"answer {tag}"),
    ]


def assert_pairs_intact(messages: Sequence[Message]) -> None:
    """Every tool result follows its request, every request has all its results."""
    open_calls: set[str] = set()
    for message in messages:
        if message.role == "tool":
            assert message.tool_call_id in open_calls, f"orphan tool result {message}"
            open_calls.discard(message.tool_call_id or "")
        else:
            assert not open_calls, f"request left unanswered before {message}"
            if message.role == "assistant" and message.tool_calls:
                open_calls = {call.id for call in message.tool_calls}
    assert not open_calls, "trailing unanswered request"


# --- sliding window (SlidingWindowCompactionTest) ---------------------------------------------


async def test_sliding_window_keeps_the_newest_messages() -> None:
    result = await SlidingWindowCompaction().compact(chat(10), 4)
    assert [m.content for m in result.messages] == ["u6", "a7", "u8", "a9"]


async def test_sliding_window_returns_short_histories_unchanged() -> None:
    history = chat(3)
    assert (await SlidingWindowCompaction().compact(history, 20)).messages == history


async def test_sliding_window_keeps_system_messages_first() -> None:
    history = [Message.system("rules"), *chat(6)]
    result = await SlidingWindowCompaction().compact(history, 3)
    assert [m.content for m in result.messages] == ["rules", "u4", "a5"]


async def test_sliding_window_drops_the_oldest_system_message_when_only_system_fits() -> None:
    history = [Message.system("s1"), Message.system("s2"), Message.user("hi")]
    result = await SlidingWindowCompaction().compact(history, 2)
    assert [m.content for m in result.messages] == ["s2", "hi"]


async def test_sliding_window_never_splits_a_tool_pair() -> None:
    history = [*tool_turn("a", calls=2), *tool_turn("b", calls=2)]
    # 10 messages; a window of 3 would cut "b" between its request and its two results.
    result = await SlidingWindowCompaction().compact(history, 3)
    assert_pairs_intact(result.messages)
    assert [m.content for m in result.messages] == ["answer b"]
    result = await SlidingWindowCompaction().compact(history, 4)
    assert [m.content for m in result.messages] == ["", "result b-0", "result b-1", "answer b"]


async def test_sliding_window_starts_on_a_user_turn_when_it_can() -> None:
    history = [*tool_turn("a"), *tool_turn("b")]
    result = await SlidingWindowCompaction().compact(history, 5)
    assert result.messages[0] == Message.user("question b")
    assert len(result.messages) == 4


def test_units_drop_orphans_and_unanswered_requests() -> None:
    call = ToolCall("lookup", {}, id="x")
    history = [
        Message.tool(ToolCall("lookup", {}, id="gone"), "orphan result"),
        Message.user("hi"),
        Message.assistant("thinking", [call]),
        Message.user("again"),
    ]
    flattened = [m for unit in units(history) for m in unit.messages]
    assert flattened == [Message.user("hi"), Message.assistant("thinking"), Message.user("again")]


# --- summarizing (SummarizingCompactionTest, LlmSummarizingCompactionTest) ------------------


async def test_summarizing_keeps_the_recent_window_of_six_by_default() -> None:
    strategy = SummarizingCompaction()
    assert strategy.recent_window == 6
    result = await strategy.compact(chat(30), 20)
    summary, *recent = result.messages
    assert summary.role == "system"
    assert summary.content.startswith("[Conversation summary of 24 earlier messages]\n")
    assert [m.content for m in recent] == [
        f"{'u' if i % 2 == 0 else 'a'}{i}" for i in range(24, 30)
    ]
    assert result.summary == Summary(summary.content.split("\n", 1)[1], 24)
    assert result.absorbed == 24


async def test_summarizing_is_a_copy_while_under_the_limit() -> None:
    history = chat(10)
    result = await SummarizingCompaction().compact(history, 20)
    assert result.messages == history
    assert result.summary is None


async def test_local_summary_cuts_long_lines_at_100_chars() -> None:
    long = "x" * 150
    text = local_summary(None, [Message.user(long), Message.assistant("short")])
    assert text == f"user: {'x' * 100}...\nassistant: short"


async def test_a_new_summary_absorbs_the_previous_one() -> None:
    strategy = SummarizingCompaction(recent_window=2)
    first = await strategy.compact(chat(8), 4)
    assert first.summary is not None
    later = await strategy.compact(chat(8)[first.absorbed :] + chat(4), 4, first.summary)
    summaries = [m for m in later.messages if m.role == "system"]
    assert len(summaries) == 1, "summaries never pile up"
    assert later.summary is not None
    assert later.summary.covered == first.summary.covered + later.absorbed
    assert later.summary.text.startswith(first.summary.text)


async def test_summarizing_never_splits_a_tool_pair() -> None:
    history = [*tool_turn("a", calls=3), *tool_turn("b", calls=3)]
    result = await SummarizingCompaction(recent_window=3).compact(history, 6)
    assert_pairs_intact(result.messages[1:])
    assert result.messages[0].role == "system"


async def test_the_model_writes_the_summary() -> None:
    runtime = ScriptedRuntime((), default=lambda request: "They discussed tides.")
    strategy = SummarizingCompaction(model_summarizer(runtime, timeout=5), recent_window=2)
    result = await strategy.compact(chat(10), 4)
    assert result.messages[0].content.endswith("They discussed tides.")
    request = runtime.requests[0]
    assert request.system_prompt == SUMMARIZER_SYSTEM_PROMPT
    assert "user: u0" in request.messages[0].content
    assert request.tools == ()


@pytest.mark.parametrize("failure", ["error", "timeout", "blank"])
async def test_the_summary_fails_open_to_the_local_one(failure: str) -> None:
    async def turn(request: ModelRequest) -> str:
        if failure == "error":
            raise RuntimeError("provider down")
        if failure == "timeout":
            await asyncio.sleep(10)
        return "   "

    runtime = ScriptedRuntime((), default=turn)
    strategy = SummarizingCompaction(model_summarizer(runtime, timeout=0.05), recent_window=2)
    result = await strategy.compact(chat(10), 4)
    assert result.messages[0].content.endswith(local_summary(None, chat(10)[:8]))


# --- token window (TokenWindowCompactionTest) ----------------------------------------------


async def test_token_window_keeps_what_fits_the_budget() -> None:
    history = [
        Message.user("a" * 400),
        Message.assistant("b" * 400),
        Message.user("c" * 40),
        Message.assistant("d" * 40),
    ]
    # 400 chars ~ 104 tokens, 40 chars ~ 14 (plus framing).
    kept = await TokenWindowCompaction(130).compact(history, 20)
    assert [m.content[0] for m in kept.messages] == ["c", "d"]
    kept = await TokenWindowCompaction(240).compact(history, 20)
    assert [m.content[0] for m in kept.messages] == ["a", "b", "c", "d"]
    # b, c and d fit 200, but the view starts on the user turn.
    kept = await TokenWindowCompaction(200).compact(history, 20)
    assert [m.content[0] for m in kept.messages] == ["c", "d"]


async def test_token_window_also_honours_the_message_cap() -> None:
    result = await TokenWindowCompaction(1_000_000).compact(chat(10), 4)
    assert len(result.messages) == 4


def test_token_estimate_counts_tool_arguments() -> None:
    call = ToolCall("write_file", {"content": "x" * 400})
    assert estimate_tokens(Message.assistant("", [call])) > 100


# --- selection (CompactionConfigTest) -------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "sliding-window"),
        ("", "sliding-window"),
        ("sliding-window", "sliding-window"),
        ("SUMMARIZING", "summarizing"),
        ("Token-Window", "token-window"),
        ("bogus", "sliding-window"),
    ],
)
def test_the_setting_selects_the_strategy(value: str | None, expected: str) -> None:
    settings_ = HarnessSettings(compaction=value) if value is not None else HarnessSettings()
    strategy = build_strategy(
        settings_.compaction, runtime=None, model_timeout=1, recent_window=6, context_tokens=1000
    )
    assert strategy.name == expected


def test_recent_window_setting_reaches_the_strategy() -> None:
    strategy = build_strategy(
        Compaction.SUMMARIZING, runtime=None, model_timeout=1, recent_window=3, context_tokens=9
    )
    assert isinstance(strategy, SummarizingCompaction)
    assert strategy.recent_window == 3


# --- the property -------------------------------------------------------------------------

_call_ids = iter(range(10**9))


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    """Random histories: chat, tool batches (some cut short), stray tool results, summaries."""
    messages: list[Message] = []
    for kind in draw(st.lists(st.sampled_from("uatxos"), max_size=40)):
        if kind == "u":
            messages.append(Message.user("q"))
        elif kind == "a":
            messages.append(Message.assistant("a"))
        elif kind in "tx":
            calls = [
                ToolCall("f", {}, id=f"c{next(_call_ids)}") for _ in range(draw(st.integers(1, 3)))
            ]
            messages.append(Message.assistant("", calls))
            answered = calls if kind == "t" else calls[: draw(st.integers(0, len(calls) - 1))]
            messages.extend(Message.tool(call, "r") for call in answered)
        elif kind == "o":
            messages.append(Message.tool(ToolCall("f", {}, id="stray"), "r"))
        else:
            messages.append(Message.system("s"))
    return messages


@settings(max_examples=300, deadline=None)
@given(history=histories(), max_messages=st.integers(2, 12), start=st.integers(0, 40))
def test_no_strategy_ever_orphans_a_tool_message(
    history: list[Message], max_messages: int, start: int
) -> None:
    # A storage tail can start anywhere, even between a request and its results.
    tail = history[min(start, len(history)) :]
    strategies = [
        SlidingWindowCompaction(),
        SummarizingCompaction(recent_window=3),
        TokenWindowCompaction(20),
    ]
    for strategy in strategies:
        result = asyncio.run(strategy.compact(tail, max_messages))
        assert_pairs_intact(result.messages)
        if strategy.name == "sliding-window":
            # Over the cap only when the newest unit alone is (it is never cut).
            talk = [u for u in units(result.messages) if u.messages[0].role != "system"]
            assert len(result.messages) <= max_messages or len(talk) == 1


def test_the_token_budget_setting_reaches_the_strategy() -> None:
    settings_ = HarnessSettings(compaction="token-window", context_window_tokens=500)
    strategy = build_strategy(
        settings_.compaction,
        runtime=None,
        model_timeout=1,
        recent_window=6,
        context_tokens=settings_.context_window_tokens,
    )
    assert isinstance(strategy, TokenWindowCompaction)
    assert strategy.budget_tokens == 500


# --- token-window budget by model (CompactionConfigTest) ------------------------------------


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("claude-sonnet-4-5", 200_000),
        ("claude-3-5-haiku-latest", 200_000),
        ("gpt-4o", 128_000),
        ("gpt-4o-mini-2024-07-18", 128_000),
        ("gpt-4.1-nano", 1_047_576),
        ("gpt-5-mini", 400_000),
        ("gpt-5-chat-latest", 128_000),  # the longest prefix wins over gpt-5
        ("o1-mini", 128_000),
        ("o3-mini", 200_000),
        ("GPT-4O", 128_000),
        ("openai/gpt-4o", 128_000),
        ("anthropic/claude-opus-4-1", 200_000),
        ("llama3.1", None),
        ("my-azure-deployment", None),
        ("gpt-oss:20b", None),
        ("", None),
        (None, None),
    ],
)
def test_the_context_window_table(model: str | None, window: int | None) -> None:
    assert model_context_window(model) == window


def test_provider_runtimes_know_their_models_window() -> None:
    assert AnthropicRuntime("claude-sonnet-4-5", api_key="k").context_window == 200_000
    assert OpenAIRuntime("gpt-4.1-mini", api_key="k").context_window == 1_047_576
    local = OpenAIRuntime("llama3.1", base_url="http://localhost:11434/v1")
    assert local.context_window is None


class WindowedRuntime(ScriptedRuntime):
    """A runtime of one's own that declares its model's context window."""

    context_window: int | None = 100


@pytest.mark.parametrize(
    ("settings_", "runtime", "budget"),
    [
        ({}, AnthropicRuntime("claude-sonnet-4-5", api_key="k"), 200_000),
        ({}, OpenAIRuntime("gpt-4o-mini", api_key="k"), 128_000),
        ({}, WindowedRuntime(), 100),
        # Unknown models, the scripted runtime and no runtime: the setting's default.
        ({}, OpenAIRuntime("llama3.1", base_url="http://localhost:11434/v1"), 128_000),
        ({}, ScriptedRuntime(), 128_000),
        ({}, None, 128_000),
        # An explicitly set budget wins over the table, even when it equals the default.
        ({"context_window_tokens": 500}, AnthropicRuntime("claude-sonnet-4-5", api_key="k"), 500),
        ({"context_window_tokens": 128_000}, OpenAIRuntime("gpt-4.1", api_key="k"), 128_000),
        ({"context_window_tokens": 9_000}, ScriptedRuntime(), 9_000),
    ],
)
def test_token_budget_precedence(
    settings_: dict, runtime: AgentRuntime | None, budget: int
) -> None:
    assert token_budget(HarnessSettings(**settings_), runtime) == budget


def test_a_budget_from_the_environment_counts_as_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_CONTEXT_WINDOW_TOKENS", "5000")
    runtime = AnthropicRuntime("claude-sonnet-4-5", api_key="k")
    assert token_budget(HarnessSettings(), runtime) == 5000


WindowEcho = echo(agent(name="window-echo"), "WindowEcho")


WINDOW_ECHO = "/atmosphere/agent/window-echo"


@pytest.mark.parametrize(
    ("settings_", "model", "budget"),
    [
        ({"llm_runtime": "anthropic", "llm_model": "claude-sonnet-4-5"}, "claude", 200_000),
        ({"llm_runtime": "openai", "llm_model": "gpt-4.1-mini"}, "openai", 1_047_576),
        (
            {"llm_model": "llama3.1", "llm_base_url": "http://localhost:11434/v1"},
            "local",
            128_000,
        ),
        (
            {"llm_model": "claude-sonnet-4-5", "context_window_tokens": 32_000},
            "explicit",
            32_000,
        ),
        ({"llm_runtime": "scripted"}, "scripted", 128_000),
    ],
)
async def test_the_endpoint_strategy_gets_the_budget_of_the_resolved_runtime(
    workspace: Path, settings_: dict, model: str, budget: int
) -> None:
    settings_ = {"llm_api_key": "k", **settings_}
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace, compaction="token-window", **settings_),
            agents=[WindowEcho],
        )
    )
    async with app.router.lifespan_context(app) as state:
        host = state[STATE_KEY]
        strategy = host.endpoint(WINDOW_ECHO).services.require(CONVERSATION_MEMORY_SERVICE).strategy
        truth = host.truth.endpoint(WINDOW_ECHO)[COMPACTION]
    assert isinstance(strategy, TokenWindowCompaction)
    assert strategy.budget_tokens == budget, model
    assert truth == "token-window"


@pytest.mark.parametrize(
    ("runtime", "settings_", "kept"),
    [
        (WindowedRuntime, {}, False),  # the model's 100-token window drops the long turn
        (ScriptedRuntime, {}, True),  # no known window: the 128000 default keeps it
        (WindowedRuntime, {"context_window_tokens": 100_000}, True),  # explicit setting wins
    ],
)
async def test_the_model_window_shapes_what_is_sent(
    workspace: Path, runtime: type[ScriptedRuntime], settings_: dict, kept: bool
) -> None:
    model = runtime(default=lambda request: "ok")
    app = make_app([WindowEcho], runtime=model, workspace=workspace, compaction="token-window",
                   **settings_)  # fmt: skip
    long_turn = "a" * 400  # ~104 tokens
    async with client_for(app) as client:
        await post_prompt(client, WINDOW_ECHO, long_turn, "c1")
        await post_prompt(client, WINDOW_ECHO, "b" * 40, "c1")
    sent = [message.content for message in model.requests[-1].messages]
    assert sent[-1] == "b" * 40
    assert (long_turn in sent) is kept
