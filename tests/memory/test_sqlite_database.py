"""`SqliteDatabase.try_now` / `run_small`: short work on the event loop, and what keeps it from
waiting."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from atmosphere_harness._memory.sqlite import (
    CHECKPOINT_FROM,
    Elsewhere,
    SqliteDatabase,
    Transaction,
)

SCHEMA = "CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, body BLOB NOT NULL);"


@pytest.fixture
async def database(tmp_path: Path) -> AsyncIterator[SqliteDatabase]:
    database = SqliteDatabase(tmp_path / "atmosphere.db")
    database.add_schema(SCHEMA)
    await database.open()
    try:
        yield database
    finally:
        await database.aclose()


def insert(body: str | bytes) -> Callable[[sqlite3.Connection], None]:
    def work(connection: sqlite3.Connection) -> None:
        connection.execute("INSERT INTO notes (body) VALUES (?)", (body,))

    return work


async def count(database: SqliteDatabase) -> int:
    def work(connection: sqlite3.Connection) -> int:
        return int(connection.execute("SELECT count(*) FROM notes").fetchone()[0])

    return await database.run(work)


async def test_try_now_writes_on_the_calling_thread_without_waiting_for_a_lock(
    database: SqliteDatabase,
) -> None:
    seen: list[tuple[int, int]] = []

    def work(connection: sqlite3.Connection) -> None:
        (timeout,) = connection.execute("PRAGMA busy_timeout").fetchone()
        seen.append((threading.get_ident(), int(timeout)))
        connection.execute("INSERT INTO notes (body) VALUES ('now')")

    assert database.try_now(work)
    assert seen == [(threading.get_ident(), 0)]  # the loop's thread, and it never waits
    assert await count(database) == 1
    # Work on the database thread still waits for another connection's lock as before.
    timeouts = await database.run(lambda c: c.execute("PRAGMA busy_timeout").fetchone()[0])
    assert timeouts == 5000


async def test_try_now_refuses_while_the_database_thread_uses_the_connection(
    database: SqliteDatabase,
) -> None:
    inside, release = threading.Event(), threading.Event()

    def slow(connection: sqlite3.Connection) -> None:
        inside.set()
        release.wait(10)

    running = asyncio.ensure_future(database.run(slow))
    await asyncio.to_thread(inside.wait, 10)
    assert not database.try_now(insert("refused"))  # nothing ran
    release.set()
    await running
    assert await count(database) == 0
    assert database.try_now(insert("now"))
    assert await count(database) == 1


async def test_try_now_refuses_when_another_connection_holds_the_write_lock(
    database: SqliteDatabase, tmp_path: Path
) -> None:
    other = sqlite3.connect(tmp_path / "atmosphere.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        assert not database.try_now(insert("refused"))
        other.execute("COMMIT")
    finally:
        other.close()
    assert await count(database) == 0
    await database.run(insert("on the thread"))  # what the caller does next
    assert await count(database) == 1


async def test_a_wal_grown_by_writes_on_the_loop_is_checkpointed_by_the_thread(
    database: SqliteDatabase, tmp_path: Path
) -> None:
    wal = tmp_path / "atmosphere.db-wal"
    row = b"x" * (64 * 1024)
    rows = 3 * CHECKPOINT_FROM // len(row)
    for _ in range(rows):
        assert database.try_now(insert(row))
        await database.run(lambda connection: None)  # lets a queued checkpoint run
    # SQLite's own checkpoint is off: without the thread's, the WAL would hold all 3 MiB.
    assert wal.stat().st_size < 2 * CHECKPOINT_FROM
    assert await count(database) == rows
    (autocheckpoint,) = await database.run(
        lambda c: c.execute("PRAGMA wal_autocheckpoint").fetchone()
    )
    assert autocheckpoint == 0


async def test_a_checkpoint_without_a_wal_file_is_nothing_to_do(
    database: SqliteDatabase, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The WAL file can be gone (its folder removed under a closing app, as a temporary
    workspace is): the thread's checkpoint then has nothing to do, and says nothing."""
    database._wal = tmp_path / "gone" / "atmosphere.db-wal"
    database._checkpoint_from = 0  # any WAL would be "grown"
    await database.run(lambda connection: database._checkpoint_if_grown(connection))
    assert "checkpointing the SQLite WAL failed" not in caplog.text
    assert database.try_now(insert(b"still fine"))
    assert await count(database) == 1


async def test_work_that_says_elsewhere_is_rolled_back_and_run_on_the_thread(
    database: SqliteDatabase,
) -> None:
    ran_on: list[tuple[int, bool]] = []

    def work(connection: sqlite3.Connection) -> int:
        ran_on.append((threading.get_ident(), database.inline))
        with Transaction(connection):
            connection.execute("INSERT INTO notes (body) VALUES ('once')")
            if database.inline:
                raise Elsewhere
        return int(connection.execute("SELECT count(*) FROM notes").fetchone()[0])

    assert await database.run_small(work) == 1  # the loop's insert was rolled back
    loop_thread = threading.get_ident()
    assert [inline for _, inline in ran_on] == [True, False]
    assert ran_on[0][0] == loop_thread
    assert ran_on[1][0] != loop_thread
    assert not database.inline


async def test_run_small_gives_the_result_of_work_done_on_the_loop(
    database: SqliteDatabase,
) -> None:
    threads: list[int] = []

    def work(connection: sqlite3.Connection) -> str:
        threads.append(threading.get_ident())
        connection.execute("INSERT INTO notes (body) VALUES ('here')")
        return "stored"

    assert await database.run_small(work) == "stored"
    assert threads == [threading.get_ident()]
    assert await count(database) == 1


async def test_a_commit_refused_on_the_loop_leaves_no_transaction_open(
    database: SqliteDatabase, tmp_path: Path
) -> None:
    """A BUSY inside the work (here: the write lock taken by another connection after the
    transaction began) must not leave the connection in a transaction for the thread."""
    other = sqlite3.connect(tmp_path / "atmosphere.db", isolation_level=None)
    try:

        def work(connection: sqlite3.Connection) -> None:
            connection.execute("BEGIN")
            connection.execute("SELECT count(*) FROM notes").fetchone()
            other.execute("BEGIN IMMEDIATE")  # now this connection cannot upgrade to a write
            connection.execute("INSERT INTO notes (body) VALUES ('refused')")

        assert not database.try_now(work)
        other.execute("COMMIT")
    finally:
        other.close()
    assert not await database.run(lambda connection: connection.in_transaction)
    await database.run(insert("on the thread"))
    assert await count(database) == 1
