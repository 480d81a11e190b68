"""`RedisConnection`: the one connection pool every Redis store of an app shares (a `Resource`).

The host opens it before the primitives start: `open()` pings the server, so a URL that is set
but unreachable fails start-up with a message naming `ATMOSPHERE_REDIS_URL` and the server's
address, never its password. Every store turns the driver's connection errors into
`BackendUnavailable` (`unavailable()`), so a run that meets an outage ends with a clear `error`
frame and a route answers 503; the pool reconnects by itself once Redis is back.

The stores' Lua scripts, every command of a turn, go through `scripts()`: `EVALSHA` packed by
hiredis and sent and read on a connection of the pool, without redis-py's per-command
wrappers (retries, which are off anyway, observability hooks, its Python argument encoder).
Each round trip is bounded by one timer (`SOCKET_TIMEOUT`), and so is every other command
(`BoundedRedis`): the pool's connections have no `socket_timeout`, whose write costs redis-py a
task per command.

The URL is redis-py's (`redis://[:password@]host:port/db`, `rediss://`, `unix://`) plus one
parameter of ours: `key_prefix=` (default `atmosphere:`) puts every key of the app under that
prefix, so two apps (or two test runs) can share one database.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import hiredis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..._cancel import reraise_cancellation
from ..._errors import HarnessError, RedisUnavailable
from ..._log import get_logger

log = get_logger(__name__)

VARIABLE = "ATMOSPHERE_REDIS_URL"
DEFAULT_PREFIX = "atmosphere:"
MAX_CONNECTIONS = 64
"""Commands in flight at once per process; one more waits up to `POOL_TIMEOUT` for a slot.
The pool never closes a connection it opened (about 29 KiB of the process's RSS each, so 1.8
MiB at most): a bound of 16 saved that memory but Redis worked more a short run (fewer
commands per wake-up), so the bound stays where a burst of runs is not made to wait."""
POOL_TIMEOUT = 10.0
PARKED = 8
"""Connections the scripts keep between their round trips instead of giving them back to the
pool (`RedisConnection._send`), at most an eighth of the pool: taking one from redis-py's
blocking pool and giving it back (its lock, condition, timer and observability counters) cost
a round trip more of this process's CPU than sending and reading it. They stay counted in the
pool's bound, so the other commands always have the other seven eighths."""
CONNECT_TIMEOUT = 5.0
SOCKET_TIMEOUT = 15.0
"""A command that gets no answer for this long fails (longer than every blocking read we do):
one timer a round trip (`bounded`), not redis-py's `socket_timeout`, which costs every command
a task of its own for the write besides a timer for the read."""


def no_answer() -> RedisTimeoutError:
    """The error of a round trip that got no answer within `SOCKET_TIMEOUT`."""
    return RedisTimeoutError(f"no answer from Redis within {SOCKET_TIMEOUT:g} s")


@contextlib.asynccontextmanager
async def bounded() -> AsyncIterator[None]:
    """At most `SOCKET_TIMEOUT` for the round trip inside, then redis-py's `TimeoutError`.
    The timeout cancels the connection's write or read, and a connection cancelled there closes
    itself (redis-py's own rule), so it goes back to the pool with no reply left unread."""
    try:
        async with asyncio.timeout(SOCKET_TIMEOUT) as bound:
            yield
    except TimeoutError:
        if bound.expired():
            raise no_answer() from None
        raise


class BoundedRedis(Redis):
    """The pool's client: each command and each pipeline bounded by `SOCKET_TIMEOUT`
    (`bounded`), the pool's connections having no `socket_timeout` of their own."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        async with bounded():
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]  # (redis-py's)

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        return BoundedPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )


class BoundedPipeline(Pipeline):
    """A pipeline of `BoundedRedis`: its round trip bounded by `SOCKET_TIMEOUT`."""

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        async with bounded():
            return await super().execute(raise_on_error)


def _never_resend() -> Retry:
    """No automatic re-send: a command whose reply was lost may have run, and running it again
    could apply it twice (a turn, a lock); its failure reaches the store as `RedisUnavailable`."""
    return Retry(NoBackoff(), 0)


def describe_url(url: str) -> str:
    """`url` without user, password or query: what may appear in a message or a log."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def split_url(url: str) -> tuple[str, str]:
    """`(redis-py's URL, key prefix)`: our `key_prefix=` parameter taken out of the query."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = DEFAULT_PREFIX
    kept: list[tuple[str, str]] = []
    for name, value in query:
        if name == "key_prefix":
            prefix = value
        else:
            kept.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(kept))), prefix


DIGESTS = 4096
"""Digests kept (`digest`): a turn names one conversation's keys by the same few digests
several times (its lock, history, owner, runs), and its next turn names them again."""


@functools.lru_cache(maxsize=DIGESTS)
def digest(*parts: str) -> str:
    """A short, key-safe name for a tuple of arbitrary strings (ids may hold `:` or spaces).
    Kept for the `DIGESTS` latest tuples: a hash computed in Python costs a key about as much
    as the rest of its command's client side."""
    hasher = hashlib.blake2b(digest_size=12)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        hasher.update(len(data).to_bytes(4, "big"))
        hasher.update(data)
    return hasher.hexdigest()


def lock_key(connection: RedisConnection, path: str, conversation_id: str) -> str:
    """The key of a conversation's lock (`locks.RedisConversationLocks`; the history's cap
    reads it too)."""
    return connection.key("lock", digest(path, conversation_id))


class Script:
    """A Lua script of a store, run with `EVALSHA` on the app's pool (`RedisConnection.scripts`);
    called as redis-py's registered scripts are: `await script(keys=[...], args=[...])`."""

    __slots__ = ("connection", "sha", "text")

    def __init__(self, connection: RedisConnection, text: str) -> None:
        self.connection = connection
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        (reply,) = await self.connection.scripts((self, keys, args))
        if isinstance(reply, Exception):
            raise reply
        return reply


class RedisConnection:
    """The app's Redis pool and key namespace; opened and closed by the host (`Resource`)."""

    def __init__(self, url: str, *, max_connections: int = MAX_CONNECTIONS) -> None:
        self.url, self.prefix = split_url(url)
        self.address = describe_url(url)
        self._password = urlsplit(url).password
        pool: BlockingConnectionPool = BlockingConnectionPool.from_url(
            self.url,
            max_connections=max_connections,
            timeout=POOL_TIMEOUT,
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_timeout=None,  # (redis-py's default is 5 s; `BoundedRedis` bounds instead)
            decode_responses=True,
            retry=_never_resend(),
        )
        self.client: Redis = BoundedRedis.from_pool(pool)
        self._parked: list[Any] = []
        """Connections taken from the pool for the scripts, idle between their round trips
        (in use as far as the pool knows)."""
        self._park = min(PARKED, max_connections // 8)
        self._closed = False
        self._on_close: list[Callable[[], Awaitable[None]]] = []

    def __repr__(self) -> str:
        return f"RedisConnection({self.address!r}, prefix={self.prefix!r})"

    def key(self, *parts: str) -> str:
        """A key of this app: the prefix, then `parts` joined by `:`."""
        return self.prefix + ":".join(parts)

    def script(self, text: str) -> Script:
        """A store's Lua script on this pool (`Script`)."""
        return Script(self, text)

    async def scripts(self, *calls: tuple[Script, Sequence[Any], Sequence[Any]]) -> list[Any]:
        """Run `calls` (script, keys, args) in one round trip, in order: each one's reply, or
        the error Redis answered for it (an exception object, not raised). A connection
        failure raises (nothing is sent again).

        The stores' hot path. redis-py's `Redis.execute_command` does per command what these
        scripts never need (its retry and observability wrappers, its argument encoder in
        Python, reply callbacks), so this takes a connection from the same pool, packs with
        hiredis (the bytes redis-py's own packer makes) and sends and reads with the
        connection's methods, which close the connection on any error or cancellation, as
        `execute_command` does: a connection never goes back to the pool with a reply
        unread. A script Redis no longer holds (restarted, flushed) answers `NOSCRIPT`
        before it runs anything: it is loaded and that call alone is sent once more."""
        commands = [
            ("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls
        ]
        replies = await self._send(commands)
        for index, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                script, _keys, _args = calls[index]
                loaded, again = await self._send([("SCRIPT", "LOAD", script.text), commands[index]])
                if isinstance(loaded, Exception):
                    raise loaded
                replies[index] = again
        return replies

    async def _send(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """`commands` pipelined on one connection of the pool: each reply or error reply,
        within `SOCKET_TIMEOUT` (`bounded`), connecting included. The connection is parked
        for the next round trip (`PARKED`) once every reply was read; one that failed (closed
        by the driver on any error or cancellation) goes back to the pool."""
        async with bounded():
            used = await self._checkout()
            try:
                await used.send_packed_command(
                    b"".join([hiredis.pack_command(command) for command in commands]),
                    check_health=False,
                )
                replies: list[Any] = []
                for _command in commands:
                    try:
                        replies.append(await used.read_response())
                    except ResponseError as exc:
                        replies.append(exc)
            except BaseException:
                await self.client.connection_pool.release(used)
                raise
            if len(self._parked) < self._park and not self._closed:
                self._parked.append(used)
            else:
                await self.client.connection_pool.release(used)
            return replies

    async def _checkout(self) -> Any:
        """A parked connection, checked as the pool checks the ones it hands out (reconnected
        if Redis closed it, refused if it holds unread data), else one from the pool."""
        pool = self.client.connection_pool
        if not self._parked:
            return await pool.get_connection()  # type: ignore[no-untyped-call]  # (redis-py's)
        used = self._parked.pop()
        try:
            await pool.ensure_connection(used)
        except BaseException:
            await pool.release(used)
            raise
        return used

    def on_close(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run `callback` when the pool closes (first), e.g. to stop a listener task."""
        self._on_close.append(callback)

    def dedicated(self) -> Redis:
        """A client with a connection of its own (blocking reads, pub/sub), same settings."""
        return Redis.from_url(
            self.url,
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_timeout=SOCKET_TIMEOUT,
            decode_responses=True,
            retry=_never_resend(),
        )

    def scrub(self, text: object) -> str:
        """`text` with the password cut out, in case a driver message ever quotes it."""
        value = str(text)
        if self._password:
            value = value.replace(self._password, "***")
        return value

    async def open(self) -> None:
        """Connect and ping: a bad URL fails start-up here, naming the variable."""
        try:
            await self.client.ping()
        except RedisError as exc:
            await self.aclose()
            raise HarnessError(
                f"{VARIABLE} is set but Redis at {self.address} cannot be used: {self.scrub(exc)}"
            ) from None
        log.info("redis backend connected", address=self.address, prefix=self.prefix)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for callback in reversed(self._on_close):
            try:
                await callback()
            except Exception as exc:
                log.warning("redis backend part failed to close", error=self.scrub(exc))
        self._parked.clear()  # (in use as far as the pool knows: it closes them too)
        await self.client.aclose(close_connection_pool=True)

    @contextlib.contextmanager
    def unavailable(self, doing: str) -> Iterator[None]:
        """Turn a connection failure inside the block into `RedisUnavailable`."""
        try:
            yield
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise RedisUnavailable(
                f"Redis ({VARIABLE} at {self.address}) is unavailable while {doing}: "
                f"{self.scrub(exc)}; try again once it is back"
            ) from None


def as_str(value: Any) -> str | None:
    """A reply field as text (`None` stays `None`)."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


LISTEN_BACKOFF = (0.1, 0.25, 0.5, 1.0, 2.0)
"""Pauses before a lost pub/sub connection is reopened (the last one repeats)."""


async def listen(
    connection: RedisConnection,
    channel: str | None,
    deliver: Callable[[str], None],
    *,
    lost: str,
    subscribed: Callable[[bool], Awaitable[None]] | None = None,
    wait: float = 5.0,
    on_pubsub: Callable[[Any], None] | None = None,
    confirmed: Callable[[str], None] | None = None,
) -> None:
    """Hand every message published on `channel` to `deliver`, until cancelled.

    A lost connection is reopened after a growing pause (`LISTEN_BACKOFF`) and logged once per
    outage (`lost`, a WARN). Messages published while not subscribed are never delivered, so
    `subscribed(reconnected)` runs after each (re)subscribe: that is where a caller re-reads
    what it may have missed. `wait` bounds each read, so a cancellation swallowed by the driver
    is still noticed (`reraise_cancellation`).

    A caller that subscribes to channels of its own while listening (`channel` may then be
    `None`) gets each connection's pub/sub from `on_pubsub` (`None` once it is lost) and, from
    `confirmed`, each channel whose subscription Redis confirmed (from then on its messages
    come).
    """
    failures = 0
    while True:
        client = connection.dedicated()
        pubsub = client.pubsub(ignore_subscribe_messages=confirmed is None)
        try:
            if channel is not None:
                await pubsub.subscribe(channel)
            else:
                await pubsub.connect()  # type: ignore[no-untyped-call]  # (redis-py's)
            reconnected, failures = failures > 0, 0
            if on_pubsub is not None:
                on_pubsub(pubsub)
            if subscribed is not None:
                await subscribed(reconnected)
            while True:
                message = await pubsub.get_message(timeout=wait)
                reraise_cancellation()
                if message is None:
                    continue
                kind = message.get("type")
                if kind == "message":
                    deliver(as_str(message.get("data")) or "")
                elif kind == "subscribe" and confirmed is not None:
                    confirmed(as_str(message.get("channel")) or "")
        except asyncio.CancelledError:
            raise
        except (RedisError, OSError) as exc:
            if on_pubsub is not None:
                on_pubsub(None)
            failures += 1
            if failures == 1:
                log.warning(lost, error=connection.scrub(exc))
            await asyncio.sleep(LISTEN_BACKOFF[min(failures, len(LISTEN_BACKOFF)) - 1])
        finally:
            if on_pubsub is not None:
                on_pubsub(None)
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()


async def listening(
    connection: RedisConnection,
    channel: str,
    deliver: Callable[[str], None],
    *,
    lost: str,
    name: str,
    wait: float = 5.0,
) -> asyncio.Task[None]:
    """`listen` on `channel` in a task of its own, returned once Redis confirmed the
    subscription or after `wait` seconds (it goes on trying): the caller cancels it to stop."""
    ready = asyncio.Event()

    async def subscribed(_reconnected: bool) -> None:
        ready.set()

    task = asyncio.get_running_loop().create_task(
        listen(connection, channel, deliver, lost=lost, subscribed=subscribed), name=name
    )
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ready.wait(), wait)
    return task
