"""The Python examples of docs/runtimes.md and docs/prompt-cache.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from atmosphere_harness import Message, ModelRequest
from tests.runtime_support import without_provider_credentials

DOCS = Path(__file__).resolve().parents[2] / "docs"


def examples(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("page", ["runtimes.md", "prompt-cache.md"])
async def test_examples_run(page: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Runnable as written on a machine without any provider key.
    without_provider_credentials(monkeypatch, tmp_path / "home")
    blocks = examples(page)
    assert blocks, f"{page} has runnable examples"
    for block in blocks:
        namespace: dict[str, object] = {}
        exec(compile(block, f"{page} example", "exec"), namespace)
        echo = namespace.get("EchoRuntime")
        if isinstance(echo, type):
            seen: list[str] = []
            response = await echo().complete(
                ModelRequest("", (Message.user("hi"),)), on_text=_collect(seen)
            )
            assert response.text == seen[0] == "You said: hi"


def _collect(into: list[str]):
    async def sink(text: str) -> None:
        into.append(text)

    return sink


async def test_the_prompt_cache_example_sends_its_hint(workspace: Path) -> None:
    from atmosphere_harness import CacheHint, ScriptedRuntime
    from tests.runtime_support import harness_app
    from tests.support import client_for, doc_example
    from tests.support import prompt as post_prompt

    module = doc_example(DOCS / "prompt-cache.md", "prompt_cache_doc")
    runtime = ScriptedRuntime(["ok"])
    async with client_for(harness_app(runtime, workspace, agents=[module.Support])) as client:
        frames = await post_prompt(client, "/atmosphere/agent/support", "hello")
    assert frames[-1]["event"] == "complete"
    assert runtime.requests[0].cache_hint == CacheHint.aggressive(key="tenant-anonymous")
