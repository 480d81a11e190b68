"""How `PostgresWorkspaceStores` plugs into the filesystem primitive: the setting, the backends
seam, the provider on rows (same answers as on disk, the attack list), `prefix=postgres:`
routes, and the conversation cap in SQL that never evicts a store another replica is using."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest

from atmosphere_harness._assembly import default_primitives
from atmosphere_harness._backends import resolve_backends
from atmosphere_harness._backends.postgres import (
    PostgresAgentFileSystem,
    PostgresDatabase,
    PostgresWorkspaceStores,
)
from atmosphere_harness._errors import BackendMisconfigured, FileSystemError
from atmosphere_harness._filesystem.base import FileSystemLimits
from atmosphere_harness._filesystem.composite import CompositeAgentFileSystem
from atmosphere_harness._filesystem.primitive import FilesystemPrimitive
from atmosphere_harness._filesystem.provider import AgentFileSystemProvider
from atmosphere_harness._settings import HarnessSettings, WorkspaceBackend
from tests.filesystem.test_filesystem_paths import ATTACKS

from .postgres_service import postgres_url
from .test_postgres_workspace import LIMITS, play

__all__ = ["postgres_url"]

pytestmark = pytest.mark.services


@pytest.fixture
async def databases(postgres_url: str) -> AsyncIterator[tuple[PostgresDatabase, PostgresDatabase]]:
    """Two pools on one database: two replicas."""
    a, b = PostgresDatabase(postgres_url), PostgresDatabase(postgres_url)
    await a.open()
    await b.open()
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


def stores_on(database: PostgresDatabase, root: Path, protect: float = 3600.0) -> Any:
    return PostgresWorkspaceStores(database, root, protect_seconds=protect)


# --- the setting and the seam -------------------------------------------------------------------


def test_the_setting_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert HarnessSettings().workspace_backend is WorkspaceBackend.FILES
    monkeypatch.setenv("ATMOSPHERE_AI_WORKSPACE_BACKEND", " Postgres ")
    settings = HarnessSettings()
    assert settings.groups.backends.workspace_backend is WorkspaceBackend.POSTGRES
    monkeypatch.setenv("ATMOSPHERE_AI_WORKSPACE_BACKEND", "s3")
    with pytest.raises(ValueError, match="ATMOSPHERE_AI_WORKSPACE_BACKEND must be one of"):
        HarnessSettings()


def test_postgres_workspace_without_a_url_names_both_variables(tmp_path: Path) -> None:
    settings = HarnessSettings(workspace_root=tmp_path, workspace_backend="postgres")
    with pytest.raises(BackendMisconfigured) as failed:
        resolve_backends(settings)
    assert "ATMOSPHERE_AI_WORKSPACE_BACKEND=postgres" in str(failed.value)
    assert "ATMOSPHERE_POSTGRES_URL is not set" in str(failed.value)


def test_the_backends_give_the_primitive_the_postgres_stores(
    tmp_path: Path, postgres_url: str
) -> None:
    files = resolve_backends(HarnessSettings(workspace_root=tmp_path, postgres_url=postgres_url))
    assert files.workspaces is None
    assert isinstance(files.route_stores["postgres"], PostgresWorkspaceStores)
    assert files.describe()["workspace"] == "files"
    rows = resolve_backends(
        HarnessSettings(
            workspace_root=tmp_path, postgres_url=postgres_url, workspace_backend="postgres"
        )
    )
    assert isinstance(rows.workspaces, PostgresWorkspaceStores)
    assert rows.describe()["workspace"] == "postgres"
    [primitive] = [p for p in default_primitives(rows) if isinstance(p, FilesystemPrimitive)]
    assert primitive.workspaces is rows.workspaces
    assert primitive.backend == "postgres"


async def test_a_postgres_route_without_the_backend_stops_start_up(tmp_path: Path) -> None:
    host = SimpleNamespace(
        settings=HarnessSettings(workspace_root=tmp_path, filesystem_routes="memories/=postgres:")
    )
    with pytest.raises(ValueError, match="needs the postgres backend: set ATMOSPHERE_POSTGRES_URL"):
        await FilesystemPrimitive().start(host)  # type: ignore[arg-type]


async def test_a_postgres_route_is_one_store_for_every_owner(
    databases: tuple[PostgresDatabase, PostgresDatabase], tmp_path: Path
) -> None:
    _a, _b = databases
    settings = HarnessSettings(
        workspace_root=tmp_path,
        filesystem_routes="memories/=postgres:,local/=" + str(tmp_path / "local"),
    )
    primitives = []
    for database in databases:
        primitive = FilesystemPrimitive(route_stores={"postgres": stores_on(database, tmp_path)})
        await primitive.start(SimpleNamespace(settings=settings))  # type: ignore[arg-type]
        primitives.append(primitive)
    assert isinstance(primitives[0].routes["memories"], PostgresAgentFileSystem)
    one = AgentFileSystemProvider(tmp_path / "agent-1", routes=primitives[0].routes)
    two = AgentFileSystemProvider(tmp_path / "agent-2", routes=primitives[1].routes)
    await one.for_conversation("c1").write("memories/a.md", "shared")
    await one.for_conversation("c1").write("mine.md", "not shared")
    other = two.for_conversation("c2")
    assert await other.read("memories/a.md") == "shared"
    assert await other.glob("**") == ["memories/a.md"]
    with pytest.raises(FileSystemError, match=r"File not found: mine\.md"):
        await other.read("mine.md")


# --- the provider on rows ------------------------------------------------------------------------


async def test_the_provider_on_rows_answers_as_on_disk(
    databases: tuple[PostgresDatabase, PostgresDatabase], tmp_path: Path
) -> None:
    on_disk = AgentFileSystemProvider(tmp_path / "disk", LIMITS).workspace("c1")
    on_rows = AgentFileSystemProvider(
        tmp_path / "agent", LIMITS, stores=stores_on(databases[0], tmp_path)
    )
    assert await play(on_rows.workspace("c1")) == await play(on_disk)
    assert on_rows.backend == "postgres"


async def test_the_provider_names_stores_alike_on_replicas_with_different_roots(
    databases: tuple[PostgresDatabase, PostgresDatabase], tmp_path: Path
) -> None:
    a = AgentFileSystemProvider(
        tmp_path / "a" / "agents" / "bot", stores=stores_on(databases[0], tmp_path / "a")
    )
    b = AgentFileSystemProvider(
        tmp_path / "b" / "agents" / "bot", stores=stores_on(databases[1], tmp_path / "b")
    )
    assert not await b.has_files("c1")
    await a.for_conversation("c1").write("x.md", "from a")
    assert await b.has_files("c1")
    assert await b.for_conversation("c1").read("x.md") == "from a"
    stores = b.stores
    assert stores is not None
    assert await stores.conversations(b.agent_root) == ["c1"]
    await a.memories("alice").write("prefs.md", "tea")
    assert await b.memories("alice").read("prefs.md") == "tea"
    assert await b.memories("bob").ls() == []
    assert await b.for_conversation("c1").glob("**") == ["x.md"], "memories are apart"
    assert b.for_conversation("c1") is b.for_conversation("c1"), "one canonical instance"


@pytest.mark.parametrize(("path", "message"), ATTACKS)
async def test_the_wired_provider_rejects_the_attack_list(
    databases: tuple[PostgresDatabase, PostgresDatabase],
    postgres_url: str,
    tmp_path: Path,
    path: str,
    message: str,
) -> None:
    stores = stores_on(databases[0], tmp_path)
    routes = {"memories": stores.route("memories", FileSystemLimits())}
    provider = AgentFileSystemProvider(tmp_path / "agent", routes=routes, stores=stores)
    fs = provider.for_conversation("attacked")
    assert isinstance(fs, CompositeAgentFileSystem)
    await fs.write("keep.md", "kept")
    await fs.write("memories/keep.md", "kept")
    before = await all_rows(postgres_url)
    operations = [
        lambda: fs.read(path),
        lambda: fs.write(path, "pwned"),
        lambda: fs.edit(path, "a", "b"),
        lambda: fs.delete(path),
        lambda: fs.rename("keep.md", path),
    ]
    for operation in operations:
        with pytest.raises(FileSystemError) as raised:
            await operation()
        assert str(raised.value) in (message, "path must not be blank")
    assert await all_rows(postgres_url) == before, "a rejected operation changed a row"


async def all_rows(url: str) -> list[tuple[str, str]]:
    connection = await asyncpg.connect(url)
    try:
        found = await connection.fetch("SELECT store, path FROM atmosphere_files ORDER BY 1, 2")
    finally:
        await connection.close()
    return [(row["store"], row["path"]) for row in found]


# --- the conversation cap in SQL ----------------------------------------------------------------


async def stores_of(url: str, owner: str) -> list[str]:
    connection = await asyncpg.connect(url)
    try:
        found = await connection.fetch(
            "SELECT DISTINCT store FROM atmosphere_files WHERE starts_with(store, $1) ORDER BY 1",
            f"files:{owner}/",
        )
    finally:
        await connection.close()
    return [row["store"].removeprefix(f"files:{owner}/") for row in found]


async def age(url: str, owner: str, conversation: str, stamp: float) -> None:
    """Make a store look last written at `stamp` (seconds since the epoch)."""
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            "UPDATE atmosphere_files SET updated_at = $2 WHERE store = $1",
            f"files:{owner}/{conversation}",
            stamp,
        )
    finally:
        await connection.close()


async def test_the_cap_evicts_the_oldest_idle_stores_only(
    databases: tuple[PostgresDatabase, PostgresDatabase], postgres_url: str, tmp_path: Path
) -> None:
    limits = FileSystemLimits(max_conversations=8)
    a = AgentFileSystemProvider(tmp_path / "bot", limits, stores=stores_on(databases[0], tmp_path))
    b = AgentFileSystemProvider(tmp_path / "bot", limits, stores=stores_on(databases[1], tmp_path))
    names = [f"c{i}" for i in range(8)]
    for name in names:
        await (a if name < "c4" else b).for_conversation(name).write("a.md", name)
    # c0..c5 idle for an hour and more (c0 the oldest); c6 and c7 just written on replica B.
    for index, name in enumerate(names[:6]):
        await age(postgres_url, "bot", name, 1_000.0 + index)
    # A change to c0 is in flight on replica B: its store lock is held.
    holder = await asyncpg.connect(postgres_url)
    try:
        busy = holder.transaction()
        await busy.start()
        await holder.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('atmosphere_files:' || $1, 0))",
            "files:bot/c0",
        )
        await a.for_conversation("new").write("a.md", "new")
        await busy.rollback()
    finally:
        await holder.close()
    # 9 stores at a cap of 8: down to 7 (6 old + the new one); c0 was busy, so c1 and c2 went.
    assert await stores_of(postgres_url, "bot") == ["c0", "c3", "c4", "c5", "c6", "c7", "new"]


async def test_the_cap_never_evicts_a_store_in_use_and_goes_over_instead(
    databases: tuple[PostgresDatabase, PostgresDatabase], postgres_url: str, tmp_path: Path
) -> None:
    limits = FileSystemLimits(max_conversations=4)
    providers = [
        AgentFileSystemProvider(tmp_path / "bot", limits, stores=stores_on(database, tmp_path))
        for database in databases
    ]

    async def first_write(index: int) -> None:
        await providers[index % 2].for_conversation(f"c{index}").write("a.md", "x")

    # 12 new conversations from two replicas at once, all written within the idle timeout.
    await asyncio.gather(*(first_write(index) for index in range(12)))
    assert len(await stores_of(postgres_url, "bot")) == 12, "no store in use was evicted"
    # Once they are idle, the next new conversation brings the owner under the cap.
    for index in range(12):
        await age(postgres_url, "bot", f"c{index}", 1_000.0 + index)
    await providers[0].for_conversation("last").write("a.md", "x")
    assert await stores_of(postgres_url, "bot") == ["c10", "c11", "c9", "last"]
