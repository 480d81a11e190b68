"""The example at the top of docs/filesystem.md runs as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import client_for, doc_example
from tests.support import prompt as post_prompt

DOC = Path(__file__).resolve().parents[2] / "docs" / "filesystem.md"


async def test_the_docs_example_serves_and_its_route_reads_the_workspace(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_WORKSPACE_ROOT", str(workspace))
    monkeypatch.setenv("LLM_RUNTIME", "scripted")
    example = doc_example(DOC, "docs_filesystem_example")
    async with client_for(example.app) as client:
        frames = await post_prompt(client, "/atmosphere/agent/writer", "hello there", "c1")
        drafts = await client.get("/drafts", params={"conversationId": "c1"})
    assert frames[-1]["event"] == "complete"
    assert drafts.json() == ["inbox/last-message.md"]
    saved = workspace / "agents" / "writer" / "files" / "c1" / "inbox" / "last-message.md"
    assert saved.read_text() == "hello there"
