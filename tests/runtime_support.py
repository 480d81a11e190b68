"""Helpers shared by the provider-runtime tests: an agent with tools, and its app."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI

from atmosphere_harness import (
    HarnessSettings,
    StreamingSession,
    agent,
    create_harness_router,
    prompt,
    tool,
)
from atmosphere_harness._contracts import Primitive
from atmosphere_harness._runtimes.base import AgentRuntime, ModelRequest, ModelResponse
from tests.fake_providers import FakeProvider
from tests.support import client_for, serve

SYSTEM = "You are a careful calculator."

PROVIDER_CREDENTIAL_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_PROFILE",
    "ANTHROPIC_CONFIG_DIR",
    "ANTHROPIC_CUSTOM_HEADERS",
    "ANTHROPIC_IDENTITY_TOKEN",
    "ANTHROPIC_IDENTITY_TOKEN_FILE",
    "ANTHROPIC_FEDERATION_RULE_ID",
    "ANTHROPIC_ORGANIZATION_ID",
)


def without_provider_credentials(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """No provider key or base URL in the environment, and no SDK profile on disk.

    The Anthropic SDK also finds credentials in a profile under `~/.config/anthropic`, so `HOME`
    points at an empty directory.
    """
    for name in PROVIDER_CREDENTIAL_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))


@tool
async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@tool
async def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


@agent(name="wire-calculator", system_prompt=SYSTEM)
class WireCalculator:
    tools = [add, shout]

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


PATH = "/atmosphere/agent/wire-calculator"

ADD_SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "description": "The first addend."},
        "b": {"type": "integer", "description": "The second addend."},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
SHOUT_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}


def harness_app(
    runtime: AgentRuntime,
    workspace: Path,
    *,
    agents: Sequence[type] = (WireCalculator,),
    primitives: Sequence[Primitive] = (),
    **settings: Any,
) -> FastAPI:
    """The app under test; no other primitive unless given, so request bodies are exact."""
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace, **settings),
            agents=list(agents),
            runtime=runtime,
            primitives=list(primitives),
        )
    )
    return app


@asynccontextmanager
async def agent_client(
    fake: FakeProvider,
    make_runtime: Callable[[str], AgentRuntime],
    workspace: Path,
    **options: Any,
) -> AsyncIterator[httpx2.AsyncClient]:
    """The fake provider and the harness app, both on loopback; yields a client of the app."""
    async with (
        serve(fake.app) as base,
        client_for(harness_app(make_runtime(base), workspace, **options)) as client,
    ):
        yield client


async def complete_streaming(
    fake: FakeProvider, make_runtime: Callable[[str], Any], request: ModelRequest
) -> tuple[ModelResponse, list[str]]:
    """One `complete` against the served fake: the response and the text deltas streamed."""
    deltas: list[str] = []

    async def sink(text: str) -> None:
        deltas.append(text)

    async with serve(fake.app) as base:
        runtime = make_runtime(base)
        response = await runtime.complete(request, on_text=sink)
        await runtime.aclose()
    return response, deltas


async def hang_up_after_first_text(client: httpx2.AsyncClient) -> None:
    """Start a prompt and disconnect as soon as its first `text` frame arrives."""
    async with client.stream("POST", PATH, json={"message": "talk"}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:") and '"text"' in line:
                return
