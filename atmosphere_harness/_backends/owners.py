"""`SqliteConversationOwners`: the embedded record of who owns each conversation.

One table of the harness's SQLite file under `workspace_root` (the file the history and the run
journal use, through the process's one connection), so ownership survives a restart: a user's
conversation stays theirs after the app comes back. A claim reads the row and, only when there
is none, inserts it (`INSERT OR IGNORE`) and reads it again in one transaction: processes
sharing the file settle on one owner because SQLite serializes writers.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from .._memory.sqlite import DATABASE_FILE, SqliteDatabase, Transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversation_owners (
    path TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    user_key TEXT NOT NULL,
    claimed_at REAL NOT NULL,
    PRIMARY KEY (path, conversation_id)
) WITHOUT ROWID;
"""

_OWNER = "SELECT user_key FROM conversation_owners WHERE path = ? AND conversation_id = ?"


class SqliteConversationOwners:
    """`contracts.ConversationOwners` in the embedded SQLite file (a `Resource` of the host)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._database: SqliteDatabase | None = None

    @classmethod
    def under(cls, workspace_root: Path) -> SqliteConversationOwners:
        return cls(workspace_root / DATABASE_FILE)

    @property
    def database(self) -> SqliteDatabase:
        if self._database is None:
            raise RuntimeError("the conversation owners' database is not open")
        return self._database

    async def open(self) -> None:
        if self._database is None:
            self._database = SqliteDatabase.shared(self.path)
            self._database.add_schema(SCHEMA)
        await self._database.open()

    async def aclose(self) -> None:
        if self._database is not None:
            database, self._database = self._database, None
            await database.aclose()

    async def claim(self, path: str, conversation_id: str, user: str) -> str:
        def work(connection: sqlite3.Connection) -> str:
            # Most claims are a conversation's later prompts: a read, no write.
            row = connection.execute(_OWNER, (path, conversation_id)).fetchone()
            if row is not None:
                return str(row[0])
            with Transaction(connection):
                connection.execute(
                    "INSERT OR IGNORE INTO conversation_owners "
                    "(path, conversation_id, user_key, claimed_at) VALUES (?, ?, ?, ?)",
                    (path, conversation_id, user, time.time()),
                )
                row = connection.execute(_OWNER, (path, conversation_id)).fetchone()
            return str(row[0])

        return await self.database.run_small(work)

    async def owner(self, path: str, conversation_id: str) -> str | None:
        def work(connection: sqlite3.Connection) -> str | None:
            row = connection.execute(_OWNER, (path, conversation_id)).fetchone()
            return None if row is None else str(row[0])

        return await self.database.run_small(work)

    async def forget(self, path: str, conversation_id: str) -> None:
        def work(connection: sqlite3.Connection) -> None:
            connection.execute(
                "DELETE FROM conversation_owners WHERE path = ? AND conversation_id = ?",
                (path, conversation_id),
            )

        await self.database.run_small(work)
