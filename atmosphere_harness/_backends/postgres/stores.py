"""`PostgresWorkspaceStores`: workspace files in PostgreSQL for the filesystem primitive.

It names every store so that replicas agree on it without sharing a volume, and applies the
conversation cap in SQL:

| store | name (`atmosphere_files.store`) |
|---|---|
| a conversation's workspace | `files:{owner}/{conversation}` |
| a user's `/memories` | `memories:{owner}/{user}` |
| a `prefix=postgres:` route | `route:{prefix}` (every owner, conversation and replica) |

`{owner}` is the owner root relative to `workspace_root` (`owner_key`), alike on every replica
even when their local roots differ.

The conversation cap (`FileSystemLimits.max_conversations`) is applied when a conversation
writes its first file, inside that write's transaction: under an advisory lock on the owner
(so replicas count one at a time), the owner's stores are counted and, at the cap, the least
recently written are deleted down to 7/8 of it. A store is never evicted while another replica
uses it: not if anything wrote it within `protect_seconds` (the conversation idle timeout),
and not while a change to it is in flight (its store lock is taken with a `try`, and a busy
store is skipped). When every candidate is in use the owner goes over the cap for a while,
with a WARN, like the plan cap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..._filesystem.base import AgentFileSystem, FileSystemLimits
from ..._filesystem.provider import EVICTION_SLACK
from ..._log import get_logger
from .database import PostgresDatabase
from .workspace import PostgresAgentFileSystem

log = get_logger(__name__)

_CAP_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('atmosphere_files_cap:' || $1, 0))"
_TRY_STORE = "SELECT pg_try_advisory_xact_lock(hashtextextended('atmosphere_files:' || $1, 0))"
_OWNER_STORES = (
    "SELECT store, max(updated_at) AS stamp FROM atmosphere_files "
    "WHERE starts_with(store, $1) AND strpos(substr(store, length($1) + 1), '/') = 0 "
    "GROUP BY store ORDER BY stamp, store"
)


def owner_key(root: Path, workspace_root: Path) -> str:
    """An owner root as rows name it: relative to `workspace_root`, alike on every replica."""
    try:
        return root.resolve().relative_to(workspace_root.resolve()).as_posix()
    except ValueError:
        return root.as_posix()


class PostgresWorkspaceStores:
    """`filesystem.stores.WorkspaceStores` on one `PostgresDatabase`."""

    name = "postgres"

    def __init__(
        self, database: PostgresDatabase, workspace_root: Path, *, protect_seconds: float
    ) -> None:
        self.database = database
        self.workspace_root = workspace_root
        self.protect_seconds = protect_seconds

    def __repr__(self) -> str:
        return "PostgresWorkspaceStores()"

    def _prefix(self, owner_root: Path) -> str:
        return f"files:{owner_key(owner_root, self.workspace_root)}/"

    def conversation(
        self, owner_root: Path, conversation: str, limits: FileSystemLimits
    ) -> AgentFileSystem:
        prefix = self._prefix(owner_root)

        async def make_room(connection: Any) -> None:
            await self._make_room(connection, prefix, limits.max_conversations)

        return PostgresAgentFileSystem(
            self.database, prefix + conversation, limits, on_create=make_room
        )

    def memories(self, owner_root: Path, user: str, limits: FileSystemLimits) -> AgentFileSystem:
        owner = owner_key(owner_root, self.workspace_root)
        return PostgresAgentFileSystem(self.database, f"memories:{owner}/{user}", limits)

    def route(self, prefix: str, limits: FileSystemLimits) -> AgentFileSystem:
        return PostgresAgentFileSystem(self.database, f"route:{prefix}", limits)

    async def has_conversation(self, owner_root: Path, conversation: str) -> bool:
        store = self._prefix(owner_root) + conversation

        async def work(connection: Any) -> bool:
            return bool(
                await connection.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM atmosphere_files WHERE store = $1)", store
                )
            )

        return await self.database.run(work)

    async def conversations(self, owner_root: Path) -> list[str]:
        prefix = self._prefix(owner_root)

        async def work(connection: Any) -> list[Any]:
            rows: list[Any] = await connection.fetch(_OWNER_STORES, prefix)
            return rows

        return sorted(row["store"][len(prefix) :] for row in await self.database.run(work))

    async def forget(self, owner_root: Path, conversation: str) -> None:
        await self._drop(self._prefix(owner_root) + conversation)

    async def forget_memories(self, owner_root: Path, user: str) -> None:
        await self._drop(f"memories:{owner_key(owner_root, self.workspace_root)}/{user}")

    async def _drop(self, store: str) -> None:
        """Delete a store's files and its change records."""

        async def work(connection: Any) -> None:
            async with connection.transaction():
                # Waits for a change to the store in flight (it holds this lock) to commit.
                await connection.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended('atmosphere_files:' || $1, 0))",
                    store,
                )
                await connection.execute("DELETE FROM atmosphere_files WHERE store = $1", store)
                await connection.execute(
                    "DELETE FROM atmosphere_file_changes WHERE store = $1", store
                )

        await self.database.run(work)

    async def _make_room(self, connection: Any, prefix: str, cap: int) -> None:
        """Keep the owner of `prefix` under `cap` conversations before a new one is stored
        (inside the new store's write transaction, on its connection)."""
        await connection.execute(_CAP_LOCK, prefix)
        rows = await connection.fetch(_OWNER_STORES, prefix)
        if len(rows) < cap:
            return
        excess = len(rows) - (cap - 1 - cap // EVICTION_SLACK)
        remaining = len(rows) + 1
        # The database's clock, which stamped the rows (a replica's clock may be skewed).
        cutoff = float(
            await connection.fetchval(
                "SELECT extract(epoch FROM clock_timestamp())::float8 - $1::float8",
                self.protect_seconds,
            )
        )
        for row in rows:
            if excess <= 0 or row["stamp"] >= cutoff:
                break  # oldest first: the rest were written more recently still
            store = row["store"]
            if not await connection.fetchval(_TRY_STORE, store):
                continue  # a change to it is in flight on some replica
            deleted = await connection.execute(
                "DELETE FROM atmosphere_files WHERE store = $1 AND NOT EXISTS "
                "(SELECT 1 FROM atmosphere_files WHERE store = $1 AND updated_at >= $2)",
                store,
                cutoff,
            )
            if deleted == "DELETE 0":
                continue  # written since the count
            await connection.execute("DELETE FROM atmosphere_file_changes WHERE store = $1", store)
            excess -= 1
            remaining -= 1
            log.info(
                "conversation workspace evicted (cap reached)",
                conversation=store[len(prefix) :],
                cap=cap,
            )
        if remaining > cap:
            log.warning(
                "conversation cap exceeded: the remaining workspaces are in use",
                cap=cap,
                over=remaining - cap,
            )
