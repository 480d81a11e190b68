"""A throwaway PostgreSQL database per test: created on 127.0.0.1:5432, dropped afterwards.

The server is the project's loopback PostgreSQL (user `postgres`, trust auth). Each test gets a
database with a unique name, created from the `test` (or `postgres`) database and dropped with
`FORCE` at the end, so tests never see each other's rows and leave nothing behind. When the
server is absent the test skips with the reason (`tests.support.require_service`: a failure in
CI, where `ATMOSPHERE_REQUIRE_SERVICES=1`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest

from tests.support import require_service

if TYPE_CHECKING:
    from atmosphere_harness._backends.postgres import PostgresDatabase

HOST = "127.0.0.1"
PORT = 5432
ADMIN_DATABASES = ("test", "postgres")


def url_for(database: str) -> str:
    return f"postgresql://postgres@{HOST}:{PORT}/{database}"


async def _admin(statement: str) -> None:
    import asyncpg

    last: Exception | None = None
    for name in ADMIN_DATABASES:
        try:
            connection = await asyncpg.connect(url_for(name), timeout=5)
        except Exception as exc:
            last = exc
            continue
        try:
            await connection.execute(statement)
            return
        finally:
            await connection.close()
    assert last is not None
    raise last


def _run(statement: str) -> None:
    asyncio.run(_admin(statement))


def create_database(options: str = "") -> str:
    """A new empty database (`options`: what follows `CREATE DATABASE name`, e.g. an encoding);
    returns its URL (skips when PostgreSQL is unavailable)."""
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        require_service("PostgreSQL", "asyncpg is not installed (extra [postgres])")
    name = f"atmo_{uuid.uuid4().hex[:16]}"
    try:
        _run(f'CREATE DATABASE "{name}" {options}'.strip())
    except Exception as exc:
        require_service("PostgreSQL", f"cannot create a database on {HOST}:{PORT}: {exc}")
    return url_for(name)


def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    _run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """The URL of a fresh database, dropped after the test."""
    url = create_database()
    try:
        yield url
    finally:
        drop_database(url)


async def terminate_backends(url: str) -> int:
    """`pg_terminate_backend` every other connection to the database of `url` (an outage)."""
    import asyncpg

    name = url.rsplit("/", 1)[1]
    connection = await asyncpg.connect(url_for(ADMIN_DATABASES[0]), timeout=5)
    try:
        rows = await connection.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
        return len(rows)
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def opened_database() -> AsyncIterator[PostgresDatabase]:
    """A `PostgresDatabase` open on a fresh database (dropped afterwards)."""
    url = await asyncio.to_thread(create_database)
    from atmosphere_harness._backends.postgres import PostgresDatabase

    database = PostgresDatabase(url)
    try:
        await database.open()
        yield database
    finally:
        await database.aclose()
        await asyncio.to_thread(drop_database, url)
