"""`PostgresLongTermMemory`: facts about users in PostgreSQL, searched with `tsvector`.

Each fact row carries a generated `tsvector` (the `simple` configuration: every word kept, no
stemming, no stop words, the same words `memory.long_term.query_terms` sees) with a GIN index,
and a search ranks the user's matching facts with `ts_rank` (ties: newest first).

A user's facts are a set: the unique index on `(user_id, norm)` (`norm` =
`normalized_fact`) and `INSERT ... ON CONFLICT DO NOTHING` store a fact once, even when two
replicas extract the same conversation at the same moment.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..._memory.long_term import (
    DEFAULT_MAX_FACTS,
    LongTermMemory,
    check_user,
    clean_fact,
    normalized_fact,
    query_terms,
    unique_facts,
)
from .database import PostgresDatabase

INSERT_FACTS = (
    "INSERT INTO atmosphere_facts (user_id, fact, norm, created_at) "
    "SELECT $1, fact, norm, $4 FROM unnest($2::text[], $3::text[]) WITH ORDINALITY "
    "AS given (fact, norm, position) ORDER BY position "
    "ON CONFLICT (user_id, norm) DO NOTHING"
)
EVICT = (
    "DELETE FROM atmosphere_facts WHERE user_id = $1 AND id <= (SELECT id FROM "
    "atmosphere_facts WHERE user_id = $1 ORDER BY id DESC LIMIT 1 OFFSET $2)"
)


class PostgresLongTermMemory(LongTermMemory):
    """Per-user facts shared by every replica; cap per user (default 100), oldest evicted."""

    def __init__(
        self, database: PostgresDatabase, *, max_facts_per_user: int = DEFAULT_MAX_FACTS
    ) -> None:
        if max_facts_per_user <= 0:
            raise ValueError("max_facts_per_user must be positive")
        self.database = database
        self.max_facts_per_user = max_facts_per_user

    def __repr__(self) -> str:
        return f"PostgresLongTermMemory({self.database!r})"

    async def save_fact(self, user_id: str, fact: str) -> None:
        await self.save_facts(user_id, [fact])

    async def save_facts(self, user_id: str, facts: Sequence[str]) -> None:
        check_user(user_id)
        cleaned = unique_facts(clean_fact(fact) for fact in facts)
        if not cleaned:
            return
        norms = [normalized_fact(fact) for fact in cleaned]
        now = time.time()

        async def work(connection: Any) -> None:
            async with connection.transaction():
                await connection.execute(INSERT_FACTS, user_id, cleaned, norms, now)
                await connection.execute(EVICT, user_id, self.max_facts_per_user)

        await self.database.run(work)

    async def get_facts(self, user_id: str, limit: int = 20) -> list[str]:
        if limit <= 0:
            return []

        async def work(connection: Any) -> list[Any]:
            rows: list[Any] = await connection.fetch(
                "SELECT fact FROM atmosphere_facts WHERE user_id = $1 ORDER BY id DESC LIMIT $2",
                user_id,
                limit,
            )
            return rows

        return [row["fact"] for row in reversed(await self.database.run(work))]

    async def search(self, user_id: str, query: str, limit: int = 5) -> list[str]:
        terms = query_terms(query)
        if not terms or limit <= 0 or not user_id:
            return []
        # `query_terms` keeps letters and digits only, so the words are safe tsquery operands.
        match = " | ".join(terms)

        async def work(connection: Any) -> list[Any]:
            rows: list[Any] = await connection.fetch(
                "SELECT fact FROM atmosphere_facts, to_tsquery('simple', $2) AS query "
                "WHERE user_id = $1 AND search @@ query "
                "ORDER BY ts_rank(search, query) DESC, id DESC LIMIT $3",
                user_id,
                match,
                limit,
            )
            return rows

        return [row["fact"] for row in await self.database.run(work)]

    async def clear(self, user_id: str) -> None:
        async def work(connection: Any) -> None:
            await connection.execute("DELETE FROM atmosphere_facts WHERE user_id = $1", user_id)

        await self.database.run(work)

    async def fact_count(self, user_id: str) -> int:
        async def work(connection: Any) -> int:
            return int(
                await connection.fetchval(
                    "SELECT count(*) FROM atmosphere_facts WHERE user_id = $1", user_id
                )
            )

        return await self.database.run(work)

    async def replace_facts(self, user_id: str, facts: Sequence[str]) -> None:
        check_user(user_id)
        cleaned = unique_facts(clean_fact(fact) for fact in facts)[-self.max_facts_per_user :]
        norms = [normalized_fact(fact) for fact in cleaned]
        now = time.time()

        async def work(connection: Any) -> None:
            async with connection.transaction():
                await connection.execute("DELETE FROM atmosphere_facts WHERE user_id = $1", user_id)
                if cleaned:
                    await connection.execute(INSERT_FACTS, user_id, cleaned, norms, now)

        await self.database.run(work)
