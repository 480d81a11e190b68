"""Per-agent models and fallback chains against fake OpenAI and Anthropic servers on loopback.

The official SDKs run their whole HTTP path (retries off, so one scripted failure is one
failure); the harness app is served over real HTTP too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import (
    AnthropicRuntime,
    FallbackRuntime,
    Message,
    ModelRequest,
    OpenAIRuntime,
    ScriptedRuntime,
    StreamingSession,
    prompt,
)
from atmosphere_harness._registry import AgentRegistry
from tests.fake_providers import (
    FakeProvider,
    Status,
    Stream,
    anthropic_text,
    fake_anthropic,
    fake_openai,
    openai_text,
    openai_tool_calls,
)
from tests.runtime_support import without_provider_credentials
from tests.support import client_for, make_app, of_type, serve
from tests.support import prompt as post_prompt

PATH = "/atmosphere/agent/chained"


def openai_at(base: str, model: str = "gpt-fake") -> OpenAIRuntime:
    return OpenAIRuntime(model, base_url=f"{base}/v1", api_key="sk-test", max_retries=0)


def anthropic_at(base: str, model: str = "claude-fake") -> AnthropicRuntime:
    return AnthropicRuntime(model, base_url=base, api_key="k", max_retries=0)


def chained_agent(model: Any, *fallbacks: Any) -> type:
    registry = AgentRegistry()

    @registry.agent(name="chained", harness=(), model=model, fallback_models=fallbacks)
    class Chained:
        @prompt
        async def chat(self, message: str, session: StreamingSession) -> None:
            await session.stream(message)

    return Chained


async def run_chain(
    workspace: Path, openai: FakeProvider, anthropic: FakeProvider
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One prompt to an agent whose model is the OpenAI fake, falling back to the Anthropic one;
    its frames and the console's runtime truth."""
    async with serve(openai.app) as first, serve(anthropic.app) as second:
        agent_cls = chained_agent(openai_at(first), anthropic_at(second))
        app = make_app([agent_cls], runtime=ScriptedRuntime(["never asked"]), workspace=workspace)
        async with client_for(app) as client:
            frames = await post_prompt(client, PATH, "hello")
            info = (await client.get("/api/console/info")).json()
    return frames, info


def text_of(frames: list[dict[str, Any]]) -> str:
    return "".join(frame["data"]["text"] for frame in of_type(frames, "text"))


async def test_a_429_falls_back_to_the_next_model_with_the_same_request(workspace: Path) -> None:
    openai = fake_openai().script(Status(429, {"error": {"message": "slow down"}}))
    anthropic = fake_anthropic().script(Stream(anthropic_text("from ", "claude")))
    frames, info = await run_chain(workspace, openai, anthropic)

    fallback = of_type(frames, "model-fallback")
    assert [frame["data"]["from"] for frame in fallback] == ["openai:gpt-fake"]
    assert fallback[0]["data"]["to"] == "anthropic:claude-fake"
    assert "429" in fallback[0]["data"]["reason"]
    assert text_of(frames) == "from claude"
    assert frames[-1]["event"] == "complete"
    # the same request: the user's message reached both providers
    assert openai.bodies[0]["messages"][-1]["content"] == "hello"
    assert anthropic.bodies[0]["messages"][-1]["content"][0]["text"] == "hello"
    (endpoint,) = info["endpoints"]
    assert endpoint["harness"]["model"] == ["openai:gpt-fake", "anthropic:claude-fake"]
    assert "sk-test" not in str(info)


async def test_a_401_never_falls_back(workspace: Path) -> None:
    openai = fake_openai().script(Status(401, {"error": {"message": "bad key"}}))
    anthropic = fake_anthropic().script(Stream(anthropic_text("unreachable")))
    frames, _ = await run_chain(workspace, openai, anthropic)

    assert of_type(frames, "model-fallback") == []
    assert anthropic.requests == []
    assert frames[-1]["event"] == "error"
    assert "HTTP 401" in frames[-1]["data"]["message"]


async def test_a_stream_cut_after_text_ends_the_run_instead_of_restarting(workspace: Path) -> None:
    # role chunk, "Hel", "lo" -> the connection drops before the answer ends
    openai = fake_openai().script(Stream(openai_text("Hel", "lo", " world"), break_after=3))
    anthropic = fake_anthropic().script(Stream(anthropic_text("a second answer")))
    frames, _ = await run_chain(workspace, openai, anthropic)

    assert text_of(frames) == "Hello"
    assert of_type(frames, "model-fallback") == []
    assert anthropic.requests == []
    assert frames[-1]["event"] == "error"
    assert "mid-answer" in frames[-1]["data"]["message"]


async def test_a_stream_cut_before_any_text_falls_back(workspace: Path) -> None:
    openai = fake_openai().script(Stream(openai_text("never", "sent"), break_after=1))
    anthropic = fake_anthropic().script(Stream(anthropic_text("recovered")))
    frames, _ = await run_chain(workspace, openai, anthropic)

    assert [frame["data"]["to"] for frame in of_type(frames, "model-fallback")] == [
        "anthropic:claude-fake"
    ]
    assert text_of(frames) == "recovered"
    assert frames[-1]["event"] == "complete"


async def test_a_5xx_on_every_model_ends_with_the_last_error(workspace: Path) -> None:
    openai = fake_openai().script(Status(503, {"error": {"message": "down"}}))
    anthropic = fake_anthropic().script(
        Status(529, {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    )
    frames, _ = await run_chain(workspace, openai, anthropic)

    assert len(of_type(frames, "model-fallback")) == 1
    assert frames[-1]["event"] == "error"
    assert "HTTP 529" in frames[-1]["data"]["message"]


async def test_fallback_runtime_alone_falls_back_and_says_which_model_answered() -> None:
    openai = fake_openai().script(Status(500, {"error": {"message": "oops"}}))
    anthropic = fake_anthropic().script(Stream(anthropic_text("ok")))
    async with serve(openai.app) as first, serve(anthropic.app) as second:
        chain = FallbackRuntime(openai_at(first), anthropic_at(second))
        response = await chain.complete(ModelRequest("sys", (Message.user("hi"),)))
        await chain.aclose()
    assert response.text == "ok"
    assert response.model == "anthropic:claude-fake"


# --- per-agent models as strings ----------------------------------------------------------


async def test_model_strings_resolve_with_the_app_settings_and_fleets_keep_their_own(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator on `openai:lead-model` delegates to a member on `openai:member-model` and
    spawns a `task` sub-agent (the coordinator's model); the app's runtime is never asked."""
    without_provider_credentials(monkeypatch, tmp_path / "home")
    registry = AgentRegistry()

    @registry.agent(name="member", harness=(), model="openai:member-model")
    class Member:
        """Answers questions."""

        @prompt
        async def chat(self, message: str, session: StreamingSession) -> None:
            await session.stream(message)

    @registry.coordinator("lead", fleet=[Member], model="openai:lead-model")
    class Lead:
        @prompt
        async def chat(self, message: str, session: StreamingSession) -> None:
            await session.stream(message)

    delegate = '{"agent": "member", "message": "hi"}'
    openai = fake_openai().script(
        Stream(openai_tool_calls([("c1", "delegate_task", delegate)])),
        Stream(openai_text("member says hi")),
        Stream(openai_tool_calls([("c2", "task", '{"description": "look around"}')])),
        Stream(openai_text("sub-agent report")),
        Stream(openai_text("all done")),
    )
    app_runtime = ScriptedRuntime(["the app's runtime"])
    async with serve(openai.app) as base:
        app = make_app(
            [Lead, Member],
            runtime=app_runtime,
            workspace=workspace,
            llm_base_url=f"{base}/v1",
            llm_api_key="sk-app",
        )
        async with client_for(app) as client:
            frames = await post_prompt(client, "/atmosphere/agent/lead", "go")
            info = (await client.get("/api/console/info")).json()

    assert frames[-1]["event"] == "complete", frames[-1]
    assert [body["model"] for body in openai.bodies] == [
        "lead-model",
        "member-model",
        "lead-model",
        "lead-model",
        "lead-model",
    ]
    assert {request.headers["authorization"] for request in openai.requests} == {"Bearer sk-app"}
    assert app_runtime.requests == []
    models = {entry["path"]: entry["harness"]["model"] for entry in info["endpoints"]}
    assert models == {
        "/atmosphere/agent/lead": ["openai:lead-model"],
        "/atmosphere/agent/member": ["openai:member-model"],
    }
    # usage in the coordinator's `complete` frame includes its member's and sub-agent's turns
    usage = frames[-1]["data"]["usage"]
    assert usage["inputTokens"] == 20 + 12 + 20 + 12 + 12


async def test_an_agent_without_a_model_keeps_the_apps_runtime(workspace: Path) -> None:
    registry = AgentRegistry()

    @registry.agent(name="plain", harness=(), fallback_models=("scripted:demo",))
    class Plain:
        @prompt
        async def chat(self, message: str, session: StreamingSession) -> None:
            await session.stream(message)

    runtime = ScriptedRuntime(["from the app's runtime"])
    async with client_for(make_app([Plain], runtime=runtime, workspace=workspace)) as client:
        frames = await post_prompt(client, "/atmosphere/agent/plain", "hi")
        info = (await client.get("/api/console/info")).json()
    assert text_of(frames) == "from the app's runtime"
    assert info["endpoints"][0]["harness"]["model"] == ["scripted", "scripted:demo"]


@pytest.mark.parametrize(
    "model", ["gpt-4.1", "openai:", "mistral:large", "scripted:other", 42, "anthropic: "]
)
def test_a_bad_model_fails_at_declaration(model: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        AgentRegistry().agent(name="bad", model=model)


async def test_an_app_wide_chain_reports_its_fallbacks_too(workspace: Path) -> None:
    openai = fake_openai().script(Status(502, {"error": {"message": "bad gateway"}}))
    anthropic = fake_anthropic().script(Stream(anthropic_text("app-wide")))
    async with serve(openai.app) as first, serve(anthropic.app) as second:
        chain = FallbackRuntime(openai_at(first), anthropic_at(second))
        app = make_app([chained_agent(None)], runtime=chain, workspace=workspace)
        async with client_for(app) as client:
            frames = await post_prompt(client, PATH, "hello")
            info = (await client.get("/api/console/info")).json()
    assert [frame["data"]["to"] for frame in of_type(frames, "model-fallback")] == [
        "anthropic:claude-fake"
    ]
    assert text_of(frames) == "app-wide"
    assert info["endpoints"][0]["harness"]["model"] == ["openai:gpt-fake", "anthropic:claude-fake"]
