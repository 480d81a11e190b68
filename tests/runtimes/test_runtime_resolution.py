"""LLM_RUNTIME resolution, the provider settings, and what the console reports for each runtime."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI
from pydantic import ValidationError

import atmosphere_harness
from atmosphere_harness import HarnessSettings, ScriptedRuntime, create_harness_router
from atmosphere_harness._runtimes import resolve
from atmosphere_harness._runtimes.anthropic import AnthropicRuntime
from atmosphere_harness._runtimes.openai import OpenAIRuntime
from atmosphere_harness._settings import PromptCacheKeyMode, RuntimeChoice
from tests.fake_providers import Stream, anthropic_text, fake_anthropic
from tests.runtime_support import PATH, WireCalculator, without_provider_credentials
from tests.support import client_for, serve
from tests.support import prompt as post_prompt


@pytest.mark.parametrize(
    ("model", "base_url", "expected"),
    [
        (None, None, None),
        ("gpt-4.1-mini", None, RuntimeChoice.OPENAI),
        ("claude-sonnet-4-5", None, RuntimeChoice.ANTHROPIC),
        (None, "http://localhost:11434/v1", RuntimeChoice.OPENAI),
        (None, "https://api.anthropic.com", RuntimeChoice.ANTHROPIC),
        ("llama3.1", "http://localhost:11434/v1", RuntimeChoice.OPENAI),
        # A Claude model behind an OpenAI-compatible proxy (LiteLLM) is spoken to as OpenAI.
        ("claude-sonnet-4-5", "http://localhost:4000/v1", RuntimeChoice.OPENAI),
    ],
)
def test_auto_picks_the_configured_provider(model, base_url, expected) -> None:
    settings = HarnessSettings(llm_model=model, llm_base_url=base_url)
    assert resolve.configured_provider(settings) is expected


def test_auto_without_a_model_is_the_demo_with_one_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        runtime = resolve.resolve_runtime(HarnessSettings())
    assert isinstance(runtime, ScriptedRuntime)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "scripted demo runtime" in warnings[0].getMessage()


def test_openai_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "LLM_BASE_URL": "http://localhost:11434/v1",
        "LLM_MODEL": "llama3.1",
        "LLM_MAX_RETRIES": "4",
        "LLM_TIMEOUT": "30",
        "LLM_MAX_TOKENS": "512",
        "LLM_PROMPT_CACHE_KEY": "false",
    }.items():
        monkeypatch.setenv(name, value)
    runtime = resolve.resolve_runtime(HarnessSettings())
    assert isinstance(runtime, OpenAIRuntime)
    assert runtime.model == "llama3.1"
    assert runtime.base_url.rstrip("/") == "http://localhost:11434/v1"
    assert runtime.max_retries == 4
    assert runtime.client.timeout == 30
    assert runtime.max_tokens == 512
    assert runtime.cache_key_mode is PromptCacheKeyMode.DISABLED


def test_anthropic_from_settings() -> None:
    settings = HarnessSettings(
        llm_runtime="anthropic", llm_model="claude-sonnet-4-5", llm_api_key="sk-ant"
    )
    runtime = resolve.resolve_runtime(settings)
    assert isinstance(runtime, AnthropicRuntime)
    assert runtime.max_tokens == 8192
    assert runtime.max_retries == 2
    assert runtime.base_url.rstrip("/") == "https://api.anthropic.com"


@pytest.mark.parametrize(
    ("choice", "model", "provider"),
    [
        ("anthropic", "claude-sonnet-4-5", "Anthropic"),
        ("auto", "claude-sonnet-4-5", "Anthropic"),
        ("openai", "gpt-4.1-mini", "OpenAI"),
        ("auto", "gpt-4.1-mini", "OpenAI"),
    ],
)
async def test_a_provider_without_its_key_fails_start_up_clearly(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    workspace: Path,
    choice: str,
    model: str,
    provider: str,
) -> None:
    without_provider_credentials(monkeypatch, tmp_path / "home")
    settings = HarnessSettings(workspace_root=workspace, llm_runtime=choice, llm_model=model)
    message = rf"needs an API key for {provider}: set LLM_API_KEY"
    with pytest.raises(ValueError, match=message):
        resolve.resolve_runtime(settings)
    app = FastAPI()
    app.include_router(create_harness_router(settings, agents=[WireCalculator]))
    with pytest.raises(ValueError, match=message):
        async with app.router.lifespan_context(app):
            pass


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LLM_MAX_RETRIES", "-1"),
        ("LLM_TIMEOUT", "0"),
        ("LLM_TIMEOUT", "inf"),
        ("LLM_MAX_TOKENS", "x"),
    ],
)
def test_bad_provider_settings_fail_start_up(monkeypatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        HarnessSettings()


def test_a_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(resolve.FACTORIES, RuntimeChoice.ANTHROPIC)
    settings = HarnessSettings(llm_runtime="anthropic", llm_model="claude-x")
    with pytest.raises(RuntimeError, match=r"pip install 'atmosphere-harness\[anthropic\]'"):
        resolve.resolve_runtime(settings)


def test_the_public_face_loads_provider_runtimes_lazily(tmp_path: Path, monkeypatch) -> None:
    assert atmosphere_harness.OpenAIRuntime is OpenAIRuntime
    assert atmosphere_harness.AnthropicRuntime is AnthropicRuntime
    # An adapter whose SDK is absent says which extra to install.
    (tmp_path / "needs_sdk.py").write_text("import nosuch_sdk_for_test\nclass Fake: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(atmosphere_harness._LAZY, "Fake", "needs_sdk")
    monkeypatch.setitem(atmosphere_harness._EXTRAS, "needs_sdk", "nosuch_sdk_for_test")
    with pytest.raises(ImportError, match=r"pip install 'atmosphere-harness\[nosuch_sdk_for_test"):
        atmosphere_harness.Fake  # noqa: B018
    sys.modules.pop("needs_sdk", None)
    with pytest.raises(AttributeError):
        atmosphere_harness.NoSuchName  # noqa: B018


async def test_console_reports_the_runtime_resolved_from_settings(workspace: Path) -> None:
    fake = fake_anthropic().script(Stream(anthropic_text("hi")))
    async with serve(fake.app) as base:
        settings = HarnessSettings(
            workspace_root=workspace,
            llm_runtime="anthropic",
            llm_model="claude-fake",
            llm_base_url=base,
            llm_api_key="sk-ant",
        )
        app = FastAPI()
        app.include_router(create_harness_router(settings, agents=[WireCalculator], primitives=[]))
        async with client_for(app) as client:
            runtime = (await client.get("/api/console/info")).json()["runtime"]
            frames = await post_prompt(client, PATH, "hello")
    assert runtime["name"] == "anthropic"
    assert set(runtime["capabilities"]) >= {
        "tool-calling",
        "streaming",
        "prompt-caching",
        "usage",
        "virtual-filesystem",
    }
    assert frames[-1]["data"]["summary"] == "hi"
    assert fake.bodies[0]["model"] == "claude-fake"


async def test_shutdown_closes_the_runtime_client(workspace: Path) -> None:
    runtime = OpenAIRuntime("m", base_url="http://127.0.0.1:9/v1")
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace), agents=[WireCalculator], runtime=runtime
        )
    )
    async with client_for(app) as client:
        assert (await client.get("/api/console/info")).status_code == 200
        assert not runtime.client.is_closed()
    assert runtime.client.is_closed()
