"""The conversation list on PostgreSQL reads its page from the index on `(path, user_key,
updated_at, conversation_id)`: among 60,000 conversations of 300 users, a page of 20 reads about
21 rows, with no sequential scan and no sort, for the first page and for a page after a cursor;
and every page, followed to the end, lists a user's conversations once each, newest first.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from atmosphere_harness._backends.postgres import PostgresDatabase
from atmosphere_harness._backends.postgres.owners import (
    FIRST_PAGE,
    NEXT_PAGE,
    PostgresConversationOwners,
)

from .postgres_service import opened_database

pytestmark = pytest.mark.services

USERS = 300
PER_USER = 200


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += nodes(child)
    return found


async def explain(database: PostgresDatabase, statement: str, *args: Any) -> dict[str, Any]:
    async def work(connection: Any) -> dict[str, Any]:
        raw = await connection.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", *args)
        plan: dict[str, Any] = json.loads(raw)[0]["Plan"]
        return plan

    return await database.run(work)


async def test_a_page_of_the_list_reads_the_index_only_for_its_rows() -> None:
    async with opened_database() as database:

        async def fill(connection: Any) -> None:
            await connection.execute(
                "INSERT INTO atmosphere_conversation_owners "
                "(path, conversation_id, user_key, claimed_at, updated_at, title) "
                "SELECT '/p', 'c-' || u || '-' || n, 'user-' || u, n, n + u * 0.001, '' "
                f"FROM generate_series(1, {USERS}) AS u, generate_series(1, {PER_USER}) AS n"
            )
            await connection.execute("ANALYZE atmosphere_conversation_owners")

        await database.run(fill)
        owners = PostgresConversationOwners(database)
        pages = []
        after = None
        while True:
            page = await owners.page("/p", "user-7", 20, after)
            if not page:
                break
            pages.append(page)
            after = (page[-1].updated_at, page[-1].conversation_id)
        rows = [row for page in pages for row in page]
        assert len(rows) == PER_USER
        assert len({row.conversation_id for row in rows}) == PER_USER
        assert [row.updated_at for row in rows] == sorted(
            (row.updated_at for row in rows), reverse=True
        )

        for statement, args in (
            (FIRST_PAGE, ("/p", "user-7", 21)),
            (NEXT_PAGE, ("/p", "user-7", 21, 100.007, "c-7-100")),
        ):
            plan = await explain(database, statement, *args)
            kinds = {node["Node Type"] for node in nodes(plan)}
            assert "Seq Scan" not in kinds, plan
            assert "Sort" not in kinds, plan
            scans = [node for node in nodes(plan) if "Index" in node["Node Type"]]
            assert scans, plan
            assert all(node["Actual Rows"] <= 21 for node in scans), plan
