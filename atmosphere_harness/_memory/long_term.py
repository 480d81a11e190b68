"""`LongTermMemory`: facts about a user that outlive a conversation, and its two built-in stores.

Order: `get_facts(user, limit)` returns the newest `limit` facts **oldest first** (the order they
were learned, which is how they read best in a prompt). `search(user, query, limit)` returns the
best matches first. Every store caps the facts it keeps per user and evicts the oldest.

A user's facts are a set: saving a fact the user already has (the same words, whatever the case
and spacing: `normalized_fact`) stores nothing and keeps the first text, even when saves race.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import re
import sqlite3
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from .sqlite import SqliteDatabase, Transaction

DEFAULT_MAX_FACTS = 100
MAX_FACT_CHARS = 1000
MAX_USER_ID_CHARS = 256
MAX_QUERY_TERMS = 32

_WORD = re.compile(r"[^\W_]+")
"""Letters and digits: what SQLite's unicode61 tokenizer keeps as one token."""


def check_user(user_id: str) -> str:
    if not isinstance(user_id, str) or not user_id.strip() or len(user_id) > MAX_USER_ID_CHARS:
        raise ValueError(f"user id must be 1-{MAX_USER_ID_CHARS} characters")
    return user_id


def clean_fact(fact: str) -> str:
    """A fact as stored: stripped, non-blank, at most `MAX_FACT_CHARS`."""
    if not isinstance(fact, str):
        raise ValueError("a fact must be a string")
    text = " ".join(fact.split())
    if not text:
        raise ValueError("a fact must not be blank")
    if len(text) > MAX_FACT_CHARS:
        raise ValueError(f"a fact must be at most {MAX_FACT_CHARS} characters")
    return text


def normalized_fact(fact: str) -> str:
    """What two facts of a user must share to be one fact: their words, case-folded.

    Stricter than extraction's `reconcile` (which also ignores punctuation): a store keeps
    "Uses C#" and "Uses C" apart, whoever saves them.
    """
    return " ".join(fact.split()).casefold()


def unique_facts(facts: Iterable[str]) -> list[str]:
    """`facts` without repeats (`normalized_fact`), each at its first place, with its first text."""
    unique: dict[str, str] = {}
    for fact in facts:
        unique.setdefault(normalized_fact(fact), fact)
    return list(unique.values())


def query_terms(query: str) -> list[str]:
    """Distinct lower-case words of `query`, at most `MAX_QUERY_TERMS`."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        seen.setdefault(word, None)
        if len(seen) >= MAX_QUERY_TERMS:
            break
    return list(seen)


class LongTermMemory(abc.ABC):
    """What a long-term memory store implements; the defaults build on the abstract methods."""

    @abc.abstractmethod
    async def save_fact(self, user_id: str, fact: str) -> None:
        """Remember one fact (the oldest is evicted once the user's cap is reached)."""

    async def save_facts(self, user_id: str, facts: Sequence[str]) -> None:
        for fact in facts:
            await self.save_fact(user_id, fact)

    @abc.abstractmethod
    async def get_facts(self, user_id: str, limit: int = 20) -> list[str]:
        """The newest `limit` facts, oldest first."""

    async def search(self, user_id: str, query: str, limit: int = 5) -> list[str]:
        """Facts sharing the most words with `query`, best first (ties: newest first)."""
        terms = set(query_terms(query))
        if not terms or limit <= 0:
            return []
        facts = await self.get_facts(user_id, DEFAULT_MAX_FACTS)
        scored = [
            (len(terms & set(query_terms(fact))), position, fact)
            for position, fact in enumerate(facts)
        ]
        scored = [entry for entry in scored if entry[0] > 0]
        scored.sort(key=lambda entry: (-entry[0], -entry[1]))
        return [fact for _score, _position, fact in scored[:limit]]

    @abc.abstractmethod
    async def clear(self, user_id: str) -> None:
        """Forget every fact about the user."""

    async def fact_count(self, user_id: str) -> int:
        return len(await self.get_facts(user_id, DEFAULT_MAX_FACTS))

    async def replace_facts(self, user_id: str, facts: Sequence[str]) -> None:
        """Replace the user's facts with `facts` (an empty list forgets the user)."""
        await self.clear(user_id)
        await self.save_facts(user_id, facts)

    async def aclose(self) -> None:
        """Release resources (the harness calls it for stores it created)."""
        return None


class InMemoryLongTermMemory(LongTermMemory):
    """Facts in a dict: per-user cap (default 100), oldest evicted, lost on restart."""

    def __init__(self, max_facts_per_user: int = DEFAULT_MAX_FACTS) -> None:
        if max_facts_per_user <= 0:
            raise ValueError("max_facts_per_user must be positive")
        self.max_facts_per_user = max_facts_per_user
        self._facts: dict[str, dict[str, str]] = {}
        """Per user: `normalized_fact` -> the first text saved, in learning order."""
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def save_fact(self, user_id: str, fact: str) -> None:
        await self.save_facts(user_id, [fact])

    async def save_facts(self, user_id: str, facts: Sequence[str]) -> None:
        check_user(user_id)
        cleaned = [clean_fact(fact) for fact in facts]
        async with self._locks[user_id]:
            self._add(self._facts.setdefault(user_id, {}), cleaned)

    def _add(self, stored: dict[str, str], facts: Sequence[str]) -> None:
        for fact in facts:
            key = normalized_fact(fact)
            if key in stored:
                continue
            stored[key] = fact
            while len(stored) > self.max_facts_per_user:
                del stored[next(iter(stored))]

    async def get_facts(self, user_id: str, limit: int = 20) -> list[str]:
        stored = self._facts.get(user_id)
        if not stored or limit <= 0:
            return []
        return list(stored.values())[-limit:]

    async def clear(self, user_id: str) -> None:
        async with self._locks[user_id]:
            self._facts.pop(user_id, None)
        self._locks.pop(user_id, None)

    async def fact_count(self, user_id: str) -> int:
        return len(self._facts.get(user_id, ()))

    async def replace_facts(self, user_id: str, facts: Sequence[str]) -> None:
        check_user(user_id)
        cleaned = [clean_fact(fact) for fact in facts]
        async with self._locks[user_id]:
            if cleaned:
                replacement: dict[str, str] = {}
                self._add(replacement, cleaned)
                self._facts[user_id] = replacement
            else:
                self._facts.pop(user_id, None)


FACTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS memory_facts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id TEXT NOT NULL,
    fact TEXT NOT NULL,
    norm TEXT,
    terms TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS memory_facts_user ON memory_facts (user_id, id);
CREATE VIRTUAL TABLE IF NOT EXISTS memory_facts_fts USING fts5 (
    terms, content = 'memory_facts', content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS memory_facts_ai AFTER INSERT ON memory_facts BEGIN
    INSERT INTO memory_facts_fts (rowid, terms) VALUES (new.id, new.terms);
END;
CREATE TRIGGER IF NOT EXISTS memory_facts_ad AFTER DELETE ON memory_facts BEGIN
    INSERT INTO memory_facts_fts (memory_facts_fts, rowid, terms)
    VALUES ('delete', old.id, old.terms);
END;
"""
# `norm` (the fact's `normalized_fact`) and its unique index come from `_migrate_facts`, which
# also adds them to a database written before facts were deduplicated.


def _migrate_facts(connection: sqlite3.Connection) -> None:
    """Give `memory_facts` its `norm` column and the unique index on `(user_id, norm)`.

    A database from before: each row gets its `norm`, and a fact a user has twice keeps its
    first row (the later copies are deleted, from the full-text index too).
    """
    columns = {row[1] for row in connection.execute("PRAGMA table_info(memory_facts)")}
    with Transaction(connection):
        if "norm" not in columns:
            connection.execute("ALTER TABLE memory_facts ADD COLUMN norm TEXT")
        rows = connection.execute(
            "SELECT id, user_id, fact FROM memory_facts WHERE norm IS NULL ORDER BY id"
        ).fetchall()
        if rows:
            seen: set[tuple[str, str]] = {
                (user, norm)
                for user, norm in connection.execute(
                    "SELECT user_id, norm FROM memory_facts WHERE norm IS NOT NULL"
                )
            }
            duplicates: list[tuple[int]] = []
            keys: list[tuple[str, int]] = []
            for row_id, user_id, fact in rows:
                key = normalized_fact(fact)
                if (user_id, key) in seen:
                    duplicates.append((row_id,))
                else:
                    seen.add((user_id, key))
                    keys.append((key, row_id))
            connection.executemany("DELETE FROM memory_facts WHERE id = ?", duplicates)
            connection.executemany("UPDATE memory_facts SET norm = ? WHERE id = ?", keys)
        connection.execute(
            "CREATE UNIQUE INDEX IF NOT EXISTS memory_facts_norm ON memory_facts (user_id, norm)"
        )


def owner_prefix(user_id: str) -> str:
    """A fixed-length token prefix standing for the user."""
    return "u" + hashlib.blake2b(user_id.encode(), digest_size=8).hexdigest()


def scoped_terms(user_id: str, words: Iterable[str]) -> list[str]:
    """Words as the user's own index tokens (`u<hash>jazz`).

    Every user has their own vocabulary in the full-text index, so a search reads only that
    user's postings (a handful) instead of every fact containing a common word, and BM25 weighs
    words by how rare they are among that user's facts.
    """
    prefix = owner_prefix(user_id)
    return [prefix + word for word in words]


def _indexed(user_id: str, fact: str) -> str:
    return " ".join(scoped_terms(user_id, query_terms(fact)))


INSERT_FACT = (
    "INSERT OR IGNORE INTO memory_facts (user_id, fact, norm, terms, created_at) "
    "VALUES (?, ?, ?, ?, ?)"
)
"""A fact the user already has (same `norm`) is ignored: the first text stays."""


def _rows(user_id: str, facts: Sequence[str], now: float) -> list[tuple[str, str, str, str, float]]:
    return [(user_id, fact, normalized_fact(fact), _indexed(user_id, fact), now) for fact in facts]


def _fts_query(user_id: str, terms: Iterable[str]) -> str:
    return " OR ".join(f'"{token}"' for token in scoped_terms(user_id, terms))


class SqliteLongTermMemory(LongTermMemory):
    """Facts in SQLite (WAL), ranked by FTS5 (BM25) for `search`; per-user cap, oldest evicted.

    The full-text index holds each user's words as that user's own tokens (see
    `scoped_terms`), so search time depends on the user's facts, not on everyone's. A unique
    index on `(user_id, norm)` (`norm` = `normalized_fact`) keeps one row per fact: a save of a fact
    the user already has is an `INSERT OR IGNORE` that inserts nothing, whichever process or
    thread saves it.

    `SqliteLongTermMemory("facts.db")` opens its own file; the harness's default store shares
    the workspace database (`database=`).
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        database: SqliteDatabase | None = None,
        max_facts_per_user: int = DEFAULT_MAX_FACTS,
    ) -> None:
        if (path is None) == (database is None):
            raise ValueError("pass either a path or a database")
        if max_facts_per_user <= 0:
            raise ValueError("max_facts_per_user must be positive")
        self._owns_database = database is None
        self.database = database if database is not None else SqliteDatabase(path or "")
        self.database.add_schema(FACTS_SCHEMA)
        self.database.add_migration(_migrate_facts)
        self.max_facts_per_user = max_facts_per_user

    async def save_fact(self, user_id: str, fact: str) -> None:
        await self.save_facts(user_id, [fact])

    async def save_facts(self, user_id: str, facts: Sequence[str]) -> None:
        check_user(user_id)
        cleaned = [clean_fact(fact) for fact in facts]
        if not cleaned:
            return
        rows = _rows(user_id, cleaned, time.time())
        cap = self.max_facts_per_user

        def work(connection: sqlite3.Connection) -> None:
            with Transaction(connection):
                connection.executemany(INSERT_FACT, rows)
                connection.execute(
                    "DELETE FROM memory_facts WHERE user_id = ? AND id <= (SELECT id FROM "
                    "memory_facts WHERE user_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                    (user_id, user_id, cap),
                )

        await self.database.run(work)

    async def get_facts(self, user_id: str, limit: int = 20) -> list[str]:
        if limit <= 0:
            return []
        rows = await self.database.run(
            lambda connection: connection.execute(
                "SELECT fact FROM memory_facts WHERE user_id = ? ORDER BY id DESC LIMIT ?",
                (user_id, limit),
            ).fetchall()
        )
        return [row[0] for row in reversed(rows)]

    async def search(self, user_id: str, query: str, limit: int = 5) -> list[str]:
        terms = query_terms(query)
        if not terms or limit <= 0 or not user_id:
            return []
        match = _fts_query(user_id, terms)
        rows = await self.database.run(
            lambda connection: connection.execute(
                "SELECT f.fact FROM memory_facts_fts JOIN memory_facts AS f "
                "ON f.id = memory_facts_fts.rowid WHERE memory_facts_fts MATCH ? "
                "AND f.user_id = ? ORDER BY bm25(memory_facts_fts), f.id DESC "
                "LIMIT ?",
                (match, user_id, limit),
            ).fetchall()
        )
        return [row[0] for row in rows]

    async def clear(self, user_id: str) -> None:
        await self.database.run(
            lambda connection: connection.execute(
                "DELETE FROM memory_facts WHERE user_id = ?", (user_id,)
            )
        )

    async def fact_count(self, user_id: str) -> int:
        row = await self.database.run(
            lambda connection: connection.execute(
                "SELECT count(*) FROM memory_facts WHERE user_id = ?", (user_id,)
            ).fetchone()
        )
        return int(row[0])

    async def replace_facts(self, user_id: str, facts: Sequence[str]) -> None:
        check_user(user_id)
        cleaned = unique_facts(clean_fact(fact) for fact in facts)[-self.max_facts_per_user :]
        rows = _rows(user_id, cleaned, time.time())

        def work(connection: sqlite3.Connection) -> None:
            with Transaction(connection):
                connection.execute("DELETE FROM memory_facts WHERE user_id = ?", (user_id,))
                connection.executemany(INSERT_FACT, rows)

        await self.database.run(work)

    async def aclose(self) -> None:
        if self._owns_database:
            await self.database.aclose()
