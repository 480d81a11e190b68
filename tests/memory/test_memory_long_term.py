"""Long-term memory stores: the same contract for the in-memory, SQLite and PostgreSQL stores."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from atmosphere_harness import InMemoryLongTermMemory, LongTermMemory, SqliteLongTermMemory
from atmosphere_harness._memory.long_term import MAX_FACT_CHARS, scoped_terms


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LongTermMemory]:
    if request.param == "memory":
        yield InMemoryLongTermMemory(max_facts_per_user=5)
        return
    if request.param == "postgres":
        from tests.scaleout.postgres_service import opened_database

        async with opened_database() as database:
            from atmosphere_harness._backends.postgres import PostgresLongTermMemory

            yield PostgresLongTermMemory(database, max_facts_per_user=5)
        return
    sqlite_store = SqliteLongTermMemory(tmp_path / "facts.db", max_facts_per_user=5)
    yield sqlite_store
    await sqlite_store.aclose()


async def test_save_and_get_in_learning_order(store: LongTermMemory) -> None:
    await store.save_fact("alice", "Lives in Montreal")
    await store.save_fact("alice", "Has a dog named Max")
    assert await store.get_facts("alice") == ["Lives in Montreal", "Has a dog named Max"]
    assert await store.fact_count("alice") == 2


async def test_unknown_user_has_no_facts(store: LongTermMemory) -> None:
    assert await store.get_facts("nobody") == []
    assert await store.fact_count("nobody") == 0
    assert await store.search("nobody", "anything") == []


async def test_the_cap_evicts_the_oldest(store: LongTermMemory) -> None:
    await store.save_facts("alice", [f"fact {i}" for i in range(8)])
    assert await store.get_facts("alice", 100) == [f"fact {i}" for i in range(3, 8)]
    assert await store.fact_count("alice") == 5


async def test_limit_returns_the_newest(store: LongTermMemory) -> None:
    await store.save_facts("alice", ["one", "two", "three"])
    assert await store.get_facts("alice", 2) == ["two", "three"]
    assert await store.get_facts("alice", 0) == []


async def test_clear_forgets_only_that_user(store: LongTermMemory) -> None:
    await store.save_fact("alice", "likes tea")
    await store.save_fact("bob", "likes coffee")
    await store.clear("alice")
    assert await store.get_facts("alice") == []
    assert await store.get_facts("bob") == ["likes coffee"]


async def test_users_are_isolated(store: LongTermMemory) -> None:
    await store.save_facts("alice", ["Alice plays the cello"])
    await store.save_facts("bob", ["Bob plays the drums"])
    assert await store.get_facts("alice") == ["Alice plays the cello"]
    assert await store.search("alice", "drums plays") == ["Alice plays the cello"]
    assert await store.search("bob", "cello") == []


async def test_replace_facts(store: LongTermMemory) -> None:
    await store.save_facts("alice", ["old one", "old two"])
    await store.replace_facts("alice", ["new"])
    assert await store.get_facts("alice") == ["new"]
    await store.replace_facts("alice", [])
    assert await store.fact_count("alice") == 0


async def test_search_ranks_the_best_match_first(store: LongTermMemory) -> None:
    await store.save_facts(
        "alice",
        [
            "Works as a nurse in Quebec",
            "Has a golden retriever named Max",
            "Prefers tea over coffee",
            "Her retriever Max is afraid of thunder",
        ],
    )
    hits = await store.search("alice", "What should I buy for Max the retriever?", 2)
    assert set(hits) == {
        "Has a golden retriever named Max",
        "Her retriever Max is afraid of thunder",
    }
    assert await store.search("alice", "coffee", 5) == ["Prefers tea over coffee"]
    assert await store.search("alice", "   ", 5) == []


async def test_search_treats_fts_syntax_as_words(store: LongTermMemory) -> None:
    await store.save_fact("alice", "Loves NEAR and AND as words")
    assert await store.search("alice", 'near" OR * AND (') == ["Loves NEAR and AND as words"]


@pytest.mark.parametrize("bad", ["", "   ", "x" * (MAX_FACT_CHARS + 1)])
async def test_bad_facts_are_rejected_and_nothing_is_stored(
    store: LongTermMemory, bad: str
) -> None:
    await store.save_fact("alice", "kept")
    with pytest.raises(ValueError, match="fact"):
        await store.save_facts("alice", ["fine", bad])
    assert await store.get_facts("alice") == ["kept"]


async def test_bad_user_ids_are_rejected(store: LongTermMemory) -> None:
    with pytest.raises(ValueError, match="user id"):
        await store.save_fact("", "a fact")


async def test_concurrent_saves_lose_nothing(store: LongTermMemory) -> None:
    await asyncio.gather(*(store.save_fact(f"user{i % 3}", f"fact {i}") for i in range(12)))
    counts = [await store.fact_count(f"user{k}") for k in range(3)]
    assert counts == [4, 4, 4]


async def test_sqlite_facts_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "facts.db"
    first = SqliteLongTermMemory(path)
    await first.save_facts("alice", ["Lives in Montreal", "Speaks French"])
    await first.aclose()
    second = SqliteLongTermMemory(path)
    try:
        assert await second.get_facts("alice") == ["Lives in Montreal", "Speaks French"]
        assert await second.search("alice", "french") == ["Speaks French"]
    finally:
        await second.aclose()


async def test_sqlite_uses_wal_and_keeps_the_index_in_step(tmp_path: Path) -> None:
    path = tmp_path / "facts.db"
    store = SqliteLongTermMemory(path, max_facts_per_user=2)
    await store.save_facts("alice", ["alpha", "beta", "gamma"])
    await store.clear("bob")
    await store.aclose()
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert connection.execute("SELECT count(*) FROM memory_facts").fetchone()[0] == 2

        # The evicted fact is gone from the full-text index too; the others are in it.
        def hits(word: str) -> int:
            token = scoped_terms("alice", [word])[0]
            return int(
                connection.execute(
                    "SELECT count(*) FROM memory_facts_fts WHERE memory_facts_fts MATCH ?",
                    (f'"{token}"',),
                ).fetchone()[0]
            )

        assert (hits("alpha"), hits("beta"), hits("gamma")) == (0, 1, 1)
    finally:
        connection.close()


def test_a_store_needs_exactly_one_location(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="either"):
        SqliteLongTermMemory()


# --- one fact, stored once -------------------------------------------------------------------


async def test_the_same_fact_twice_is_stored_once(store: LongTermMemory) -> None:
    await store.save_fact("alice", "Lives in Montreal")
    await store.save_fact("alice", "  lives in   MONTREAL ")
    await store.save_facts("alice", ["Has a dog", "has a DOG", "Lives  in montreal"])
    assert await store.get_facts("alice") == ["Lives in Montreal", "Has a dog"], "first text"
    assert await store.fact_count("alice") == 2
    assert await store.search("alice", "montreal") == ["Lives in Montreal"]


async def test_a_repeated_fact_evicts_nothing(store: LongTermMemory) -> None:
    await store.save_facts("alice", [f"fact {i}" for i in range(5)])  # the cap is 5
    await store.save_fact("alice", "FACT 0")
    assert await store.get_facts("alice", 100) == [f"fact {i}" for i in range(5)]


async def test_users_do_not_share_facts_for_deduplication(store: LongTermMemory) -> None:
    await store.save_fact("alice", "Likes jazz")
    await store.save_fact("bob", "likes JAZZ")
    assert await store.get_facts("alice") == ["Likes jazz"]
    assert await store.get_facts("bob") == ["likes JAZZ"]


async def test_replace_facts_keeps_each_fact_once(store: LongTermMemory) -> None:
    await store.replace_facts("alice", ["Speaks French", "new", "speaks french"])
    assert await store.get_facts("alice") == ["Speaks French", "new"]


async def test_concurrent_saves_of_one_fact_store_it_once(store: LongTermMemory) -> None:
    await asyncio.gather(
        *(store.save_fact("alice", f"Plays {'CELLO' if i % 2 else 'cello'}") for i in range(20))
    )
    assert await store.fact_count("alice") == 1
    assert (await store.get_facts("alice"))[0].lower() == "plays cello"


async def test_two_sqlite_connections_racing_store_a_fact_once(tmp_path: Path) -> None:
    """Two stores on one file (two connections, two threads: as two replicas would)."""
    path = tmp_path / "facts.db"
    first, second = SqliteLongTermMemory(path), SqliteLongTermMemory(path)
    try:
        await asyncio.gather(first.save_fact("alice", "warm up"), second.save_fact("bob", "x"))
        for round_ in range(10):
            fact = f"Fact number {round_}"
            await asyncio.gather(
                *(
                    (first if i % 2 else second).save_facts("alice", [fact, fact.upper()])
                    for i in range(6)
                )
            )
        facts = await first.get_facts("alice", 100)
        assert facts == ["warm up"] + [f"Fact number {i}" for i in range(10)]
    finally:
        await first.aclose()
        await second.aclose()


OLD_FACTS_SCHEMA = """
CREATE TABLE memory_facts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, user_id TEXT NOT NULL, fact TEXT NOT NULL,
    terms TEXT NOT NULL, created_at REAL NOT NULL
);
CREATE VIRTUAL TABLE memory_facts_fts USING fts5 (
    terms, content = 'memory_facts', content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);
CREATE TRIGGER memory_facts_ai AFTER INSERT ON memory_facts BEGIN
    INSERT INTO memory_facts_fts (rowid, terms) VALUES (new.id, new.terms);
END;
CREATE TRIGGER memory_facts_ad AFTER DELETE ON memory_facts BEGIN
    INSERT INTO memory_facts_fts (memory_facts_fts, rowid, terms)
    VALUES ('delete', old.id, old.terms);
END;
"""


async def test_a_database_from_before_deduplication_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "facts.db"
    connection = sqlite3.connect(path)
    connection.executescript(OLD_FACTS_SCHEMA)
    for user, fact in [
        ("alice", "Sails"),
        ("alice", "Cooks"),
        ("alice", "SAILS"),
        ("bob", "sails"),
    ]:
        terms = " ".join(scoped_terms(user, [fact.lower()]))
        connection.execute(
            "INSERT INTO memory_facts (user_id, fact, terms, created_at) VALUES (?, ?, ?, 0)",
            (user, fact, terms),
        )
    connection.commit()
    connection.close()

    store = SqliteLongTermMemory(path)
    try:
        assert await store.get_facts("alice") == ["Sails", "Cooks"]
        assert await store.get_facts("bob") == ["sails"]
        assert await store.search("alice", "sails") == ["Sails"], "the copy left the index too"
        await store.save_fact("alice", "sails")
        assert await store.fact_count("alice") == 2
    finally:
        await store.aclose()
    reopened = SqliteLongTermMemory(path)  # the migration is idempotent
    try:
        await reopened.save_fact("alice", "Reads")
        assert await reopened.get_facts("alice") == ["Sails", "Cooks", "Reads"]
    finally:
        await reopened.aclose()
