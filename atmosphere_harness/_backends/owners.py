"""`SqliteConversationOwners`: the embedded record of who owns each conversation.

One table of the harness's SQLite file under `workspace_root` (the file the history and the run
journal use, through the process's one connection), so ownership survives a restart: a user's
conversation stays theirs after the app comes back. A claim reads the row and, only when there
is none, inserts it (`INSERT OR IGNORE`) and reads it again in one transaction: processes
sharing the file settle on one owner because SQLite serializes writers. A later prompt of the
owner moves the row's `updated_at` (one small indexed write); the index on `(path, user_key,
updated_at)` serves a user's list, newest first. A derived conversation's row names its
parent (`parent_path`, `parent_id`, indexed for a deletion's look-up of them).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from .._contracts import ExpiredConversation, OwnedConversation
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


def _add_list_columns(connection: sqlite3.Connection) -> None:
    """Give a file written before conversations were listed their `updated_at` and `title`,
    before retention the `sweep_until` claim, and before derived conversations were recorded
    their parent (idempotent); and the indexes a user's list, the retention sweep and a
    deletion's look-up of derived conversations read."""
    columns = {row[1] for row in connection.execute("PRAGMA table_info(conversation_owners)")}
    with Transaction(connection):
        if "updated_at" not in columns:
            connection.execute(
                "ALTER TABLE conversation_owners ADD COLUMN updated_at REAL NOT NULL DEFAULT 0"
            )
            connection.execute("UPDATE conversation_owners SET updated_at = claimed_at")
        if "title" not in columns:
            connection.execute(
                "ALTER TABLE conversation_owners ADD COLUMN title TEXT NOT NULL DEFAULT ''"
            )
        connection.execute(
            "CREATE INDEX IF NOT EXISTS conversation_owners_by_user "
            "ON conversation_owners (path, user_key, updated_at, conversation_id)"
        )
        if "sweep_until" not in columns:
            connection.execute("ALTER TABLE conversation_owners ADD COLUMN sweep_until REAL")
        connection.execute(
            "CREATE INDEX IF NOT EXISTS conversation_owners_idle "
            "ON conversation_owners (updated_at)"
        )
        if "parent_path" not in columns:
            connection.execute("ALTER TABLE conversation_owners ADD COLUMN parent_path TEXT")
            connection.execute("ALTER TABLE conversation_owners ADD COLUMN parent_id TEXT")
        connection.execute(
            "CREATE INDEX IF NOT EXISTS conversation_owners_by_parent "
            "ON conversation_owners (parent_path, parent_id) WHERE parent_id IS NOT NULL"
        )


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
            self._database.add_migration(_add_list_columns)
        await self._database.open()

    async def aclose(self) -> None:
        if self._database is not None:
            database, self._database = self._database, None
            await database.aclose()

    async def scrub(self) -> None:
        """Wipe deleted rows' bytes from the file this table shares with the history and the
        run journal (`SqliteDatabase.scrub`): the host's `Scrubber` for the embedded store."""
        await self.database.scrub()

    async def claim(
        self,
        path: str,
        conversation_id: str,
        user: str,
        title: str = "",
        parent: tuple[str, str] | None = None,
    ) -> str:
        parent_path, parent_id = parent if parent is not None else (None, None)

        def work(connection: sqlite3.Connection) -> str:
            now = time.time()
            with Transaction(connection):
                # Most claims are a conversation's later prompts: the owner's moves its time
                # (and records a parent, once: null for a conversation derived from none).
                connection.execute(
                    "UPDATE conversation_owners SET updated_at = ?, "
                    "parent_path = coalesce(parent_path, ?), "
                    "parent_id = coalesce(parent_id, ?) "
                    "WHERE path = ? AND conversation_id = ? AND user_key = ?",
                    (now, parent_path, parent_id, path, conversation_id, user),
                )
                connection.execute(
                    "INSERT OR IGNORE INTO conversation_owners (path, conversation_id, "
                    "user_key, claimed_at, updated_at, title, parent_path, parent_id) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (path, conversation_id, user, now, now, title, parent_path, parent_id),
                )
                row = connection.execute(_OWNER, (path, conversation_id)).fetchone()
            return str(row[0])

        return await self.database.run_small(work)

    async def owner(self, path: str, conversation_id: str) -> str | None:
        def work(connection: sqlite3.Connection) -> str | None:
            row = connection.execute(_OWNER, (path, conversation_id)).fetchone()
            return None if row is None else str(row[0])

        return await self.database.run_small(work)

    async def children(self, path: str, conversation_id: str) -> list[tuple[str, str]]:
        def work(connection: sqlite3.Connection) -> list[tuple[str, str]]:
            rows = connection.execute(
                "SELECT path, conversation_id FROM conversation_owners "
                "WHERE parent_path = ? AND parent_id = ? AND parent_id IS NOT NULL "
                "ORDER BY path, conversation_id",
                (path, conversation_id),
            ).fetchall()
            return [(str(a), str(b)) for a, b in rows]

        return await self.database.run(work)

    async def page(
        self, path: str, user: str, limit: int, after: tuple[float, str] | None = None
    ) -> list[OwnedConversation]:
        def work(connection: sqlite3.Connection) -> list[OwnedConversation]:
            query = (
                "SELECT conversation_id, updated_at, title FROM conversation_owners "
                "WHERE path = ? AND user_key = ?"
            )
            args: tuple[object, ...] = (path, user)
            if after is not None:
                query += " AND (updated_at, conversation_id) < (?, ?)"
                args += after
            query += " ORDER BY updated_at DESC, conversation_id DESC LIMIT ?"
            rows = connection.execute(query, (*args, limit)).fetchall()
            return [OwnedConversation(str(a), float(b), str(c)) for a, b, c in rows]

        return await self.database.run_small(work)

    async def forget(
        self, path: str, conversation_id: str, *, idle_before: float | None = None
    ) -> bool:
        def work(connection: sqlite3.Connection) -> bool:
            cursor = connection.execute(
                "DELETE FROM conversation_owners WHERE path = ? AND conversation_id = ? "
                "AND (? IS NULL OR updated_at < ?)",
                (path, conversation_id, idle_before, idle_before),
            )
            return cursor.rowcount > 0

        return await self.database.run_small(work)

    async def release(self, path: str, conversation_id: str) -> None:
        def work(connection: sqlite3.Connection) -> None:
            connection.execute(
                "UPDATE conversation_owners SET sweep_until = NULL "
                "WHERE path = ? AND conversation_id = ?",
                (path, conversation_id),
            )

        await self.database.run_small(work)

    async def expired(self, before: float, limit: int, lease: float) -> list[ExpiredConversation]:
        def work(connection: sqlite3.Connection) -> list[ExpiredConversation]:
            now = time.time()
            with Transaction(connection):
                rows = connection.execute(
                    "SELECT path, conversation_id, user_key, updated_at FROM conversation_owners "
                    "WHERE updated_at < ? AND (sweep_until IS NULL OR sweep_until < ?) "
                    "AND parent_id IS NULL ORDER BY updated_at LIMIT ?",
                    (before, now, limit),
                ).fetchall()
                connection.executemany(
                    "UPDATE conversation_owners SET sweep_until = ? "
                    "WHERE path = ? AND conversation_id = ?",
                    [(now + lease, row[0], row[1]) for row in rows],
                )
            return [ExpiredConversation(str(a), str(b), str(c), float(d)) for a, b, c, d in rows]

        return await self.database.run_small(work)
