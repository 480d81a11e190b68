"""The example of docs/memory.md runs as written (uvicorn on loopback, offline demo model)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.support import client_for, doc_example, parse_sse

DOC = Path(__file__).resolve().parents[2] / "docs" / "memory.md"
PATH = "/atmosphere/agent/assistant"


async def test_the_documented_example_keeps_and_closes_a_conversation(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_WORKSPACE_ROOT", str(workspace))
    headers = {"X-User-Id": "alice"}
    async with client_for(doc_example(DOC, "memory_app").app) as client:
        for message in ("I live in Montreal and my dog is called Max", "What should I buy?"):
            response = await client.post(
                PATH, json={"message": message, "conversationId": "c1"}, headers=headers
            )
            assert parse_sse(response.text)[-1]["event"] == "complete"
        closed = await client.post(f"{PATH}/conversations/c1/close", headers=headers)
        assert closed.json() == {"conversationId": "c1", "closed": True}
        other = await client.post(f"{PATH}/conversations/c1/close", headers={"X-User-Id": "bob"})
        assert other.status_code == 404
        info = (await client.get("/api/console/info")).json()
    assert info["harness"]["long-term-memory"] == (
        "ACTIVE(atmosphere_harness._memory.SqliteLongTermMemory)"
    )
    connection = sqlite3.connect(workspace / "atmosphere.db")
    try:
        stored = connection.execute("SELECT count(*) FROM memory_messages").fetchone()[0]
        closed_at = connection.execute("SELECT closed_at FROM memory_conversations").fetchone()[0]
    finally:
        connection.close()
    assert stored == 4, "both turns were stored"
    assert closed_at is not None
