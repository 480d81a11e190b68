"""Checks of what a server left behind: through the admin REST API, and on disk.

The API checks prove that what an operator reads is exactly what each conversation last wrote;
the disk checks prove that every document parses (plans, files, the SQLite database with its
history and facts) and that no bound was exceeded, whatever the API would say.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx2

from atmosphere_harness._filesystem.paths import TEMP_SUFFIX
from atmosphere_harness._memory import codec
from atmosphere_harness._planning.model import AgentPlan
from atmosphere_harness._planning.store import MAX_PLAN_BYTES, MAX_STEPS

from . import workload
from .apps import OWNER, PATH

ADMIN_TOKEN = "reliability-admin-token"
PLAN_TEMP_PREFIX = ".plan-"
"""Temp files of the plan store's atomic writes (`planning.store._TEMP_PREFIX`)."""
AUTH = {"X-Atmosphere-Auth": ADMIN_TOKEN}


def owner_root(workspace: Path) -> Path:
    return workspace / "coordinators" / OWNER


async def admin_plan(client: httpx2.AsyncClient, cid: str) -> dict[str, Any] | None:
    response = await client.get(
        f"/api/admin/agents/{OWNER}/plan", params={"conversationId": cid}, headers=AUTH
    )
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def admin_files(client: httpx2.AsyncClient, cid: str) -> dict[str, str]:
    """Every file of a conversation, walked and read through the admin API."""
    found: dict[str, str] = {}
    pending = [None]
    while pending:
        directory = pending.pop()
        params = {"conversationId": cid, **({"path": directory} if directory else {})}
        listing = await client.get(f"/api/admin/agents/{OWNER}/files", params=params, headers=AUTH)
        if listing.status_code == 404 and directory is None:
            return found
        assert listing.status_code == 200, listing.text
        for entry in listing.json()["entries"]:
            if entry["directory"]:
                pending.append(entry["path"])
                continue
            read = await client.get(
                f"/api/admin/agents/{OWNER}/files/content",
                params={"conversationId": cid, "path": entry["path"]},
                headers=AUTH,
            )
            assert read.status_code == 200, read.text
            found[entry["path"]] = read.json()["content"]
    return found


async def read_back(
    client: httpx2.AsyncClient, cids: list[str], concurrency: int = 16
) -> dict[str, tuple[dict[str, Any] | None, dict[str, str]]]:
    """`(plan, files)` of each conversation through the admin API, a few reads at a time."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(cid: str) -> tuple[dict[str, Any] | None, dict[str, str]]:
        async with semaphore:
            return await admin_plan(client, cid), await admin_files(client, cid)

    found = await asyncio.gather(*(one(cid) for cid in cids))
    return dict(zip(cids, found, strict=True))


def disk_plans(workspace: Path) -> dict[str, AgentPlan]:
    """Every plan document of the owner, parsed (a torn or invalid one fails here), and bounded."""
    plans: dict[str, AgentPlan] = {}
    for document in sorted((owner_root(workspace) / "plans").glob("*/*")):
        if document.name.startswith(PLAN_TEMP_PREFIX):
            continue  # a write cut short by a kill: never read, removed by a later write
        data = document.read_bytes()
        assert document.suffix == ".json", f"a stray file among the plans: {document}"
        assert len(data) <= MAX_PLAN_BYTES, f"{document} holds {len(data)} bytes"
        plan = AgentPlan.from_json(data)
        assert len(plan.steps) <= MAX_STEPS, f"{document} has {len(plan.steps)} steps"
        plans[document.stem] = plan
    return plans


def disk_files(workspace: Path) -> dict[str, dict[str, str]]:
    """Every conversation's files, read from disk, each checked against the store's bounds."""
    limits = workload.LIMITS
    stores: dict[str, dict[str, str]] = {}
    root = owner_root(workspace) / "files"
    for store in sorted(root.iterdir()) if root.is_dir() else []:
        if not store.is_dir():
            continue  # a store's lock files sit beside it (`.{id}.lock`, `.{id}.live`)
        files = {
            str(path.relative_to(store)): path.read_text(encoding="utf-8")
            for path in sorted(store.rglob("*"))
            if path.is_file() and not path.name.endswith(TEMP_SUFFIX)  # (as for plans)
        }
        sizes = [len(text.encode()) for text in files.values()]
        assert len(files) <= limits.max_files, f"{store.name} holds {len(files)} files"
        assert max(sizes, default=0) <= limits.max_file_bytes, f"{store.name}: {max(sizes)} B"
        assert sum(sizes) <= limits.max_total_bytes, f"{store.name} holds {sum(sizes)} bytes"
        stores[store.name] = files
    return stores


def database(workspace: Path) -> sqlite3.Connection:
    """The harness's SQLite file, opened read-only, after an integrity check."""
    path = workspace / "atmosphere.db"
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    return connection


def histories(workspace: Path) -> dict[str, list[str]]:
    """Each conversation's stored user messages, oldest first; every stored message decodes."""
    connection = database(workspace)
    try:
        rows = connection.execute(
            "SELECT c.conversation_id, m.codec, m.payload FROM memory_messages m "
            "JOIN memory_conversations c ON c.id = m.conversation "
            "WHERE c.endpoint = ? ORDER BY c.conversation_id, m.seq",
            (PATH,),
        ).fetchall()
    finally:
        connection.close()
    found: dict[str, list[str]] = {}
    for cid, kind, payload in rows:
        message = codec.decode(kind, payload)
        if message.role == "user":
            found.setdefault(cid, []).append(message.content)
    return found


def facts(workspace: Path) -> dict[str, list[str]]:
    """Every stored long-term fact by user (each row read back as text)."""
    connection = database(workspace)
    try:
        rows = connection.execute("SELECT user_id, fact FROM memory_facts ORDER BY id").fetchall()
    finally:
        connection.close()
    found: dict[str, list[str]] = {}
    for user, fact in rows:
        assert isinstance(fact, str), (user, fact)
        assert fact.strip(), (user, fact)
        found.setdefault(user, []).append(fact)
    return found


def parsed_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))
