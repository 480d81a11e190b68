"""`SqliteDatabase`: one embedded SQLite file, used from asyncio without blocking the loop.

Every operation hops to one dedicated worker thread that owns the connection, so operations run
one at a time in submission order (SQLite allows a single writer anyway) and the event loop never
waits on disk. This is what `aiosqlite` does, in the few lines the harness needs, without the
dependency. The file runs in WAL mode with `synchronous=NORMAL`: a crash of the process loses
nothing committed; a power cut can lose the last transactions, never corrupt the file.

`SqliteDatabase.shared(path)` gives every user of one file in a process (the history, long-term
memory, the durable run journal) the same instance: one connection and one thread, so they never
wait on each other's write lock; it closes when its last user closes it.

`try_now(work)` runs a short write (or a read of a bounded result) right on the event loop when
the connection is idle (a durable run's append, a history's check of its cached copy: a hop to
the thread and back costs more than the work, and far more when the loop is busy, since the
thread then waits for the GIL after each statement); `run_small` is that, or `run`. That
is safe for the loop because nothing in such a write waits: with WAL and `synchronous=NORMAL` a
commit is a `write()` into the page cache, never an `fsync`; the connection never waits for a
lock on the loop (`busy_timeout` is 0 there: a busy file sends the work to the thread); and the
two steps that do sync, a checkpoint and the first write into a WAL restarted after one, run on
the database thread: SQLite's automatic checkpoint is off, and the thread checkpoints a WAL grown
past `CHECKPOINT_FROM` itself, then restarts it with a write of its own.

Deleted data does not linger: `secure_delete` zeroes deleted cells, and after a deletion `scrub`
gives the freed pages back to the file system, then checkpoints the WAL, which still holds the
pages as they were, into the file and truncates it (see docs/security.md, "Deleted data").
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from .._log import get_logger

log = get_logger(__name__)

T = TypeVar("T")

DATABASE_FILE = "atmosphere.db"
"""The harness's embedded database, directly under `workspace_root`."""

CHECKPOINT_FROM = 1024 * 1024
"""WAL bytes past which the database thread checkpoints the WAL into the file (SQLite's own
limit, 1000 pages, is as much with 1 KiB pages). Also the size the WAL is cut back to."""
BUSY_TIMEOUT_MS = 5000
"""How long work on the database thread waits for another connection's write lock."""
SECURE_DELETE = "FAST"
"""SQLite's `secure_delete`: a deleted cell is overwritten with zeroes in the page that held it
(which is written anyway: no extra I/O); a page the deletion frees keeps its bytes until
`scrub` gives it back to the file system. A file without incremental auto-vacuum (written by
an early version) cannot give pages back: its connection uses `ON`, which zeroes them too."""

AUTO_VACUUM_INCREMENTAL = 2
"""What `PRAGMA auto_vacuum` answers for a file with incremental auto-vacuum."""

_SHARED: dict[Path, SqliteDatabase] = {}


class Elsewhere(BaseException):
    """Raised by work given to `try_now` that finds it cannot stay within the loop's bound (a
    query about to read an unbounded result): `try_now` says `False`, and a transaction the
    work opened is rolled back by it (`Transaction`). A signal, not an error: a `BaseException`
    (like `asyncio.CancelledError`), so an `except Exception` in the work lets it through."""


class SqliteDatabase:
    """A lazily opened SQLite file with its own thread; `schema` scripts run once on open."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._schemas: list[str] = []
        self._migrations: list[Callable[[sqlite3.Connection], None]] = []
        self._connection: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._guard = threading.Lock()
        self._busy = threading.Lock()
        """Held while the connection is in use: by the database thread, or by the event loop
        for an `inline` operation (which never waits for it)."""
        self._wal = self.path.with_name(self.path.name + "-wal")
        self._checkpoint_from = CHECKPOINT_FROM
        self._checkpoint_queued = False
        self._closed = False
        self._users = 0
        """Users of a `shared` instance that have not closed it yet."""
        self.inline = False
        """True while work runs on the event loop (`try_now`), which may then raise
        `Elsewhere`."""
        self._late: list[Callable[[sqlite3.Connection], object]] = []
        """Schemas and migrations added to a shared instance after it opened: run before its
        next operation."""

    @classmethod
    def shared(cls, path: str | Path) -> SqliteDatabase:
        """This process's instance for `path`, one more user counted (`aclose` un-counts)."""
        key = Path(path).absolute()
        database = _SHARED.get(key)
        if database is None or database._closed:
            database = _SHARED[key] = cls(key)
        database._users += 1
        return database

    def add_schema(self, script: str) -> None:
        """Register DDL (idempotent `CREATE ... IF NOT EXISTS`) to run when the file opens
        (on a shared instance already open: before its next operation)."""
        if self._closed:
            raise RuntimeError(f"database {self.path} is closed")
        if self._connection is not None or self._executor is not None:
            if not self._users:
                raise RuntimeError(f"database {self.path} is already open: add schemas before")
            self._late.append(lambda connection: connection.executescript(script))
            return
        self._schemas.append(script)

    def add_migration(self, migrate: Callable[[sqlite3.Connection], None]) -> None:
        """Register `migrate(connection)` to run on open, after every schema script.

        For what DDL alone cannot do on a file written by an older version (a new column that
        needs filling, an index that needs its rows cleaned first); it must be idempotent. On a
        shared instance already open, it runs before the next operation.
        """
        if self._closed:
            raise RuntimeError(f"database {self.path} is closed")
        if self._connection is not None or self._executor is not None:
            if not self._users:
                raise RuntimeError(f"database {self.path} is already open: add migrations before")
            self._late.append(migrate)
            return
        self._migrations.append(migrate)

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work(connection)` on the database thread and return its result."""
        if self._closed:
            raise RuntimeError(f"database {self.path} is closed")
        if self._executor is None:
            with self._guard:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="atmosphere-sqlite")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, work)

    async def run_small(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work(connection)` on the event loop if `try_now` can (no hop to the thread and
        back: it costs more than a short statement, and far more when the loop is busy), else
        on the database thread (`run`). Only for work `try_now` allows; `work` may raise
        `Elsewhere` to be run on the thread instead."""
        done: list[T] = []
        if self.try_now(lambda connection: done.append(work(connection))):
            return done[0]
        return await self.run(work)

    def try_now(self, work: Callable[[sqlite3.Connection], object]) -> bool:
        """Run `work(connection)` right here, on the event loop, if the connection is open and
        idle; `False` (nothing ran, or what ran was rolled back) if it is not, if another
        connection holds the file's write lock (the caller then uses `run`, whose thread waits
        for it), or if `work` raised `Elsewhere`.

        Only for a short write or read of a bounded size: the loop does nothing else meanwhile
        (see the module docstring for why it never waits on the disk or on a lock). A read
        that finds it would return an unbounded result raises `Elsewhere` before it does.
        """
        if self._closed or self._late or not self._busy.acquire(blocking=False):
            return False
        try:
            if self._connection is None:
                return False
            self.inline = True
            try:
                work(self._connection)
            except Elsewhere:
                return False
            except sqlite3.OperationalError as error:
                if error.sqlite_errorcode == sqlite3.SQLITE_BUSY:
                    if self._connection.in_transaction:  # (a COMMIT found it busy)
                        self._connection.rollback()
                    return False
                raise
            finally:
                self.inline = False
        finally:
            self._busy.release()
        if not self._checkpoint_queued and self._executor is not None:
            try:
                grown = os.stat(self._wal).st_size > self._checkpoint_from
            except OSError:
                grown = False
            if grown:
                self._checkpoint_queued = True
                self._executor.submit(self._call, self._queued_checkpoint)
        return True

    async def open(self) -> None:
        """Create the file and its tables now (otherwise the first operation does)."""
        await self.run(lambda connection: None)

    def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._busy:
            if self._connection is None:
                self._connection = self._connect()
            connection = self._connection
            while self._late:
                self._late.pop(0)(connection)
            connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            try:
                return work(connection)
            finally:
                self._checkpoint_if_grown(connection)
                connection.execute("PRAGMA busy_timeout=0")

    def _queued_checkpoint(self, connection: sqlite3.Connection) -> None:
        self._checkpoint_queued = False  # `_call` checkpoints after it

    def _checkpoint_if_grown(self, connection: sqlite3.Connection) -> None:
        """On the database thread: checkpoint a WAL grown past its limit, then restart it.

        The restart is a write of its own (the header of a restarted WAL is synced by the first
        write into it, and that must not be an inline write on the event loop)."""
        if connection.in_transaction:
            return
        try:
            try:
                size = os.stat(self._wal).st_size
            except FileNotFoundError:
                return  # no WAL (none written yet, or the last connection closed): nothing to do
            if size <= self._checkpoint_from:
                return
            busy, frames, copied = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if busy or copied < frames:
                # Another connection still reads older pages: try again once it grew as much.
                self._checkpoint_from = size + CHECKPOINT_FROM
                return
            self._checkpoint_from = CHECKPOINT_FROM
            with Transaction(connection):
                (version,) = connection.execute("PRAGMA user_version").fetchone()
                connection.execute(f"PRAGMA user_version={int(version)}")
        except (OSError, sqlite3.Error):
            log.warning("checkpointing the SQLite WAL failed; retrying later", exc_info=True)

    async def scrub(self) -> None:
        """Wipe what the files still hold of deleted rows, after a deletion (`Scrubber`).

        `secure_delete` already zeroed the deleted cells in the pages the deletion wrote, but
        the pages it freed (an overflow page of a long message) still hold their bytes, and
        every page written sits in the WAL, with the earlier versions of it, until a
        checkpoint. So this gives the free pages back to the file system (`incremental_vacuum`:
        pages at the file's end move into the free ones, and the file is cut), then copies the
        WAL into the file and truncates it to nothing (`wal_checkpoint(TRUNCATE)`).
        Another process reading the file at that moment keeps the WAL from being truncated: the
        scrub then logs a warning, and the next one (or the next checkpoint) finishes it.
        """
        if self._closed or (self._connection is None and self._executor is None):
            return  # never opened: it holds nothing
        await self.run(self._scrub)

    def _scrub(self, connection: sqlite3.Connection) -> None:
        try:
            (vacuum,) = connection.execute("PRAGMA auto_vacuum").fetchone()
            if vacuum == AUTO_VACUUM_INCREMENTAL:
                connection.executescript("PRAGMA incremental_vacuum;")
            busy, _frames, _copied = connection.execute(
                "PRAGMA wal_checkpoint(TRUNCATE)"
            ).fetchone()
            if busy:
                log.warning(
                    "the SQLite WAL could not be truncated after a deletion (another "
                    "connection reads the file); the next scrub or checkpoint does it",
                    database=str(self.path),
                )
                return
            # Restart the WAL here, on the database thread (see `_checkpoint_if_grown`).
            with Transaction(connection):
                (version,) = connection.execute("PRAGMA user_version").fetchone()
                connection.execute(f"PRAGMA user_version={int(version)}")
        except (OSError, sqlite3.Error):
            log.warning("scrubbing the SQLite file after a deletion failed", exc_info=True)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        # Both only take effect on a new file. Small pages waste less of the last page of each
        # large payload (the history's rows are mostly that); incremental auto-vacuum lets the
        # history give the pages of packed-away payloads back to the file system.
        connection.execute("PRAGMA page_size=1024")
        connection.execute("PRAGMA auto_vacuum=INCREMENTAL")
        _switch_to_wal(connection)
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        connection.execute("PRAGMA foreign_keys=ON")
        # Deleted cells are overwritten with zeroes, so a deleted conversation's bytes do not
        # linger in the pages still in use (`scrub` removes the free pages and clears the WAL).
        (vacuum,) = connection.execute("PRAGMA auto_vacuum").fetchone()
        secure = SECURE_DELETE if vacuum == AUTO_VACUUM_INCREMENTAL else "ON"
        connection.execute(f"PRAGMA secure_delete={secure}")
        # After a checkpoint the WAL file is cut back to this size instead of staying large.
        connection.execute(f"PRAGMA journal_size_limit={CHECKPOINT_FROM}")
        # Checkpoints are this class's (`_checkpoint_if_grown`), on the database thread.
        connection.execute("PRAGMA wal_autocheckpoint=0")
        for script in self._schemas:
            connection.executescript(script)
        for migrate in self._migrations:
            migrate(connection)
        return connection

    async def aclose(self) -> None:
        """Checkpoint the WAL into the main file and close; later calls raise. A shared
        instance closes when its last user closes it."""
        if self._closed:
            return
        if self._users > 1:
            self._users -= 1
            return
        if _SHARED.get(self.path) is self:
            del _SHARED[self.path]
        executor = self._executor
        if executor is not None:
            await asyncio.get_running_loop().run_in_executor(executor, self._close_connection)
            executor.shutdown(wait=True)
        self._closed = True

    def _close_connection(self) -> None:
        with self._busy:
            if self._connection is None:
                return
            try:
                self._connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                self._connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._connection.close()
                self._connection = None


class Transaction:
    """`with Transaction(connection):` — BEGIN IMMEDIATE, COMMIT, or ROLLBACK on error."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    def __enter__(self) -> sqlite3.Connection:
        self.connection.execute("BEGIN IMMEDIATE")
        return self.connection

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        if kind is None:
            self.connection.execute("COMMIT")
        else:
            self.connection.execute("ROLLBACK")


def _switch_to_wal(connection: sqlite3.Connection) -> None:
    """Put the file in WAL mode. Two connections opening a new file at once (two replicas, two
    stores) race for it, and SQLite answers the loser "database is locked" at once, without
    waiting through the busy timeout: try again until `BUSY_TIMEOUT_MS` has passed."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
