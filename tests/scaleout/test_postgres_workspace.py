"""`PostgresAgentFileSystem` against the files backend: same answers, same errors, same bounds,
and exact bounds with writers on two "replicas" at once (two pools on one database)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atmosphere_harness._backends.postgres import PostgresDatabase
from atmosphere_harness._backends.postgres.workspace import PostgresAgentFileSystem
from atmosphere_harness._errors import FileSystemError
from atmosphere_harness._filesystem.base import FileSystemLimits
from atmosphere_harness._filesystem.paths import check_path
from atmosphere_harness._filesystem.workspace import WorkspaceAgentFileSystem
from tests.filesystem.test_filesystem_paths import ATTACKS, relative_paths

from .postgres_service import postgres_url

__all__ = ["postgres_url"]

pytestmark = pytest.mark.services

LIMITS = FileSystemLimits(max_file_bytes=64, max_files=4, max_total_bytes=160)


@pytest.fixture
async def databases(postgres_url: str) -> AsyncIterator[tuple[PostgresDatabase, PostgresDatabase]]:
    a, b = PostgresDatabase(postgres_url), PostgresDatabase(postgres_url)
    await a.open()
    await b.open()
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


SCRIPT: list[tuple[str, tuple[Any, ...]]] = [
    ("ls", ()),
    ("read", ("missing.md",)),
    ("write", ("notes/a.md", "alpha\nbeta\nalpha\n")),
    ("write", ("notes/b.md", "x" * 65)),
    ("write", ("../escape.md", "no")),
    ("write", ("notes", "a file onto a directory")),
    ("write", ("notes/a.md/c.md", "under a file")),
    ("ls", ("notes",)),
    ("ls", ("notes/a.md",)),
    ("ls", (None,)),
    ("edit", ("notes/a.md", "alpha", "gamma")),
    ("edit", ("notes/a.md", "zeta", "eta")),
    ("edit", ("notes/a.md", "", "eta")),
    ("edit_all", ("notes/a.md", "alpha", "gamma")),
    ("read", ("notes/a.md",)),
    ("write", ("b.md", "b" * 60)),
    ("write", ("c.md", "c" * 60)),
    ("write", ("d.md", "d" * 10)),
    ("write", ("e.md", "e")),
    ("write", ("d.md", "d" * 40)),
    ("glob", ("**/*.md",)),
    ("glob", ("notes/*",)),
    ("grep", ("gamma",)),
    ("grep", ("^g.m+a$", "notes")),
    ("grep", ("(unclosed",)),
    ("rename", ("notes", "notes/inner")),
    ("rename", ("missing", "x")),
    ("rename", ("b.md", "c.md")),
    ("rename", ("notes", "moved/notes")),
    ("ls", ("moved",)),
    ("read", ("moved/notes/a.md",)),
    ("delete", ("moved",)),
    ("delete", ("moved",)),
    ("ls", ()),
]


async def play(store: Any) -> list[str]:
    seen: list[str] = []
    for operation, args in SCRIPT:
        try:
            if operation == "edit_all":
                result: Any = await store.edit(*args, replace_all=True)
            else:
                result = await getattr(store, operation)(*args)
        except FileSystemError as exc:
            seen.append(f"{operation}{args!r} -> {type(exc).__name__}: {exc}")
        else:
            seen.append(f"{operation}{args!r} -> {result!r}")
    return seen


async def test_it_answers_exactly_as_the_files_backend(
    databases: tuple[PostgresDatabase, PostgresDatabase], tmp_path: Path
) -> None:
    files = await play(WorkspaceAgentFileSystem(tmp_path / "store", LIMITS))
    rows = await play(PostgresAgentFileSystem(databases[0], "owner/c1", LIMITS))
    assert rows == files


async def test_stores_are_apart_and_text_round_trips(
    databases: tuple[PostgresDatabase, PostgresDatabase],
) -> None:
    a, b = databases
    one = PostgresAgentFileSystem(a, "owner/c1")
    other = PostgresAgentFileSystem(b, "owner/c2")
    text = "nul \x00, emoji 🙂, crlf\r\nend"
    await one.write("t.md", text)
    assert await PostgresAgentFileSystem(b, "owner/c1").read("t.md") == text
    assert await other.ls() == []
    assert [hit.line for hit in await one.grep("end")] == [2]


async def test_writers_on_two_replicas_never_pass_a_bound_nor_lose_an_acknowledged_write(
    databases: tuple[PostgresDatabase, PostgresDatabase],
) -> None:
    limits = FileSystemLimits(max_file_bytes=100, max_files=20, max_total_bytes=10_000)
    stores = [PostgresAgentFileSystem(database, "owner/busy", limits) for database in databases]
    acknowledged: list[str] = []
    refused: list[str] = []

    async def writer(store: PostgresAgentFileSystem, name: str) -> None:
        for i in range(3):
            path = f"{name}-{i}.md"
            try:
                await store.write(path, f"{path}\n")
            except FileSystemError as exc:
                refused.append(str(exc))
            else:
                acknowledged.append(path)

    await asyncio.gather(
        *(writer(stores[i % 2], f"w{i}") for i in range(32))  # 16 writers per replica
    )
    assert len(refused) == 32 * 3 - 20
    assert all("at the 20-file limit" in reason for reason in refused)
    usage = await stores[0].usage()
    assert usage.files == 20
    assert len(acknowledged) == 20
    assert sorted(acknowledged) == await stores[1].glob("*.md")
    for path in acknowledged:
        assert await stores[1].read(path) == f"{path}\n", "no partial file"


async def test_concurrent_edits_of_one_file_from_two_replicas_lose_nothing(
    databases: tuple[PostgresDatabase, PostgresDatabase],
) -> None:
    stores = [PostgresAgentFileSystem(database, "owner/edits") for database in databases]
    await stores[0].write("log.md", "END")

    async def edit(i: int) -> None:
        await stores[i % 2].edit("log.md", "END", f"line {i}\nEND")

    await asyncio.gather(*(edit(i) for i in range(60)))
    text = await stores[1].read("log.md")
    assert sorted(text.splitlines()[:-1]) == sorted(f"line {i}" for i in range(60))


# --- containment: the files backend's attack list and property, on rows -------------------------


async def rows(url: str) -> list[tuple[str, str, bytes]]:
    connection = await asyncpg.connect(url)
    try:
        found = await connection.fetch(
            "SELECT store, path, content FROM atmosphere_files ORDER BY store, path"
        )
    finally:
        await connection.close()
    return [(row["store"], row["path"], bytes(row["content"])) for row in found]


@pytest.mark.parametrize(("path", "message"), ATTACKS)
async def test_every_operation_rejects_the_attack_list(
    databases: tuple[PostgresDatabase, PostgresDatabase], postgres_url: str, path: str, message: str
) -> None:
    store = PostgresAgentFileSystem(databases[0], "owner/attacked")
    await store.write("keep.md", "kept")
    before = await rows(postgres_url)
    operations = [
        lambda: store.read(path),
        lambda: store.write(path, "pwned"),
        lambda: store.edit(path, "a", "b"),
        lambda: store.delete(path),
        lambda: store.rename(path, "x.md"),
        lambda: store.rename("keep.md", path),
    ]
    if path.strip():
        operations += [lambda: store.ls(path), lambda: store.grep("a", path)]
    for operation in operations:
        with pytest.raises(FileSystemError) as raised:
            await operation()
        assert str(raised.value) == message
    assert await rows(postgres_url) == before, "a rejected operation changed a row"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(st.one_of(st.text(max_size=30), relative_paths), min_size=1, max_size=8))
def test_generated_writes_land_in_their_own_store_or_are_rejected(
    postgres_url: str, paths: list[str]
) -> None:
    async def scenario() -> None:
        database = PostgresDatabase(postgres_url)
        await database.open()
        try:
            store = PostgresAgentFileSystem(
                database, "owner/prop", FileSystemLimits(max_files=10_000)
            )
            for path in paths:
                try:
                    await store.write(path, "x")
                except FileSystemError:
                    continue
                assert await store.read(path) == "x"
                assert check_path(path) in await store.glob("**")
            stored = await rows(postgres_url)
            assert {name for name, _path, _content in stored} <= {"owner/prop"}
            assert all(check_path(path) == path for _name, path, _content in stored)
        finally:
            await database.aclose()

    asyncio.run(scenario())
