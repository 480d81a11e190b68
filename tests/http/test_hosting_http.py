"""End to end over a real uvicorn server on loopback: prompts, frames, tools, errors."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx2
import pytest

from atmosphere_harness import (
    ModelRequest,
    ScriptedRuntime,
    StreamingSession,
    ToolCall,
    ToolContext,
    agent,
    ai_endpoint,
    prompt,
    skill,
    tool,
)
from atmosphere_harness._web import sse as sse_module
from tests.agents import echo
from tests.firehose import FRAMES, Firehose, FirehoseEndpoint, settled, slow_connection
from tests.firehose import PATH as FIREHOSE
from tests.support import client_for, make_app, of_type, parse_sse, serve
from tests.support import prompt as post_prompt

CALLS: list[str] = []


@tool
async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    CALLS.append(f"add({a},{b})")
    return a + b


@tool
async def explode(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"boom: {reason}")


# A bare loop (`harness=()`): these tests pin the core loop, so only the agent's own tools exist.
@agent(name="calculator", harness=())
class Calculator:
    tools = [add, explode]

    @tool
    async def whoami(self, context: ToolContext) -> str:
        """Report the conversation this call belongs to."""
        return f"{type(self).__name__} in {context.conversation_id}"

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


PATH = "/atmosphere/agent/calculator"


async def test_tool_round_trip_streams_frames_in_order(workspace: Path) -> None:
    runtime = ScriptedRuntime([[ToolCall("add", {"a": 2, "b": 3})], "The sum is 5."])
    async with client_for(make_app([Calculator], runtime=runtime, workspace=workspace)) as client:
        response = await client.post(PATH, json={"message": "add 2 and 3"})
        frames = parse_sse(response.text)
    kinds = [frame["event"] for frame in frames]
    assert kinds[:2] == ["tool-start", "tool-result"]
    assert set(kinds[2:-1]) == {"text"}
    assert kinds[-1] == "complete"
    assert [frame["seq"] for frame in frames] == list(range(1, len(frames) + 1))
    conversation = response.headers["x-conversation-id"]
    assert {frame["conversationId"] for frame in frames} == {conversation}
    assert len({frame["sessionId"] for frame in frames}) == 1
    start, result = frames[0]["data"], frames[1]["data"]
    assert start["tool"] == "add"
    assert start["arguments"] == {"a": 2, "b": 3}
    assert result["result"] == "5"
    assert result["toolCallId"] == start["toolCallId"]
    assert "".join(f["data"]["text"] for f in of_type(frames, "text")) == "The sum is 5."
    assert frames[-1]["data"]["summary"] == "The sum is 5."
    assert frames[-1]["data"]["usage"]["inputTokens"] > 0
    # The runtime saw the tool result fed back, in OpenAI-like message order.
    second = runtime.requests[1]
    assert [m.role for m in second.messages] == ["user", "assistant", "tool"]
    assert second.messages[2].content == "5"
    assert {"add", "explode", "whoami"} <= {t.name for t in second.tools}


async def test_raising_tool_yields_error_result_and_the_run_completes(workspace: Path) -> None:
    runtime = ScriptedRuntime([[ToolCall("explode", {"reason": "test"})], "It failed, sorry."])
    async with client_for(make_app([Calculator], runtime=runtime, workspace=workspace)) as client:
        frames = await post_prompt(client, PATH, "explode")
    result = json.loads(of_type(frames, "tool-result")[0]["data"]["result"])
    assert result == {"error": "tool_error", "tool": "explode", "message": "boom: test"}
    assert frames[-1]["event"] == "complete"


async def test_missing_required_argument_yields_invalid_arguments(workspace: Path) -> None:
    runtime = ScriptedRuntime([[ToolCall("add", {"a": 1})], "I need b."])
    async with client_for(make_app([Calculator], runtime=runtime, workspace=workspace)) as client:
        frames = await post_prompt(client, PATH, "add")
    result = of_type(frames, "tool-result")[0]["data"]["result"]
    assert result == (
        '{"error":"invalid_arguments","tool":"add","details":["missing required parameter \'b\'"]}'
    )
    assert runtime.requests[1].messages[-1].content == result, "the model got the same text"
    assert frames[-1]["event"] == "complete"


async def test_harmless_argument_mistakes_are_coerced(workspace: Path) -> None:
    runtime = ScriptedRuntime([[ToolCall("add", {"a": "4", "b": 5.0})], "9"])
    async with client_for(make_app([Calculator], runtime=runtime, workspace=workspace)) as client:
        frames = await post_prompt(client, PATH, "add")
    assert of_type(frames, "tool-result")[0]["data"]["result"] == "9"


async def test_wrong_type_and_unknown_tool_are_reported(workspace: Path) -> None:
    runtime = ScriptedRuntime(
        [[ToolCall("add", {"a": "four", "b": 1}), ToolCall("nope", {})], "done"]
    )
    async with client_for(make_app([Calculator], runtime=runtime, workspace=workspace)) as client:
        frames = await post_prompt(client, PATH, "bad")
    results = [json.loads(f["data"]["result"]) for f in of_type(frames, "tool-result")]
    assert results[0]["error"] == "invalid_arguments"
    assert results[0]["details"] == ["parameter 'a' must be integer, got string"]
    assert results[1]["error"] == "unknown_tool"
    assert "Available tools: add, explode, whoami" in results[1]["message"]


async def test_tool_method_gets_its_instance_and_context(workspace: Path) -> None:
    runtime = ScriptedRuntime([[ToolCall("whoami", {})], "ok"])
    async with client_for(make_app([Calculator], runtime=runtime, workspace=workspace)) as client:
        frames = await post_prompt(client, PATH, "who", conversation_id="conv-1")
    assert of_type(frames, "tool-result")[0]["data"]["result"] == "Calculator in conv-1"
    assert frames[0]["conversationId"] == "conv-1"


SLOW_STARTED = asyncio.Event()
SLOW_CANCELLED = asyncio.Event()


@tool
async def slow() -> str:
    """Waits for a very long time."""
    SLOW_STARTED.set()
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        SLOW_CANCELLED.set()
        raise
    return "finished"


Sleeper = echo(agent(name="sleeper"), "Sleeper", tools=[slow])


async def test_tool_timeout_returns_the_reference_json(workspace: Path) -> None:
    runtime = ScriptedRuntime([[ToolCall("slow", {})], "gave up"])
    app = make_app([Sleeper], runtime=runtime, workspace=workspace, tool_execution_timeout=0.2)
    async with client_for(app) as client:
        frames = await post_prompt(client, "/atmosphere/agent/sleeper", "wait")
    result = json.loads(of_type(frames, "tool-result")[0]["data"]["result"])
    assert result["error"] == "tool_timeout"
    assert result["tool"] == "slow"
    assert result["message"] == "Tool execution exceeded the 0.2s deadline and was cancelled"
    assert frames[-1]["event"] == "complete"


async def test_client_disconnect_cancels_the_run(workspace: Path) -> None:
    SLOW_STARTED.clear()
    SLOW_CANCELLED.clear()
    runtime = ScriptedRuntime([[ToolCall("slow", {})], "never"])
    app = make_app([Sleeper], runtime=runtime, workspace=workspace)
    async with serve(app) as base:
        async with (
            httpx2.AsyncClient(base_url=base, timeout=30) as client,
            client.stream(
                "POST", "/atmosphere/agent/sleeper", json={"message": "wait"}
            ) as response,
        ):
            async for line in response.aiter_lines():
                if line.startswith("event: tool-start"):
                    break
        await asyncio.wait_for(SLOW_STARTED.wait(), 5)
        await asyncio.wait_for(SLOW_CANCELLED.wait(), 10)


async def test_a_stalled_sse_client_is_cut_off_and_never_pins_the_server(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that posts a prompt and then reads nothing: the run waits for it (bounded
    buffers, so memory stays flat), other clients are served meanwhile, and after the send
    timeout the server drops the stream and cancels the run."""
    monkeypatch.setattr(sse_module, "SEND_TIMEOUT", 2.0)
    Firehose.reset()
    app = make_app(
        [FirehoseEndpoint, Calculator], runtime=ScriptedRuntime(["hi"]), workspace=workspace
    )
    async with serve(app) as base:
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await slow_connection(base)
        body = json.dumps({"message": "flood me"}).encode()
        writer.write(
            f"POST {FIREHOSE} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        try:
            stuck_at = await settled()
            assert 0 < stuck_at < FRAMES, "the run waits for the stalled client"

            async with httpx2.AsyncClient(base_url=base, timeout=30) as client:
                frames = await post_prompt(client, PATH, "meanwhile")
            assert frames[-1]["event"] == "complete", "another client is served meanwhile"

            await asyncio.wait_for(Firehose.cancelled.wait(), 20)
            assert Firehose.emitted < FRAMES
            while await asyncio.wait_for(reader.read(1 << 20), 15):
                pass  # the server closed the connection: the reads end with b""
        finally:
            writer.close()


async def test_round_limit_ends_with_an_error_frame(workspace: Path) -> None:
    runtime = ScriptedRuntime((), default=lambda request: [ToolCall("add", {"a": 1, "b": 1})])
    app = make_app([Calculator], runtime=runtime, workspace=workspace, max_tool_rounds=3)
    async with client_for(app) as client:
        frames = await post_prompt(client, PATH, "loop forever")
    assert len(of_type(frames, "tool-result")) == 3
    assert frames[-1]["event"] == "error"
    assert "stopped after 3 model turns" in frames[-1]["data"]["message"]


async def test_exhausted_script_is_an_error_frame_not_a_crash(workspace: Path) -> None:
    async with client_for(
        make_app([Calculator], runtime=ScriptedRuntime([]), workspace=workspace)
    ) as client:
        frames = await post_prompt(client, PATH, "hello")
        again = await post_prompt(client, PATH, "hello again")
    assert frames[-1]["event"] == "error"
    assert "no turn 1" in frames[-1]["data"]["message"]
    assert again[-1]["event"] == "error", "the server keeps serving"


async def test_bad_requests_answer_json_errors(workspace: Path) -> None:
    async with client_for(
        make_app([Calculator], runtime=ScriptedRuntime(), workspace=workspace)
    ) as c:
        for body in (
            {"message": "hi", "conversationId": "../etc"},
            {"message": "hi", "conversationId": "a/b"},
            {"message": ""},
            {},
        ):
            response = await c.post(PATH, json=body)
            assert response.status_code == 422, body
            assert response.json()["error"]
        missing = await c.post("/atmosphere/agent/unknown", json={"message": "hi"})
        assert missing.status_code == 404


class Recorder:
    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []


@ai_endpoint("/atmosphere/custom")
class CustomReplies:
    """A prompt method that speaks for itself instead of calling the model loop."""

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.send("echo: ")
        await session.send(message)
        await session.emit("custom", {"length": len(message)})
        await session.complete("custom summary")
        await session.send("dropped after complete")


@ai_endpoint("/atmosphere/returns")
class ReturnsText:
    @prompt
    async def chat(self, message: str) -> str:
        return message.upper()


@ai_endpoint("/atmosphere/broken")
class Broken:
    @prompt
    async def chat(self, message: str) -> None:
        raise RuntimeError("the prompt method broke")


async def test_prompt_methods_can_speak_for_themselves(workspace: Path) -> None:
    app = make_app(
        [CustomReplies, ReturnsText, Broken], runtime=ScriptedRuntime(), workspace=workspace
    )
    async with client_for(app) as client:
        custom = await post_prompt(client, "/atmosphere/custom", "hi")
        returned = await post_prompt(client, "/atmosphere/returns", "hi")
        broken = await post_prompt(client, "/atmosphere/broken", "hi")
    assert [f["event"] for f in custom] == ["text", "text", "custom", "complete"]
    assert custom[2]["data"] == {"length": 2}
    assert custom[-1]["data"]["summary"] == "custom summary"
    assert [f["event"] for f in returned] == ["text", "complete"]
    assert returned[0]["data"]["text"] == "HI"
    assert broken[-1] == {**broken[-1], "event": "error"}
    assert broken[-1]["data"]["message"] == "the prompt method broke"


@agent(name="researcher")
class Researcher:
    @skill("research")
    async def research(self, message: str) -> str:
        return f"findings on {message}"


async def test_headless_agent_is_not_hosted(workspace: Path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="atmosphere_harness"):
        app = make_app([Researcher, Calculator], runtime=ScriptedRuntime(), workspace=workspace)
        async with client_for(app) as client:
            info = (await client.get("/api/console/info")).json()
            response = await client.post("/atmosphere/agent/researcher", json={"message": "x"})
    assert response.status_code in (404, 405)
    assert [e["path"] for e in info["endpoints"]] == [PATH]
    assert any("headless agent" in r.getMessage() for r in caplog.records)


async def test_conversation_prompts_run_one_at_a_time(workspace: Path) -> None:
    order: list[str] = []

    async def turn(request: ModelRequest) -> str:
        order.append("start " + request.messages[-1].content)
        await asyncio.sleep(0.05)
        order.append("end " + request.messages[-1].content)
        return "ok"

    runtime = ScriptedRuntime((), default=turn)
    async with client_for(make_app([Calculator], runtime=runtime, workspace=workspace)) as client:
        await asyncio.gather(
            post_prompt(client, PATH, "one", conversation_id="same"),
            post_prompt(client, PATH, "two", conversation_id="same"),
        )
    assert order in (
        ["start one", "end one", "start two", "end two"],
        ["start two", "end two", "start one", "end one"],
    )


def test_sync_prompt_method_is_rejected() -> None:
    def chat(self: object, message: str) -> None: ...

    with pytest.raises(TypeError, match="async def"):
        prompt(chat)  # type: ignore[arg-type]


def test_two_prompt_methods_are_rejected() -> None:
    class TwoPrompts:
        @prompt
        async def a(self, message: str) -> None: ...

        @prompt
        async def b(self, message: str) -> None: ...

    with pytest.raises(TypeError, match="several @prompt methods"):
        agent(name="two-prompts")(TwoPrompts)


def test_invalid_names_and_paths_are_rejected() -> None:
    with pytest.raises(ValueError, match="invalid agent name"):
        agent(name="../escape")
    with pytest.raises(ValueError, match="invalid ai_endpoint path"):
        ai_endpoint("no-slash")
    with pytest.raises(ValueError, match="max_history_messages"):
        ai_endpoint("/ok", max_history_messages=1)
