"""`SqliteRunStore`: durable runs journalled next to the harness's SQLite file (`atmosphere.db`).

One row per run in the SQLite file (who, where, the message, the lease), next to the conversation
history, and the run's frames and checkpoints in an append-only log of its own
(`durable.log.RunLogs`, `atmosphere.db-runs/<row>.log`): an append is one record, one `write()`,
on disk for any later process once it returned, so what an append held survives a SIGKILL of
the process. The exception is the kernel's history mark (`TABLE_KEYS`), a row in
`durable_checkpoints`, so that it is ordered with the history's rows even after a power cut
(neither file is synced on each write: a power cut may lose the last writes, never corrupt).
Rows an earlier version wrote for every frame and checkpoint are still read.

The store is also a `contracts.RunStoreNow`: `append_now` writes an append of at most
`INLINE_BYTES` of payload right on the event loop: a log record needs no lock but the logs' own
(which the loop only tries), and the run's first write and a history mark take the SQLite
connection only if it is idle (`SqliteDatabase.try_now`); a larger append, or one that finds
them in use, goes to the database thread (`append`). Payloads are what `encode` makes: JSON with
its long strings kept out of it as they are (`log.encode_payload`), not compressed (they live
only until the run ends). A finished run is compacted at once: its log is removed (and, at the
next `open`, any log whose run is finished or gone), its row waits for `expire`.

Leases: the embedded store serves one process, but a killed process's runs must not wait for
their lease to run out, so an owner id names its host and pid (`host/pid/token`): a run whose
owner is a dead process on this host (or an earlier life of this very pid) is claimed at once.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._contracts import StoredRun
from .._events import Frame
from .._jsontext import compact_json
from .._memory.sqlite import DATABASE_FILE, SqliteDatabase, Transaction
from .log import (
    Lifted,
    RunLogs,
    decode_payload,
    encode_parts,
    pack_parts,
    payload_size,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS durable_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL UNIQUE,
    path TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    user_key TEXT NOT NULL,
    session_id TEXT NOT NULL,
    message TEXT NOT NULL,
    started_at REAL NOT NULL,
    owner TEXT,
    lease_until REAL NOT NULL DEFAULT 0,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS durable_runs_unfinished
    ON durable_runs (lease_until) WHERE finished_at IS NULL;
CREATE TABLE IF NOT EXISTS durable_frames (
    run INTEGER NOT NULL REFERENCES durable_runs (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    event TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (run, seq)
);
CREATE TABLE IF NOT EXISTS durable_checkpoints (
    run INTEGER NOT NULL REFERENCES durable_runs (id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (run, key)
);
"""

INSERT_FRAME = "INSERT OR REPLACE INTO durable_frames (run, seq, event, data) VALUES (?, ?, ?, ?)"
INSERT_CHECKPOINT = "INSERT OR REPLACE INTO durable_checkpoints (run, key, value) VALUES (?, ?, ?)"

_ENCODE = compact_json(default=str, check_circular=False)
"""The journal's own JSON (`kernel.writer.encode`): compact, ASCII."""
LOGS_SUFFIX = "-runs"
"""The run logs' directory is the database file's name with this after it (`atmosphere.db-runs`)."""
INLINE_BYTES = 256 * 1024
"""Appends with at most this much payload are written on the event loop (see the docstring)."""
WAL_TRIM = 256 * 1024
"""A WAL larger than this after a run is compacted is checkpointed and truncated."""
TABLE_KEYS = ("history:",)
"""Checkpoints kept in SQLite rather than the run's log: the kernel's mark that a turn is in the
history, so that it is ordered with the history's own rows even after a power cut (the log is
never synced; SQLite syncs the WAL before a checkpoint copies it into the file)."""


def _tabled(checkpoints: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    return [item for item in checkpoints if item[0].startswith(TABLE_KEYS)]


def _whole(payload: str) -> str:
    """A payload as one text (a `log.Lifted` one joined), for an SQLite row."""
    return payload.whole() if isinstance(payload, Lifted) else payload


def _unpack(stored: bytes | str) -> Any:
    """A stored payload: what `encode` made of it (JSON text, maybe with lifted strings:
    `log.encode_payload`), or (written by an earlier version) a zlib stream of JSON text, which
    starts with 0x78 as neither does."""
    if isinstance(stored, bytes):
        if stored[:1] == b"\x78":
            return json.loads(zlib.decompress(stored))
        stored = stored.decode("utf-8", "surrogatepass")
    return decode_payload(stored)


def owner_id(token: str) -> str:
    """An owner id for this process: `host/pid/token`."""
    return f"{socket.gethostname()}/{os.getpid()}/{token}"


def _owner_dead(owner: str | None, claimant: str) -> bool:
    """Whether `owner` is a process of this host that no longer runs (never guessed remote)."""
    if not owner or owner == claimant:
        return False
    parts = owner.rsplit("/", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname():
        return False
    try:
        pid = int(parts[1])
    except ValueError:
        return False
    if pid == os.getpid():
        return True  # an earlier life of this pid (a restarted container's pid 1)
    return _process_gone(pid)


def _process_gone(pid: int) -> bool:
    """Whether process `pid` of this host no longer runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class SqliteRunStore:
    """A `contracts.RunStore` in an SQLite file (by default the harness's `atmosphere.db`)."""

    name = "sqlite"

    def __init__(self, path: Path, *, database: SqliteDatabase | None = None) -> None:
        """`database`: a connection of its own instead of the process's shared one (tests of
        two processes on one file use it)."""
        self.path = path
        self._own = database
        if database is not None:
            database.add_schema(SCHEMA)
        self._database: SqliteDatabase | None = None
        self._rows: dict[str, int] = {}
        """run_id -> row id, for the runs this process appended to."""
        self._logs = RunLogs(path.with_name(path.name + LOGS_SUFFIX))

    @staticmethod
    def encode(value: Any) -> str:
        """A payload as this store takes it (`contracts.RunStoreNow`): JSON, its long strings
        lifted out of it as they are (`log.encode_payload`), and left aside until the append
        writes them (a `log.Lifted`: only this store's appends read it whole)."""
        return encode_parts(value, _ENCODE)

    @classmethod
    def under(cls, workspace_root: Path) -> SqliteRunStore:
        return cls(workspace_root / DATABASE_FILE)

    @property
    def database(self) -> SqliteDatabase:
        if self._database is None:
            raise RuntimeError("the durable run store is not open")
        return self._database

    async def open(self) -> None:
        """Join the process's instance of the file (the history's, when it is the same file:
        one connection, so the journal and the history never wait on each other's lock)."""
        if self._database is None:
            if self._own is not None:
                self._database = self._own
            else:
                self._database = SqliteDatabase.shared(self.path)
                self._database.add_schema(SCHEMA)
        await self._database.open()
        await self._database.run(self._sweep)

    def _sweep(self, connection: sqlite3.Connection) -> None:
        """Remove the logs of runs that finished or are gone (a crash between `finish`'s
        commit and its removal of the log leaves one), and the spare logs an earlier version
        left."""
        with self._logs.lock:
            self._logs.sweep_spares(_process_gone)
            rows = self._logs.rows()
            alive = (
                {
                    int(row)
                    for (row,) in connection.execute(
                        "SELECT id FROM durable_runs WHERE finished_at IS NULL"
                    ).fetchall()
                }
                if rows
                else set()
            )
            for row in rows:
                if row not in alive:
                    self._logs.remove(row)

    async def aclose(self) -> None:
        if self._database is not None:
            database, self._database = self._database, None
            with self._logs.lock:
                self._logs.close()
            await database.aclose()

    async def append(
        self,
        run_id: str,
        frames: Sequence[tuple[int, str, str]],
        checkpoints: Sequence[tuple[str, str]],
        *,
        create: StoredRun | None = None,
        owner: str | None = None,
        lease_seconds: float = 0.0,
    ) -> None:
        work = self._append(run_id, frames, checkpoints, create, owner, lease_seconds)

        def locked(connection: sqlite3.Connection) -> None:
            with self._logs.lock:
                work(connection)

        await self.database.run(locked)

    def append_now(
        self,
        run_id: str,
        frames: Sequence[tuple[int, str, str]],
        checkpoints: Sequence[tuple[str, str]],
        *,
        create: StoredRun | None = None,
        owner: str | None = None,
        lease_seconds: float = 0.0,
    ) -> bool:
        """`append`, done right now on the event loop if it is small (`INLINE_BYTES`) and
        nothing else uses what it writes to; `False` if not (nothing was written: call
        `append`). Most appends only write the run's log: no SQLite statement at all."""
        # (A plain payload's size is its length; only a `Lifted` one needs the call.)
        size = 0
        for _, _, data in frames:  # (loops: a generator is a call for every item)
            size += len(data) if type(data) is str else payload_size(data)
        for _, value in checkpoints:
            size += len(value) if type(value) is str else payload_size(value)
        if size > INLINE_BYTES:
            return False
        logs = self._logs
        if not logs.lock.acquire(blocking=False):
            return False
        try:
            row = self._rows.get(run_id)
            if row is not None and create is None and not _tabled(checkpoints):
                if self._database is None:
                    return False
                logs.write(row, pack_parts(frames, checkpoints))
                return True
            work = self._append(run_id, frames, checkpoints, create, owner, lease_seconds)
            return self.database.try_now(work)
        finally:
            logs.lock.release()

    def _append(
        self,
        run_id: str,
        frames: Sequence[tuple[int, str, str]],
        checkpoints: Sequence[tuple[str, str]],
        create: StoredRun | None,
        owner: str | None,
        lease_seconds: float,
    ) -> Callable[[sqlite3.Connection], None]:
        """The work of one append (on the event loop or the database thread), with the logs'
        lock held: the run row if it is new, the log record, then the checkpoints kept in
        SQLite (`TABLE_KEYS`)."""
        known = self._rows.get(run_id)
        tabled = [(key, _whole(value)) for key, value in _tabled(checkpoints)]
        logged = (
            [c for c in checkpoints if not c[0].startswith(TABLE_KEYS)] if tabled else checkpoints
        )

        def work(connection: sqlite3.Connection) -> None:
            row = known
            if create is not None and row is None:
                # (Not when an attempt on the loop stored the row, then found SQLite busy at
                # the history mark: the thread makes the append again, all but the row.)
                row = connection.execute(
                    "INSERT INTO durable_runs (run_id, path, conversation_id, user_key, "
                    "session_id, message, started_at, owner, lease_until) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    (
                        create.run_id,
                        create.path,
                        create.conversation_id,
                        create.user_id or "",
                        create.session_id,
                        create.message,
                        create.started_at,
                        owner,
                        time.time() + lease_seconds,
                    ),
                ).fetchone()[0]
                self._rows[run_id] = int(row)
            if row is None:
                found = connection.execute(
                    "SELECT id FROM durable_runs WHERE run_id = ?", (run_id,)
                ).fetchone()
                if found is None:
                    raise LookupError(f"durable run {run_id} is not in the store")
                row = int(found[0])
            if frames or logged or create is not None:
                self._logs.write(int(row), pack_parts(frames, logged), new=create is not None)
            if len(tabled) == 1:
                connection.execute(INSERT_CHECKPOINT, (row, *tabled[0]))
            elif tabled:
                with Transaction(connection):
                    connection.executemany(
                        INSERT_CHECKPOINT, [(row, key, value) for key, value in tabled]
                    )
            self._rows[run_id] = int(row)

        return work

    async def load(self, run_id: str, limit: int) -> tuple[dict[str, Any], list[Frame]]:
        def work(
            connection: sqlite3.Connection,
        ) -> tuple[tuple[Any, ...] | None, list[Any], list[Any]]:
            run = connection.execute(
                "SELECT id, session_id, conversation_id FROM durable_runs WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            if run is None:
                return None, [], []
            # Rows an earlier version wrote (every frame and checkpoint), then the log's.
            checkpoints = connection.execute(
                "SELECT key, value FROM durable_checkpoints WHERE run = ?", (run[0],)
            ).fetchall()
            frames = connection.execute(
                "SELECT seq, event, data FROM durable_frames WHERE run = ?", (run[0],)
            ).fetchall()
            with self._logs.lock:
                logged_frames, logged_checkpoints = self._logs.read(int(run[0]))
            return run, checkpoints + logged_checkpoints, frames + logged_frames

        run, checkpoints, frames = await self.database.run(work)
        if run is None:
            return {}, []
        self._rows[run_id] = int(run[0])
        latest = {int(seq): (event, data) for seq, event, data in frames}
        kept = sorted(latest)[-limit:] if limit > 0 else []
        return (
            {key: _unpack(value) for key, value in checkpoints},
            [Frame(latest[seq][0], _unpack(latest[seq][1]), run[1], run[2], seq) for seq in kept],
        )

    async def claim(self, owner: str, lease_seconds: float, limit: int) -> list[StoredRun]:
        def work(connection: sqlite3.Connection) -> list[Any]:
            now = time.time()
            with Transaction(connection):
                rows = connection.execute(
                    "SELECT id, run_id, path, conversation_id, user_key, session_id, message, "
                    "started_at, owner, lease_until FROM durable_runs "
                    "WHERE finished_at IS NULL AND (owner IS NULL OR owner != ?) "
                    "ORDER BY started_at",
                    (owner,),
                ).fetchall()
                taken = [row for row in rows if row[9] < now or _owner_dead(row[8], owner)][:limit]
                connection.executemany(
                    "UPDATE durable_runs SET owner = ?, lease_until = ? WHERE id = ?",
                    [(owner, now + lease_seconds, row[0]) for row in taken],
                )
                return taken

        taken = await self.database.run(work)
        claimed = []
        for row in taken:
            self._rows[row[1]] = int(row[0])
            claimed.append(
                StoredRun(
                    run_id=row[1],
                    path=row[2],
                    conversation_id=row[3],
                    user_id=row[4] or None,
                    session_id=row[5],
                    message=row[6],
                    started_at=float(row[7]),
                )
            )
        return claimed

    async def heartbeat(self, owner: str, lease_seconds: float) -> None:
        until = time.time() + lease_seconds
        await self.database.run(
            lambda connection: connection.execute(
                "UPDATE durable_runs SET lease_until = ? WHERE owner = ? AND finished_at IS NULL",
                (until, owner),
            )
        )

    async def release(self, owner: str) -> None:
        await self.database.run(
            lambda connection: connection.execute(
                "UPDATE durable_runs SET lease_until = 0 WHERE owner = ? AND finished_at IS NULL",
                (owner,),
            )
        )

    async def finish(self, run_id: str) -> None:
        now = time.time()

        def work(connection: sqlite3.Connection) -> None:
            legacy = 0
            with Transaction(connection):
                row = connection.execute(
                    "UPDATE durable_runs SET finished_at = ?, message = '' WHERE run_id = ? "
                    "RETURNING id",
                    (now, run_id),
                ).fetchone()
                if row is not None:
                    legacy = connection.execute(
                        "DELETE FROM durable_frames WHERE run = ?", row
                    ).rowcount
                    connection.execute("DELETE FROM durable_checkpoints WHERE run = ?", row)
            if row is not None:
                with self._logs.lock:
                    self._logs.remove(int(row[0]))
            if not legacy:
                return  # (its frames were in the log: nothing much was freed)
            # Rows of an earlier version, which kept everything in SQLite: give their pages back
            # (`auto_vacuum=INCREMENTAL`, see `SqliteDatabase`) and cut a grown WAL.
            connection.executescript("PRAGMA incremental_vacuum;")
            wal = self.path.with_name(self.path.name + "-wal")
            try:
                grown = wal.stat().st_size > WAL_TRIM
            except OSError:
                grown = False
            if grown:
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

        self._rows.pop(run_id, None)
        await self.database.run(work)

    async def forget(self, path: str, conversation_id: str) -> None:
        """Drop the conversation's finished runs, their frames, checkpoints and logs."""

        def work(connection: sqlite3.Connection) -> list[Any]:
            with Transaction(connection):
                rows = connection.execute(
                    "SELECT id, run_id FROM durable_runs WHERE path = ? AND conversation_id = ? "
                    "AND finished_at IS NOT NULL",
                    (path, conversation_id),
                ).fetchall()
                for row in rows:
                    connection.execute("DELETE FROM durable_frames WHERE run = ?", (row[0],))
                    connection.execute("DELETE FROM durable_checkpoints WHERE run = ?", (row[0],))
                    connection.execute("DELETE FROM durable_runs WHERE id = ?", (row[0],))
            with self._logs.lock:
                for row in rows:
                    self._logs.remove(int(row[0]))
            return rows

        for _row, run_id in await self.database.run(work):
            self._rows.pop(run_id, None)

    async def expire(self, before: float) -> int:
        def work(connection: sqlite3.Connection) -> int:
            cursor = connection.execute(
                "DELETE FROM durable_runs WHERE finished_at IS NOT NULL AND finished_at < ?",
                (before,),
            )
            return cursor.rowcount

        return await self.database.run(work)
