"""The Redis stores against the embedded stores' own contract tests, and what only Redis adds:
two connections (two replicas) on one Redis see one state, and the bounds hold across them."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import redis

from atmosphere_harness import Message
from atmosphere_harness._backends.redis import (
    RedisConnection,
    RedisConversationLocks,
    RedisHistory,
    RedisLongTermMemory,
    RedisPlanStore,
)
from atmosphere_harness._backends.redis.connection import MAX_CONNECTIONS
from atmosphere_harness._errors import PlanStoreError
from atmosphere_harness._memory.history import RECENT_WRITES, ConversationKey, HistoryBackend
from atmosphere_harness._memory.long_term import LongTermMemory
from atmosphere_harness._planning.model import AgentPlan, PlanStep

# The contract every history backend and every long-term memory store keeps, run on Redis.
from tests.memory.test_memory_conversation import (  # noqa: F401
    check_payloads_decoded_once,
    test_clear_forgets_one_conversation,
    test_close_and_extraction_bookkeeping,
    test_conversations_are_isolated,
    test_loaded_lists_are_copies,
    test_summaries_are_checkpointed_and_absorb_each_other,
    test_the_view_is_compacted_but_storage_keeps_everything,
    test_turns_round_trip_in_order,
    test_users_and_endpoints_are_isolated,
)
from tests.memory.test_memory_long_term import (  # noqa: F401
    test_a_repeated_fact_evicts_nothing,
    test_bad_facts_are_rejected_and_nothing_is_stored,
    test_bad_user_ids_are_rejected,
    test_clear_forgets_only_that_user,
    test_concurrent_saves_lose_nothing,
    test_concurrent_saves_of_one_fact_store_it_once,
    test_limit_returns_the_newest,
    test_replace_facts,
    test_replace_facts_keeps_each_fact_once,
    test_save_and_get_in_learning_order,
    test_search_ranks_the_best_match_first,
    test_search_treats_fts_syntax_as_words,
    test_the_cap_evicts_the_oldest,
    test_the_same_fact_twice_is_stored_once,
    test_unknown_user_has_no_facts,
    test_users_are_isolated,
    test_users_do_not_share_facts_for_deduplication,
)
from tests.scaleout.redis_service import PrivateRedis, keys_under

pytestmark = pytest.mark.services


@pytest.fixture
async def backend(connection: RedisConnection) -> HistoryBackend:
    return RedisHistory(connection)


@pytest.fixture
async def store(connection: RedisConnection) -> LongTermMemory:
    return RedisLongTermMemory(connection, max_facts_per_user=5)


def turn(i: int) -> list[Message]:
    return [Message.user(f"q{i}"), Message.assistant(f"a{i}")]


# --- history ------------------------------------------------------------------------------------


async def test_two_replicas_append_to_one_history_in_order(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    a, b = RedisHistory(connection), RedisHistory(other_connection)
    key = ConversationKey("/e", "alice", "c")
    await asyncio.gather(*(((a if i % 2 else b).append(key, turn(i))) for i in range(40)))
    stored = await a.messages(key)
    assert len(stored) == 80
    for position in range(0, 80, 2):  # each turn landed whole, never interleaved
        question, answer = stored[position], stored[position + 1]
        assert question.content[1:] == answer.content[1:]
    assert await b.messages(key) == stored


async def test_a_read_decodes_only_payloads_this_process_has_not_decoded_before(
    connection: RedisConnection,
    other_connection: RedisConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A payload read again is not decoded again; another replica's turn is."""
    a, b = RedisHistory(connection), RedisHistory(other_connection)
    key = ConversationKey("/e", "alice", f"c-{uuid.uuid4().hex}")
    await check_payloads_decoded_once(a, b, key, monkeypatch)


async def test_a_turn_sent_again_after_later_turns_is_stored_once(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    """A turn whose reply was lost is sent again with its write key; by then another replica
    may have stored turns of the conversation (a lost reply to the lock's release frees the
    conversation first). The keys of the latest `RECENT_WRITES` turns are kept, so it is
    still stored once; the list of keys stays bounded."""
    mine, theirs = RedisHistory(connection), RedisHistory(other_connection)
    key = ConversationKey("/e", "alice", "resent")
    lost = mine.turn(key, turn(0))
    await mine.store_turn(lost)
    for i in range(1, RECENT_WRITES):
        await theirs.append(key, turn(i))
    await mine.store_turn(lost)  # (its reply was lost: sent again)
    assert await mine.messages(key) == [
        message for i in range(RECENT_WRITES) for message in turn(i)
    ]
    for i in range(RECENT_WRITES, 3 * RECENT_WRITES):
        await theirs.append(key, turn(i))
    writes = await connection.client.hget(mine._meta(key), "write")
    assert len(writes.split(" ")) == RECENT_WRITES


async def test_a_conversation_keeps_its_newest_messages(connection: RedisConnection) -> None:
    history = RedisHistory(connection, max_messages=6)
    key = ConversationKey("/e", None, "c")
    for i in range(5):
        await history.append(key, turn(i))
    assert await history.messages(key) == [*turn(2), *turn(3), *turn(4)]
    summary, items = await history.since_summary(key, 100)
    assert summary is None
    assert [seq for seq, _message in items] == list(range(5, 11))


async def test_the_cap_never_deletes_a_conversation_a_replica_holds(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    history = RedisHistory(connection, max_conversations=8, min_idle=0)
    locks = RedisConversationLocks(other_connection)
    held = ConversationKey("/e", "u", "held")
    await history.append(held, turn(0))
    async with locks.hold("/e", "held"):  # "another replica" is running this conversation
        for i in range(20):
            await history.append(ConversationKey("/e", "u", f"c{i}"), turn(i))
            await asyncio.sleep(0.002)  # distinct activity times
        assert await history.messages(held) == turn(0)
    assert await history.messages(ConversationKey("/e", "u", "c0")) == [], "oldest went first"
    assert await history.messages(ConversationKey("/e", "u", "c19")) == turn(19)
    assert len(await history.idle(time.time() + 1, 100)) <= 8


async def test_the_cap_spares_recent_conversations(connection: RedisConnection) -> None:
    history = RedisHistory(connection, max_conversations=4, min_idle=3600)
    for i in range(10):
        await history.append(ConversationKey("/e", "u", f"c{i}"), turn(i))
    for i in range(10):
        assert await history.messages(ConversationKey("/e", "u", f"c{i}")) == turn(i)


async def test_one_close_on_two_replicas_is_extracted_once(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    a, b = RedisHistory(connection), RedisHistory(other_connection)
    key = ConversationKey("/e", "alice", "c")
    await a.append(key, turn(1))
    assert await a.close(key)
    assert await b.close(key)
    first, second = await asyncio.gather(a.unextracted(key, 100), b.unextracted(key, 100))
    assert sorted([len(first[0]), len(second[0])]) == [0, 2], "one replica extracts"
    await (a if first[0] else b).mark_extracted(key, 2)
    await a.append(key, turn(2))
    assert await b.unextracted(key, 100) == (turn(2), 4), "the claim ended with the extraction"


async def test_history_keys_are_gone_after_clear(
    connection: RedisConnection, redis_prefix: str
) -> None:
    history = RedisHistory(connection)
    key = ConversationKey("/e", "alice", "c")
    await history.append(key, turn(1))
    await history.clear(key)
    assert [k for k in keys_under(redis_prefix) if ":h:" in k] == []


# --- long-term memory ---------------------------------------------------------------------------


async def test_two_replicas_saving_the_same_facts_store_each_once(
    connection: RedisConnection, other_connection: RedisConnection
) -> None:
    a = RedisLongTermMemory(connection)
    b = RedisLongTermMemory(other_connection)
    facts = [f"Fact number {i} about jazz" for i in range(30)]
    await asyncio.gather(
        *(a.save_facts("u", facts) for _ in range(5)),
        *(b.save_facts("u", [f.upper() for f in facts]) for _ in range(5)),
    )
    stored = await a.get_facts("u", 100)
    assert len(stored) == 30
    assert {fact.casefold() for fact in stored} == {fact.casefold() for fact in facts}
    assert await b.fact_count("u") == 30


async def test_the_index_forgets_evicted_facts(
    connection: RedisConnection, redis_prefix: str
) -> None:
    memory = RedisLongTermMemory(connection, max_facts_per_user=2)
    await memory.save_facts("u", ["likes jazz", "likes tea", "likes rain"])
    assert await memory.search("u", "jazz") == []
    assert await memory.search("u", "likes") == ["likes rain", "likes tea"]
    await memory.clear("u")
    assert keys_under(redis_prefix) == [], "clear leaves no key behind"


def test_the_truth_names_the_redis_store(connection: RedisConnection) -> None:
    from atmosphere_harness._memory.primitive import qualified_name

    assert qualified_name(RedisLongTermMemory(connection)).endswith(".RedisLongTermMemory")


# --- plans --------------------------------------------------------------------------------------


def plan(goal: str, steps: int = 1) -> AgentPlan:
    return AgentPlan([PlanStep(f"step {i}") for i in range(steps)], goal=goal)


async def test_a_plan_written_on_one_replica_is_read_on_another(
    connection: RedisConnection, other_connection: RedisConnection, tmp_path: Path
) -> None:
    root = tmp_path / "agents" / "assistant"
    a = RedisPlanStore.for_root(connection, root)
    b = RedisPlanStore.for_root(other_connection, root)
    elsewhere = RedisPlanStore.for_root(connection, tmp_path / "endpoints" / "assistant")
    assert await b.get("assistant", "c") is None
    await a.put("assistant", "c", plan("ship it", 3))
    assert await b.get("assistant", "c") == plan("ship it", 3)
    assert await elsewhere.get("assistant", "c") is None, "owners are apart"


async def test_plans_are_checked_like_the_file_store(connection: RedisConnection) -> None:
    store = RedisPlanStore(connection, "o", max_steps=2, max_plan_bytes=200)
    await store.put("a", "c", plan("ok", 2))
    with pytest.raises(PlanStoreError, match="3 steps exceeds the 2-step limit"):
        await store.put("a", "c", plan("too long", 3))
    with pytest.raises(PlanStoreError, match="bytes exceeds the 200-byte limit"):
        await store.put("a", "c", plan("x" * 300))
    with pytest.raises(PlanStoreError, match="illegal path characters"):
        await store.get("a", "../c")
    assert await store.get("a", "c") == plan("ok", 2), "a rejected plan leaves the stored one"


async def test_the_plan_cap_evicts_idle_plans_and_spares_recent_ones(
    connection: RedisConnection,
) -> None:
    idle = RedisPlanStore(connection, "o", max_plans=8, min_idle=0)
    for i in range(20):
        await idle.put("a", f"c{i}", plan(f"g{i}"))
        await asyncio.sleep(0.002)
    assert await idle.get("a", "c0") is None
    assert await idle.get("a", "c19") == plan("g19")
    busy = RedisPlanStore(connection, "p", max_plans=4, min_idle=3600)
    for i in range(8):
        await busy.put("a", f"c{i}", plan(f"g{i}"))
    assert await busy.get("a", "c0") == plan("g0"), "recent plans are never evicted"
    with pytest.raises(PlanStoreError, match="already has 8 plans in use"):
        await busy.put("a", "c9", plan("g9"))
    await busy.put("a", "c0", plan("rewrite"))  # rewriting an existing plan always works


async def test_a_burst_of_commands_shares_a_bounded_pool(tmp_path: Path) -> None:
    """Commands sent at once beyond the pool's bound wait for a connection instead of opening
    one each (the pool never closes what it opened: each is memory for the process's life),
    and all of them are answered."""
    server = PrivateRedis(tmp_path).start()
    connection = RedisConnection(server.url())
    counter = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        await connection.open()
        await connection.client.set("t:x", "1")
        replies = await asyncio.gather(*(connection.client.get("t:x") for _ in range(200)))
        assert replies == ["1"] * 200
        opened = int(counter.info("clients")["connected_clients"]) - 1  # (the counter's own)
        assert 1 <= opened <= MAX_CONNECTIONS
    finally:
        counter.close()
        await connection.aclose()
        server.stop()


async def test_replies_are_parsed_by_hiredis(connection: RedisConnection) -> None:
    """The `redis` extra brings hiredis, and the pool's connections parse with it: the
    pure-Python parser's buffers fragment the C heap under many runs in flight (about 15 KiB
    more resident memory a streaming run)."""
    await connection.client.set(connection.key("parsed"), "x" * 100)
    pool = connection.client.connection_pool
    used = await pool.get_connection()
    try:
        assert type(used._parser).__name__ == "_AsyncHiredisParser"
        await used.send_command("GET", connection.key("parsed"))
        assert await used.read_response() == "x" * 100
    finally:
        await pool.release(used)
