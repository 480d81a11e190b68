"""`PostgresAgentFileSystem`: a workspace whose files are rows.

The same `AgentFileSystem` protocol, path rules, bounds and messages as the files backend
(`filesystem.workspace.WorkspaceAgentFileSystem`), with files as `(store, path) -> bytes` rows
in `atmosphere_files`, so replicas with no shared volume share a conversation's files:

- every change runs in one transaction that first takes a transaction-level advisory lock on
  the store, then checks its bounds (per-file size, file count, total bytes) against the rows
  themselves: exact across replicas, with nothing to go stale, and a rejected change writes
  nothing;
- directories are implicit (a file's parents); a write under a path that is a file, or onto a
  path that is a directory, is refused as on disk;
- contents are stored as UTF-8 bytes (`bytea`: text may hold NUL, which a `text` column cannot);
- a change whose acknowledgement was lost (the connection died after its commit) is not
  applied again by the retry, and answers what it did (`_change`);
- `glob` and `grep` read the store's rows and match in Python with the files backend's own
  matchers (`filesystem.globbing`, `filesystem.search`), so a pattern means the same thing on
  both backends, including the grep deadline.

`PostgresWorkspaceStores` (`stores`) opens these for the filesystem primitive when
`ATMOSPHERE_AI_WORKSPACE_BACKEND=postgres`, and for `prefix=postgres:` composite routes. A
PostgreSQL outage reaches the model as a tool error it can act on ("PostgreSQL is unavailable
... try again"), never as an exception.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from operator import itemgetter
from typing import Any, TypeVar

from ..._errors import BackendUnavailable, FileNotFoundInWorkspace, FileSystemError
from ..._filesystem.base import (
    FileInfo,
    FileSystemLimits,
    GrepHit,
    check_file_size,
    check_matches,
    encode_content,
)
from ..._filesystem.globbing import compile_glob
from ..._filesystem.paths import check_dir, check_path, is_under, shown
from ..._filesystem.search import Deadline, clip, compile_pattern, search_file
from ..._filesystem.usage import StoreUsage
from .database import PostgresDatabase

T = TypeVar("T")
OnCreate = Callable[[Any], Awaitable[None]]
"""Called with the connection, inside the transaction, when a write creates the store (its
first file): where the conversation cap is applied."""

_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('atmosphere_files:' || $1, 0))"
_USAGE = (
    "SELECT count(*) AS files, coalesce(sum(size), 0) AS bytes "
    "FROM atmosphere_files WHERE store = $1"
)
_UNDER = "store = $1 AND starts_with(path, $2)"
_WRITE_STATE = (
    "SELECT (SELECT size FROM atmosphere_files WHERE store = $1 AND path = $2) AS old, "
    "EXISTS (SELECT 1 FROM atmosphere_files WHERE store = $1 AND starts_with(path, $2 || '/')) "
    "AS is_dir, "
    "EXISTS (SELECT 1 FROM atmosphere_files WHERE store = $1 AND path = ANY($3::text[])) "
    "AS parent_file, "
    "count(*) AS files, coalesce(sum(size), 0) AS bytes FROM atmosphere_files WHERE store = $1"
)
"""Everything a write checks, in one round trip (after the store's lock)."""
_EDIT_STATE = (
    "SELECT (SELECT content FROM atmosphere_files WHERE store = $1 AND path = $2) AS content, "
    "count(*) AS files, coalesce(sum(size), 0) AS bytes FROM atmosphere_files WHERE store = $1"
)
"""The file an edit changes and the store's usage, in one round trip."""


CHANGE_KEY_SECONDS = 600.0
"""How long a change's key is kept: far longer than the one retry that may look for it."""
_APPLIED = "SELECT result FROM atmosphere_file_changes WHERE store = $1 AND key = $2"
_RECORD = (
    "WITH expired AS (DELETE FROM atmosphere_file_changes WHERE store = $1 "
    "AND at < extract(epoch FROM clock_timestamp()) - $4) "
    "INSERT INTO atmosphere_file_changes (store, key, result, at) "
    "VALUES ($1, $2, $3, extract(epoch FROM clock_timestamp()))"
)
"""Record a change's key and answer, and forget this store's keys older than `$4` seconds."""
_LOCK_AND_RECORD = (
    "WITH expired AS (DELETE FROM atmosphere_file_changes WHERE store = $1 "
    "AND at < extract(epoch FROM clock_timestamp()) - $4), "
    "recorded AS (INSERT INTO atmosphere_file_changes (store, key, result, at) "
    "VALUES ($1, $2, $3, extract(epoch FROM clock_timestamp()))) "
    "SELECT pg_advisory_xact_lock(hashtextextended('atmosphere_files:' || $1, 0))"
)
"""`_RECORD` and `_LOCK` in one round trip, for a change whose answer is known beforehand: the
record is part of the transaction, so a change that fails takes it back with it."""


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class PostgresAgentFileSystem:
    """A bounded `AgentFileSystem` in PostgreSQL rows; `store` names it (owner + conversation)."""

    def __init__(
        self,
        database: PostgresDatabase,
        store: str,
        limits: FileSystemLimits | None = None,
        *,
        on_create: OnCreate | None = None,
    ) -> None:
        self.database = database
        self.store = store
        self.limits = limits or FileSystemLimits()
        self.on_create = on_create

    async def _run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """`database.run`, with an outage turned into a message the model can act on."""
        try:
            return await self.database.run(work)
        except BackendUnavailable as exc:
            raise FileSystemError(f"{exc} — try again shortly") from None

    def __repr__(self) -> str:
        return f"PostgresAgentFileSystem({self.store!r})"

    @property
    def max_grep_hits(self) -> int:
        return self.limits.max_grep_hits

    # --- reads ------------------------------------------------------------------------------

    async def ls(self, dir: str | None = None) -> list[FileInfo]:
        rel = check_dir(dir)

        async def work(connection: Any) -> list[Any]:
            if rel and await self._is_file(connection, rel):
                raise FileSystemError(f"Not a directory: {rel}")
            rows: list[Any] = await connection.fetch(
                f"SELECT path, size FROM atmosphere_files WHERE {_UNDER}",
                self.store,
                f"{rel}/" if rel else "",
            )
            return rows

        rows = await self._run(work)
        start = len(rel) + 1 if rel else 0
        directories: dict[str, FileInfo] = {}
        files: list[FileInfo] = []
        for row in rows:
            rest = row["path"][start:]
            name, slash, _below = rest.partition("/")
            path = f"{rel}/{name}" if rel else name
            if slash:
                directories.setdefault(path, FileInfo(path, 0, True))
            else:
                files.append(FileInfo(path, int(row["size"]), False))
        return sorted(directories.values(), key=lambda item: item.path) + sorted(
            files, key=lambda item: item.path
        )

    async def read(self, path: str) -> str:
        rel = check_path(path)
        echo = shown(path)

        async def work(connection: Any) -> bytes | None:
            value: bytes | None = await connection.fetchval(
                "SELECT content FROM atmosphere_files WHERE store = $1 AND path = $2",
                self.store,
                rel,
            )
            return value

        data = await self._run(work)
        if data is None:
            raise FileNotFoundInWorkspace(f"File not found: {echo}")
        limit = self.limits.max_file_bytes
        if len(data) > limit:
            raise FileSystemError(
                f"File too large to read: {echo} is {len(data)} bytes (limit {limit})"
            )
        return bytes(data).decode("utf-8")

    async def glob(self, pattern: str) -> list[str]:
        if not isinstance(pattern, str):
            raise FileSystemError("pattern must not be blank")
        matcher = compile_glob(pattern)

        async def work(connection: Any) -> list[Any]:
            rows: list[Any] = await connection.fetch(
                "SELECT path FROM atmosphere_files WHERE store = $1", self.store
            )
            return rows

        return sorted(
            row["path"] for row in await self._run(work) if matcher.fullmatch(row["path"])
        )

    async def grep(self, pattern: str, dir: str | None = None) -> list[GrepHit]:
        compiled = compile_pattern(pattern)
        rel = check_dir(dir)
        deadline = Deadline(compiled.source)
        limit = self.limits.max_grep_hits
        hits: list[GrepHit] = []
        files = await self._files(rel, compiled.literal)
        for path, data in sorted(files, key=itemgetter(0)):
            deadline.remaining()
            found = search_file(compiled, data, limit - len(hits), deadline)
            if found:
                hits.extend(GrepHit(path, number, clip(line)) for number, line in found)
            if len(hits) >= limit:
                break
        return hits

    async def usage(self) -> StoreUsage:
        """Files and bytes the store holds now."""

        async def work(connection: Any) -> Any:
            return await connection.fetchrow(_USAGE, self.store)

        row = await self._run(work)
        return StoreUsage(int(row["files"]), int(row["bytes"]))

    async def _files(self, rel: str, literal: bytes | None = None) -> list[tuple[str, bytes]]:
        """`(path, content)` of every file under `rel` (the whole store when blank); with
        `literal`, only the files whose bytes contain it (found in SQL, so a rare literal reads
        a few rows: a UTF-8 byte match is exactly a character match, as in the files backend)."""

        async def work(connection: Any) -> list[Any]:
            if literal is None:
                rows: list[Any] = await connection.fetch(
                    f"SELECT path, content FROM atmosphere_files WHERE {_UNDER}",
                    self.store,
                    f"{rel}/" if rel else "",
                )
            else:
                rows = await connection.fetch(
                    f"SELECT path, content FROM atmosphere_files WHERE {_UNDER} "
                    "AND position($3::bytea IN content) > 0",
                    self.store,
                    f"{rel}/" if rel else "",
                    literal,
                )
            return rows

        return [(row["path"], bytes(row["content"])) for row in await self._run(work)]

    # --- changes (one transaction each, under the store's lock) ------------------------------

    async def write(self, path: str, content: str) -> None:
        rel = check_path(path)
        echo = shown(path)
        data = encode_content(content, echo, self.limits)

        async def change(connection: Any) -> str:
            state = await connection.fetchrow(_WRITE_STATE, self.store, rel, _parents(rel))
            if state["is_dir"]:
                raise FileSystemError(f"Cannot write {echo}: it is a directory")
            if state["parent_file"]:
                raise FileSystemError(f"Cannot write {echo}: a parent of it is a file")
            old = None if state["old"] is None else int(state["old"])
            held = int(state["files"])
            self._check_bounds(echo, len(data), old, held, int(state["bytes"]))
            if held == 0 and self.on_create is not None:
                await self.on_create(connection)
            await self._put(connection, rel, data)
            return ""

        await self._change(change)

    async def edit(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        rel = check_path(path)
        echo = shown(path)
        if not isinstance(old_text, str) or old_text == "":
            raise FileSystemError("old_text must not be empty")
        if not isinstance(new_text, str):
            raise FileSystemError("new_text must be a string")

        async def change(connection: Any) -> str:
            state = await connection.fetchrow(_EDIT_STATE, self.store, rel)
            found: bytes | None = state["content"]
            if found is None:
                raise FileNotFoundInWorkspace(f"File not found: {echo}")
            text = bytes(found).decode("utf-8")
            count = text.count(old_text)
            check_matches(echo, count, replace_all)
            updated = (
                text.replace(old_text, new_text)
                if replace_all
                else text.replace(old_text, new_text, 1)
            )
            if updated != text:
                data = updated.encode("utf-8")
                check_file_size(echo, len(data), self.limits)
                self._check_bounds(
                    echo, len(data), len(found), int(state["files"]), int(state["bytes"])
                )
                await self._put(connection, rel, data)
            return str(count if replace_all else 1)

        return int(await self._change(change, None if replace_all else "1"))

    async def delete(self, path: str) -> None:
        rel = check_path(path)
        echo = shown(path)

        async def change(connection: Any) -> str:
            gone = await connection.fetch(
                "DELETE FROM atmosphere_files WHERE store = $1 AND "
                "(path = $2 OR starts_with(path, $2 || '/')) RETURNING 1",
                self.store,
                rel,
            )
            if not gone:
                raise FileNotFoundInWorkspace(f"Not found: {echo}")
            return ""

        await self._change(change)

    async def rename(self, old_path: str, new_path: str) -> None:
        old_rel, new_rel = check_path(old_path), check_path(new_path)
        old_echo, new_echo = shown(old_path), shown(new_path)

        async def change(connection: Any) -> str:
            is_file = await self._is_file(connection, old_rel)
            if not is_file and not await self._under(connection, old_rel):
                raise FileNotFoundInWorkspace(f"Not found: {old_echo}")
            if await self._is_file(connection, new_rel) or await self._under(connection, new_rel):
                raise FileSystemError(
                    f"Destination already exists: {new_echo} — delete it first if you want "
                    "to replace it"
                )
            if is_under(new_rel, old_rel):
                raise FileSystemError(f"Cannot move {old_echo} into itself ({new_echo})")
            await self._check_parents(connection, new_rel, new_echo)
            await connection.execute(
                "UPDATE atmosphere_files SET path = $3 || substr(path, length($2) + 1) "
                "WHERE store = $1 AND (path = $2 OR starts_with(path, $2 || '/'))",
                self.store,
                old_rel,
                new_rel,
            )
            return ""

        await self._change(change)

    async def _change(
        self, change: Callable[[Any], Awaitable[str]], answer: str | None = ""
    ) -> str:
        """Run `change(connection)` in one transaction under the store's lock, at most once.

        The change gets a key before its first attempt, recorded with its answer in the same
        transaction: with the lock, in one statement, when the answer is known beforehand
        (`answer`: a write, a rename, a delete, an edit of one occurrence), so a change costs no
        extra round trip; after the change otherwise (`None`: an edit of every occurrence
        answers their count). When the connection dies before the commit's answer comes back,
        `database.run` runs `work` again; that retry first looks for the key (after the lock, so
        a first attempt the server is still finishing is waited for) and, when the first attempt
        did commit, answers what it answered instead of applying the change again (an applied
        edit is reported as applied, never as "old_text not found").
        """
        key = uuid.uuid4().hex
        attempts = 0

        async def work(connection: Any) -> str:
            nonlocal attempts
            attempts += 1
            async with connection.transaction():
                if attempts == 1 and answer is not None:
                    await connection.execute(
                        _LOCK_AND_RECORD, self.store, key, answer, CHANGE_KEY_SECONDS
                    )
                    return await change(connection)
                await connection.execute(_LOCK, self.store)
                if attempts > 1:
                    done: str | None = await connection.fetchval(_APPLIED, self.store, key)
                    if done is not None:
                        return done
                result = await change(connection)
                await connection.execute(_RECORD, self.store, key, result, CHANGE_KEY_SECONDS)
                return result

        return await self._run(work)

    # --- helpers --------------------------------------------------------------------------

    def _check_bounds(
        self, echo: str, new_size: int, old_size: int | None, count: int, total: int
    ) -> None:
        """Refuse a change of one file from `old_size` (`None`: a new file) to `new_size` in a
        store holding `count` files of `total` bytes (the files backend's rule and messages)."""
        files = 1 if old_size is None else 0
        delta = new_size - (old_size or 0)
        limits = self.limits
        if files > 0 and count + files > limits.max_files:
            raise FileSystemError(
                f"Write rejected: the store already holds {count} files, "
                f"at the {limits.max_files}-file limit"
            )
        if total + delta > limits.max_total_bytes:
            raise FileSystemError(
                f"Write rejected: {echo} would bring the store to {total + delta} bytes, "
                f"over the {limits.max_total_bytes}-byte total limit"
            )

    async def _put(self, connection: Any, rel: str, data: bytes) -> None:
        await connection.execute(
            "INSERT INTO atmosphere_files (store, path, content, size, updated_at) "
            "VALUES ($1, $2, $3, $4, extract(epoch FROM clock_timestamp())) "
            "ON CONFLICT (store, path) DO UPDATE SET content = excluded.content, "
            "size = excluded.size, updated_at = excluded.updated_at",
            self.store,
            rel,
            data,
            len(data),
        )

    async def _size(self, connection: Any, rel: str) -> int | None:
        value = await connection.fetchval(
            "SELECT size FROM atmosphere_files WHERE store = $1 AND path = $2", self.store, rel
        )
        return None if value is None else int(value)

    async def _is_file(self, connection: Any, rel: str) -> bool:
        return await self._size(connection, rel) is not None

    async def _under(self, connection: Any, rel: str) -> bool:
        """Whether `rel` is a directory (some file lies below it)."""
        return bool(
            await connection.fetchval(
                f"SELECT EXISTS (SELECT 1 FROM atmosphere_files WHERE {_UNDER})",
                self.store,
                rel + "/",
            )
        )

    async def _check_parents(self, connection: Any, rel: str, echo: str) -> None:
        parents = _parents(rel)
        if parents and await connection.fetchval(
            "SELECT EXISTS (SELECT 1 FROM atmosphere_files WHERE store = $1 AND "
            "path = ANY($2::text[]))",
            self.store,
            parents,
        ):
            raise FileSystemError(f"Cannot write {echo}: a parent of it is a file")
