"""`ATMOSPHERE_AI_WORKSPACE_BACKEND=postgres` over real HTTP: two uvicorn replicas with
DIFFERENT local workspace roots (no shared volume) share one conversation's files through
PostgreSQL, through the eight file tools and the admin REST; a `memories/=postgres:` route is
shared across conversations and replicas; `postgres` without a URL stops start-up.

App kind `postgres-files`: the two-replica sample on `postgres_model`, whose `call: <tool> <JSON>`
line makes the model call one tool and answer `result: <what the tool returned>`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.reliability.server import ServerProcess

from .postgres_service import create_database, drop_database
from .replicas import ADMIN_TOKEN, prompt, summary

pytestmark = pytest.mark.services

ADMIN = {"X-Atmosphere-Auth": ADMIN_TOKEN}
KIND = "postgres-files"


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    url = create_database()
    try:
        yield url
    finally:
        drop_database(url)


@pytest.fixture(scope="module")
def servers(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    base = tmp_path_factory.mktemp("pgfiles")
    env = {
        "ATMOSPHERE_POSTGRES_URL": database_url,
        "ATMOSPHERE_AI_WORKSPACE_BACKEND": "postgres",
        "ATMOSPHERE_AI_FILESYSTEM_ROUTES": "memories/=postgres:",
        "ATMOSPHERE_ADMIN_TOKEN": ADMIN_TOKEN,
        "ATMOSPHERE_AI_TOOL_OUTPUT_OFFLOAD_THRESHOLD": "2000",
    }
    roots = [base / "root-a", base / "root-b"]
    for root in roots:
        root.mkdir()
    a = ServerProcess(KIND, roots[0], base / "a.log", env).start()
    try:
        b = ServerProcess(KIND, roots[1], base / "b.log", env).start()
        try:
            yield a, b
        finally:
            b.kill()
    finally:
        a.kill()


def cid() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


async def call(server: ServerProcess, conversation: str, tool: str, **arguments: Any) -> str:
    """What `tool` returned to the model, on `server`, in `conversation`."""
    async with httpx2.AsyncClient(timeout=60) as client:
        frames = await prompt(
            client, server.url, f"call: {tool} {json.dumps(arguments)}", conversation
        )
    answer = summary(frames)
    assert answer.startswith("result: "), answer
    return answer.removeprefix("result: ")


def files_under(root: Path) -> list[Path]:
    """Every workspace file a replica keeps on its local disk (the PostgreSQL backend: none)."""
    return [
        path
        for path in root.rglob("*")
        if path.is_file() and "files" in path.relative_to(root).parts
    ]


async def test_console_info_names_the_workspace_backend(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    for server in servers:
        info = httpx2.get(server.url + "/api/console/info").json()
        assert info["backends"] == {
            "state": "postgres",
            "events": "postgres",
            "workspace": "postgres",
        }


async def test_a_conversation_written_on_a_is_read_grepped_and_edited_on_b(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    conversation = cid()
    written = await call(
        a, conversation, "write_file", path="notes/plan.md", content="alpha\nbeta\nalpha\n"
    )
    assert "notes/plan.md" in written, written

    assert "beta" in await call(b, conversation, "read_file", path="notes/plan.md")
    grep = await call(b, conversation, "grep", pattern="^alpha$")
    assert grep.count("notes/plan.md") == 2, grep
    assert "notes/plan.md" in await call(b, conversation, "glob", pattern="**/*.md")
    edited = await call(
        b, conversation, "edit_file", path="notes/plan.md", old_text="beta", new_text="gamma"
    )
    assert not edited.startswith("Error"), edited
    # The same error message as on disk, for the same mistake.
    twice = await call(
        b, conversation, "edit_file", path="notes/plan.md", old_text="alpha", new_text="x"
    )
    assert twice.startswith("Error: old_text matches 2 times in notes/plan.md"), twice

    back = await call(a, conversation, "read_file", path="notes/plan.md")
    assert "gamma" in back, back
    assert "beta" not in back, back
    assert "notes" in await call(a, conversation, "ls")
    # Neither replica keeps the conversation's files on its own disk.
    assert files_under(a.workspace) == []
    assert files_under(b.workspace) == []


async def test_a_result_offloaded_on_a_is_read_back_on_b(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    conversation = cid()
    lines = "".join(f"needle {n:03d} {'x' * 40}\n" for n in range(100))
    await call(a, conversation, "write_file", path="big.txt", content=lines)
    previewed = await call(a, conversation, "grep", pattern="needle")
    found = re.search(r"tool-output/[A-Za-z0-9_.-]+\.txt", previewed)
    assert found is not None, previewed
    full = await call(b, conversation, "read_file", path=found.group(0), limit=500)
    assert "needle 099" in full, full


async def test_admin_rest_on_b_lists_and_reads_files_written_on_a(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    conversation = cid()
    await call(a, conversation, "write_file", path="report/summary.md", content="from A")
    query = f"?conversationId={conversation}"
    base = b.url + "/api/admin/agents/assistant/files"
    listing = httpx2.get(base + query + "&path=report", headers=ADMIN)
    assert listing.status_code == 200, listing.text
    assert [entry["path"] for entry in listing.json()["entries"]] == ["report/summary.md"]
    content = httpx2.get(base + "/content" + query + "&path=report/summary.md", headers=ADMIN)
    assert content.status_code == 200, content.text
    assert content.json()["content"] == "from A"
    # A conversation with no files is still a 404, and the probe created nothing.
    ghost = httpx2.get(base + f"?conversationId={cid()}", headers=ADMIN)
    assert ghost.status_code == 404, ghost.text


async def test_a_postgres_route_is_shared_across_conversations_and_replicas(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    first, second = cid(), cid()
    await call(a, first, "write_file", path="memories/team.md", content="ship on friday")
    await call(a, first, "write_file", path="scratch.md", content="only in the first")
    # Another conversation, on the other replica, sees the route but not the first's files.
    assert "ship on friday" in await call(b, second, "read_file", path="memories/team.md")
    missing = await call(b, second, "read_file", path="scratch.md")
    assert missing.startswith("Error: File not found: scratch.md"), missing
    assert "memories" in await call(b, second, "ls")
    appended = await call(
        b, second, "edit_file", path="memories/team.md", old_text="friday", new_text="monday"
    )
    assert not appended.startswith("Error"), appended
    assert "ship on monday" in await call(a, first, "read_file", path="memories/team.md")


def test_postgres_workspace_without_a_url_fails_start_up(tmp_path: Path) -> None:
    server = ServerProcess(
        KIND,
        tmp_path,
        tmp_path / "server.log",
        {"ATMOSPHERE_AI_WORKSPACE_BACKEND": "postgres"},
    )
    with pytest.raises(RuntimeError) as failed:
        server.start()
    message = str(failed.value)
    assert "ATMOSPHERE_AI_WORKSPACE_BACKEND=postgres" in message, message
    assert "ATMOSPHERE_POSTGRES_URL is not set" in message, message
