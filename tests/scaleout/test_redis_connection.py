"""The Redis pool's round trips: the stores' scripts (`RedisConnection.scripts`) and every other
command keep what redis-py's own command path promised, for less client work.

- A script call is `EVALSHA` packed by hiredis (the bytes redis-py packs), sent and read on a
  pooled connection, bounded by one timer a round trip (`SOCKET_TIMEOUT`): no task of its own,
  the pool's connections have no `socket_timeout` (redis-py's costs each command a task).
- A round trip that gets no answer fails within the bound (`RedisTimeoutError`, which the
  stores report as `RedisUnavailable`), connecting included, for scripts, single commands and
  pipelines alike.
- A cancelled call never leaves its reply on a connection of the pool.
- A script Redis lost (restart, `SCRIPT FLUSH`) is loaded and runs once: `NOSCRIPT` comes before
  it runs anything.
- The scripts keep their connections between round trips (`PARKED`, at most an eighth of the
  pool) instead of taking one from the pool each time; a kept connection Redis closed is
  reconnected before use, and the rest of the pool stays free for the other commands.
- A key's digest is computed once for the latest `DIGESTS` tuples, and names the same key.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from typing import Any

import hiredis
import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import TimeoutError as RedisTimeoutError

from atmosphere_harness._backends.redis import RedisConnection, RedisHistory
from atmosphere_harness._backends.redis import connection as module
from atmosphere_harness._errors import HarnessError, RedisUnavailable
from atmosphere_harness._memory.history import ConversationKey

from .redis_service import PrivateRedis

pytestmark = pytest.mark.services

_SLOW = """
local started = redis.call('TIME')
local now = started
while (now[1] - started[1]) * 1000000 + (now[2] - started[2]) < tonumber(ARGV[1]) do
    now = redis.call('TIME')
end
return ARGV[2]
"""
"""Answers `ARGV[2]` after busying Redis for `ARGV[1]` microseconds."""


async def test_a_script_call_starts_no_task_and_the_pool_has_no_socket_timeout(
    connection: RedisConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = connection.client.connection_pool
    assert pool.connection_kwargs["socket_timeout"] is None
    history = RedisHistory(connection)
    key = ConversationKey("/p", None, "c")
    await history.tail(key, 5)  # (loads the script)
    loop = asyncio.get_running_loop()
    started: list[Any] = []
    create_task = loop.create_task

    def counted(coro: Any, **kwargs: Any) -> Any:
        started.append(coro)
        return create_task(coro, **kwargs)

    monkeypatch.setattr(loop, "create_task", counted)
    assert await history.tail(key, 5) == []
    assert started == []


@pytest.fixture
async def silent() -> AsyncIterator[int]:
    """A port that accepts connections and never answers (a Redis hung or cut off)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in held:
            writer.close()


async def test_a_round_trip_without_an_answer_fails_within_the_bound(
    silent: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(module, "SOCKET_TIMEOUT", 0.3)
    connection = RedisConnection(f"redis://127.0.0.1:{silent}/0")
    history = RedisHistory(connection)
    try:
        started = time.monotonic()
        with pytest.raises(RedisUnavailable, match=r"no answer from Redis within 0\.3 s"):
            await history.tail(ConversationKey("/p", None, "c"), 5)
        with pytest.raises(RedisTimeoutError):
            await connection.client.get("k")
        async with connection.client.pipeline(transaction=False) as pipe:
            pipe.get("k")
            with pytest.raises(RedisTimeoutError):
                await pipe.execute()
        with pytest.raises(HarnessError, match="ATMOSPHERE_REDIS_URL is set but Redis at"):
            await connection.open()
        assert time.monotonic() - started < 4 * 2.0  # (each within its 0.3 s, generously)
    finally:
        await connection.aclose()


async def test_a_cancelled_call_leaves_no_reply_on_a_pooled_connection(
    redis_prefix: str,
) -> None:
    from .redis_service import url_for

    connection = RedisConnection(url_for(redis_prefix), max_connections=1)
    await connection.open()
    slow = connection.script(_SLOW)
    try:
        assert await slow(args=[0, "warm"]) == "warm"
        call = asyncio.ensure_future(slow(args=[200_000, "late"]))
        await asyncio.sleep(0.05)  # (sent: Redis is running it)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # One connection in the pool: had the cancelled call's reply stayed on it, this would
        # read "late".
        assert await slow(args=[0, "mine"]) == "mine"
        assert await connection.client.get(connection.key("absent")) is None
    finally:
        await connection.aclose()


async def test_a_script_redis_lost_is_loaded_and_runs_once(
    private_redis: PrivateRedis,
) -> None:
    connection = RedisConnection(private_redis.url())
    await connection.open()
    count = connection.script("return redis.call('INCR', KEYS[1])")
    counter = connection.key("count")
    try:
        assert await count(keys=[counter]) == 1
        await connection.client.script_flush()
        assert await count(keys=[counter]) == 2
        await connection.client.script_flush()
        first, second = await connection.scripts((count, [counter], []), (count, [counter], []))
        assert (first, second) == (3, 4)
        assert int(await connection.client.get(counter)) == 4
    finally:
        await connection.aclose()


@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "a" * 40, 2, "atmosphere:h:k", b"token", 15000, -3, 2**70),
        ("EVALSHA", "b" * 40, 0, "1765000000.125", 0.1, 1e20, "übung ✓", ""),
    ],
)
def test_the_stores_pack_what_redis_py_packs(args: tuple[Any, ...]) -> None:
    """Identity on purpose: `RedisConnection.scripts` packs with hiredis, redis-py's other commands
    with redis-py's packer, and Redis must read the same bytes from both."""
    ours = hiredis.pack_command(args)
    assert ours == b"".join(Connection().pack_command(*args))


async def test_the_scripts_keep_their_connection_between_round_trips(
    connection: RedisConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = connection.client.connection_pool
    echo = connection.script("return ARGV[1]")
    assert await echo(args=["warm"]) == "warm"
    taken: list[Any] = []
    get_connection = pool.get_connection

    async def counted(*args: Any, **kwargs: Any) -> Any:
        taken.append(args)
        return await get_connection(*args, **kwargs)

    monkeypatch.setattr(pool, "get_connection", counted)
    for n in range(5):
        assert await echo(args=[str(n)]) == str(n)
    assert taken == []  # (one kept connection served all five)
    assert await connection.client.get(connection.key("absent")) is None  # (from the pool)


async def test_a_kept_connection_redis_closed_is_reconnected_before_use(
    private_redis: PrivateRedis,
) -> None:
    connection = RedisConnection(private_redis.url())
    await connection.open()
    echo = connection.script("return ARGV[1]")
    try:
        assert await echo(args=["before"]) == "before"
        killer = connection.dedicated()
        try:
            assert await killer.client_kill_filter(_type="normal", skipme=True) >= 1
        finally:
            await killer.aclose()
        await asyncio.sleep(0.05)  # (the close reaches this side)
        assert await echo(args=["after"]) == "after"
    finally:
        await connection.aclose()


async def test_the_kept_connections_are_bounded_and_the_pool_stays_usable(
    redis_prefix: str,
) -> None:
    from .redis_service import url_for

    connection = RedisConnection(url_for(redis_prefix), max_connections=16)
    await connection.open()
    slow = connection.script(_SLOW)
    try:
        answers = await asyncio.gather(*(slow(args=[20_000, str(n)]) for n in range(12)))
        assert answers == [str(n) for n in range(12)]
        assert len(connection._parked) == 16 // 8  # (the rest went back to the pool)
        # The pool serves its other commands at once, with every connection it has left.
        async with asyncio.timeout(2):
            got = await asyncio.gather(
                *(connection.client.get(connection.key("absent")) for _ in range(14))
            )
        assert got == [None] * 14
    finally:
        await connection.aclose()
    assert connection._parked == []


def test_a_digest_is_computed_once_and_names_the_same_keys() -> None:
    """Kept (`DIGESTS`), a digest names the keys it always named: every replica, whatever its
    version, finds the same conversation under the same key."""
    parts = ("/atmosphere/agent/scribe", "conversation é:1")
    spelled = hashlib.blake2b(digest_size=12)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        spelled.update(len(data).to_bytes(4, "big"))
        spelled.update(data)
    assert module.digest(*parts) == spelled.hexdigest()
    hits = module.digest.cache_info().hits
    assert module.digest(*parts) == spelled.hexdigest()
    assert module.digest.cache_info().hits == hits + 1
