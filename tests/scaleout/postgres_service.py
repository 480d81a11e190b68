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
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
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


class PrivatePostgres:
    """A PostgreSQL server of the test's own (`initdb` in a fresh directory, a free port), which
    the test may stop and restart, so an outage never touches the shared server. As root, the
    server runs as the `postgres` user (PostgreSQL refuses root)."""

    def __init__(self) -> None:
        initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
        if initdb is None or pg_ctl is None:
            require_service("PostgreSQL binaries", "initdb/pg_ctl not on PATH (private server)")
        assert initdb is not None
        assert pg_ctl is not None
        self.initdb, self.pg_ctl = initdb, pg_ctl
        self.user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                require_service("PostgreSQL", "running as root without a postgres user")
        # Not under pytest's base directory: the server's user must be able to reach it.
        self.directory = Path(tempfile.mkdtemp(prefix="atmosphere-pg-"))
        self.data = self.directory / "data"
        self.port = _free_port()
        if self.user is not None:
            os.chown(self.directory, self.user.pw_uid, self.user.pw_gid)
        self._command([self.initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust"])

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@{HOST}:{self.port}/{database}"

    def start(self) -> PrivatePostgres:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses={HOST} -c fsync=off"
        log = str(self.directory / "server.log")
        self._command([self.pg_ctl, "-D", str(self.data), "-l", log, "-o", options, "-w", "start"])
        return self

    def stop(self) -> None:
        """Stop at once (`immediate`: connections are cut, as in a crash or a lost network)."""
        self._command([self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"])

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _command(self, argv: list[str]) -> None:
        user = self.user

        def as_user() -> None:
            if user is not None:
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)

        subprocess.run(
            argv,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=as_user,
            timeout=120,
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres().start()
    try:
        yield server
    finally:
        server.remove()
