"""The scripted runtime's offline demo model and its bounded request log.

`ScriptedRuntime.demo()` picks a host tool named in the message (never a built-in one), fills
its required arguments from the message, and answers with the tool's result; the getting-started
example's `weather` tool runs over real HTTP with no API key. `requests` keeps the last
`max_requests` model requests only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import ScriptedRuntime, agent, coordinator
from atmosphere_harness._runtimes.base import Message, ModelRequest, ToolSpec
from atmosphere_harness._runtimes.demo_tools import (
    BUILTIN_TOOL_NAMES,
    fill_arguments,
    pick_user_tool,
)
from atmosphere_harness._runtimes.scripted import DEFAULT_MAX_REQUESTS, demo_turn
from tests.agents import echo
from tests.support import client_for, doc_example, make_app, of_type, prompt

GETTING_STARTED = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"
DOC_MESSAGE = "what is the weather in Paris?"


def _spec(name: str, description: str, **properties: Any) -> ToolSpec:
    required = [key for key, value in properties.items() if not value.pop("optional", False)]
    schema = {"type": "object", "properties": properties, "required": required}
    return ToolSpec(name, description, schema)


WEATHER = _spec("weather", "Current weather for a city.", city={"type": "string"})
ORDER = _spec(
    "lookup_order",
    "Find a customer order by its number.",
    order_id={"type": "integer"},
    verbose={"type": "boolean", "optional": True},
)
TRANSLATE = _spec(
    "translate",
    "Translate text into another language.",
    text={"type": "string"},
    language={"type": "string", "enum": ["fr", "de", "es"]},
)
WRITE_FILE = _spec("write_file", "Write a file.", path={"type": "string"})


@pytest.mark.parametrize(
    ("message", "tool_name", "arguments"),
    [
        ("what's the weather in Paris", "weather", {"city": "Paris"}),
        ("What is the Weather in New York today?", "weather", {"city": "New York"}),
        ("what's the weather in new york today?", "weather", {"city": "new york"}),
        ("Weather in Paris?", "weather", {"city": "Paris"}),
        ("weather for city: Montreal", "weather", {"city": "Montreal"}),
        ("how is the weather near 'San Francisco'", "weather", {"city": "San Francisco"}),
        ("where is my order 1234?", "lookup_order", {"order_id": 1234}),
        ("look up order 77 for this customer", "lookup_order", {"order_id": 77}),
        ('translate "good morning" to de', "translate", {"text": "good morning", "language": "de"}),
    ],
)
def test_a_named_host_tool_is_picked_and_its_required_arguments_filled(
    message: str, tool_name: str, arguments: dict[str, Any]
) -> None:
    picked = pick_user_tool(message, [WRITE_FILE, WEATHER, ORDER, TRANSLATE])
    assert picked is not None
    assert picked.name == tool_name
    assert fill_arguments(message, picked) == arguments


@pytest.mark.parametrize(
    "message", ["hello there", "save this to a file", "write_file notes.md", "what's new?"]
)
def test_no_tool_is_picked_when_the_message_names_none_of_the_hosts(message: str) -> None:
    assert pick_user_tool(message, [WRITE_FILE, WEATHER, ORDER, TRANSLATE]) is None


def test_a_description_word_shared_by_two_tools_is_not_distinctive() -> None:
    forecast = _spec("forecast", "Weather forecast for a city.", city={"type": "string"})
    radar = _spec("radar", "Weather radar images for a region.", region={"type": "string"})
    assert pick_user_tool("any weather news?", [forecast, radar]) is None
    assert pick_user_tool("show the radar for Quebec", [forecast, radar]) is radar


def _request(message: str, tools: tuple[ToolSpec, ...], *after: Message) -> ModelRequest:
    return ModelRequest(system_prompt="", messages=(Message.user(message), *after), tools=tools)


def test_the_demo_calls_the_tool_then_answers_with_its_result() -> None:
    first = demo_turn(_request("what's the weather in Paris", (WEATHER,)))
    assert isinstance(first, list)
    assert len(first) == 1
    call = first[0]
    assert (call.name, dict(call.arguments)) == ("weather", {"city": "Paris"})
    second = demo_turn(
        _request(
            "what's the weather in Paris",
            (WEATHER,),
            Message(role="assistant", tool_calls=(call,)),
            Message(role="tool", content="Sunny in Paris", tool_call_id=call.id, name="weather"),
        )
    )
    assert second == "The weather tool says: Sunny in Paris"


def test_the_built_in_demo_behaviours_come_first() -> None:
    planning = (WEATHER, _spec("write_todos", "Plan."), WRITE_FILE)
    planned = demo_turn(_request("plan the weather report and save it to a file", planning))
    assert isinstance(planned, list)
    assert planned[0].name == "write_todos"
    assert demo_turn(_request("hello", (WEATHER,))) == "You said: hello"


async def test_the_built_in_tool_names_are_exactly_the_harness_tools(workspace: Path) -> None:
    member = echo(agent(name="member"), "Member")
    lead = echo(coordinator(name="lead", fleet=[member]), "Lead")
    async with client_for(make_app([lead, member], workspace=workspace)) as client:
        info = (await client.get("/api/console/info")).json()
    tools = next(e["tools"] for e in info["endpoints"] if e["owner"] == "lead")
    assert set(tools) == BUILTIN_TOOL_NAMES


async def test_the_getting_started_weather_tool_runs_offline_over_http(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_WORKSPACE_ROOT", str(workspace))
    app = doc_example(GETTING_STARTED, "getting_started_app").app
    async with client_for(app) as client:
        info = (await client.get("/api/console/info")).json()
        frames = await prompt(client, "/atmosphere/agent/assistant", DOC_MESSAGE)
        echoed = await prompt(client, "/atmosphere/agent/assistant", "hello")
    assert f'{{"message": "{DOC_MESSAGE}"}}' in GETTING_STARTED.read_text(encoding="utf-8")
    assert info["runtime"]["name"] == "scripted"
    [start] = of_type(frames, "tool-start")
    assert start["data"]["tool"] == "weather"
    assert start["data"]["arguments"] == {"city": "Paris"}
    [result] = of_type(frames, "tool-result")
    assert result["data"]["result"] == "Sunny in Paris"
    text = "".join(frame["data"]["text"] for frame in of_type(frames, "text"))
    assert text == "The weather tool says: Sunny in Paris"
    assert frames[-1]["event"] == "complete"
    assert of_type(echoed, "tool-start") == []
    assert "".join(f["data"]["text"] for f in of_type(echoed, "text")) == "You said: hello"


# --- bounded memory: `requests` keeps the last N -------------------------------------------


def _turn(conversation: str) -> ModelRequest:
    return ModelRequest(
        system_prompt="", messages=(Message.user("hi"),), conversation_id=conversation
    )


async def test_requests_keeps_only_the_last_max_requests() -> None:
    runtime = ScriptedRuntime(default=lambda request: "ok", max_requests=3)
    assert runtime.requests == []
    for n in range(5):
        await runtime.complete(_turn(f"c{n}"))
    assert [r.conversation_id for r in runtime.requests] == ["c2", "c3", "c4"]


async def test_the_default_bound_is_256_and_zero_keeps_none() -> None:
    demo = ScriptedRuntime.demo()
    for n in range(DEFAULT_MAX_REQUESTS + 44):
        await demo.complete(_turn(f"c{n}"))
    assert DEFAULT_MAX_REQUESTS == 256
    assert len(demo.requests) == 256
    assert demo.requests[0].conversation_id == "c44"
    assert demo.requests[-1].conversation_id == f"c{DEFAULT_MAX_REQUESTS + 43}"
    silent = ScriptedRuntime(default=lambda request: "ok", max_requests=0)
    await silent.complete(_turn("c"))
    assert silent.requests == []
    with pytest.raises(ValueError, match="max_requests"):
        ScriptedRuntime(max_requests=-1)
