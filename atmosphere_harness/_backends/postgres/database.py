"""`PostgresDatabase`: the connection pool, the schema migration and the `LISTEN` connection.

One object per app, shared by every PostgreSQL store. It is the backend's `contracts.Resource`:
the host opens it before the primitives start, so a set-but-unreachable
`ATMOSPHERE_POSTGRES_URL` fails start-up there, with a message that names the variable and
shows the URL with its password masked.

Why asyncpg (not psycopg 3): on this project's machines a round trip through asyncpg's pool took
a median 116-168 us against 189 us for psycopg's `AsyncConnectionPool`, and 7,700 against 4,400
queries/s over four connections; it also brings its own pool, which
replaces a connection the server closed, and a callback-based `LISTEN`.

Outages: `run(work)` retries `work` once on a fresh connection when the connection it got was
closed under it (a `pg_terminate_backend`, a server restart); a second failure raises
`BackendUnavailable`, which ends that run with an `error` frame. The `LISTEN` connection is
supervised: when it is lost it is reopened with backoff, listening again on every channel, and
every `on_reconnect` callback runs so the stores re-read what a missed notification would have
told them. Channels are fixed at start (`listen`) or come and go while open (`subscribe`,
`unsubscribe`: a run's frame notices, heard only while a reader here follows that run).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import asyncpg

from ..._errors import BackendUnavailable, HarnessError
from ..._log import fault, get_logger
from .schema import migrate

log = get_logger(__name__)

T = TypeVar("T")

VARIABLE = "ATMOSPHERE_POSTGRES_URL"
POOL_MIN = 1
POOL_MAX = 10
CONNECT_TIMEOUT = 10.0
COMMAND_TIMEOUT = 30.0
LISTEN_HEALTH_SECONDS = 5.0
"""How often the `LISTEN` connection is probed (a half-open TCP connection says nothing)."""
RECONNECT_BACKOFF = (0.1, 0.25, 0.5, 1.0, 2.0)
KEPT = 1
"""Pooled connections `PostgresDatabase.run` keeps out of the pool between statements
(`PostgresDatabase._keep`): one serves a replica's statements one after another."""

DISCONNECTS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
    ConnectionError,
    OSError,
)
"""Errors that mean "this connection is gone", not "this statement is wrong"."""


async def _keep_session(_connection: Any) -> None:
    """The pool's reset on release, minus its round trip.

    asyncpg resets a released connection with `RESET ALL; UNLISTEN *; SELECT
    pg_advisory_unlock_all(); ...`, one more round trip per statement. The stores never leave
    session state on a pooled connection (no `SET`, `LISTEN` or session-level lock: those live
    on the dedicated connections), and asyncpg still rolls back a transaction left open before
    calling this, so there is nothing to reset.
    """


def _set_on_close(event: asyncio.Event, _connection: Any) -> None:
    event.set()


CLIENT_ERRORS = (asyncpg.exceptions.InterfaceError, asyncpg.exceptions.InternalClientError)


def connection_lost(exc: BaseException, connection: Any) -> bool:
    """Whether a client-side error really means the connection died under the statement.

    A connection killed mid-statement or inside a transaction can surface as "another operation
    is in progress" (the protocol still waits for the dead server) or as an error of the
    rollback, with the kill as its context.
    """
    return _is_closed(connection) or _caused_by_disconnect(exc) or "in progress" in str(exc)


def _is_closed(connection: Any) -> bool:
    try:
        return bool(connection.is_closed())
    except asyncpg.exceptions.InterfaceError:  # the pool already dropped the dead connection
        return True


def _caused_by_disconnect(exc: BaseException) -> bool:
    seen: BaseException | None = exc.__cause__ or exc.__context__
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, DISCONNECTS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def redact(url: str) -> str:
    """`url` with its password (in the authority or a `password=` parameter) as `***`."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            host = parts.hostname or ""
            if parts.port is not None:
                host = f"{host}:{parts.port}"
            netloc = f"{parts.username or ''}:***@{host}"
        query = "&".join(
            f"{name}=***" if name.lower() == "password" else f"{name}={value}"
            for name, value in parse_qsl(parts.query, keep_blank_values=True)
        )
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "<unparsable URL>"


def _secrets(url: str) -> list[str]:
    """The password(s) a URL carries, to mask wherever they might be echoed."""
    try:
        parts = urlsplit(url)
        found = [parts.password or ""]
        found += [v for k, v in parse_qsl(parts.query) if k.lower() == "password"]
    except ValueError:
        return []
    return [secret for secret in found if secret]


class PostgresDatabase:
    """The shared pool (`run`), the schema (migrated in `open`) and `LISTEN` dispatch."""

    def __init__(self, url: str, *, pool_min: int = POOL_MIN, pool_max: int = POOL_MAX) -> None:
        self.url = url
        self.pool_min = pool_min
        self.pool_max = pool_max
        self._pool: Any = None
        self._kept: list[Any] = []
        """Pooled connections kept between `run`s (`_keep`), the latest last."""
        self._acquiring = 0
        """`run`s waiting for a connection from the pool."""
        self._listeners: dict[str, list[Callable[[str], None]]] = {}
        self._reconnect_hooks: list[Callable[[], None]] = []
        self._listen_task: asyncio.Task[None] | None = None
        self._listen_ready: asyncio.Event | None = None
        self._listening: Any = None
        """The `LISTEN` connection while it is up."""
        self._listen_lock = asyncio.Lock()
        """One statement at a time on the `LISTEN` connection (its probe, `LISTEN`, `UNLISTEN`)."""
        self._closing = False
        self.epoch = ""
        """Random per database (set at migration): event ids from another database never match."""

    def __repr__(self) -> str:
        return f"PostgresDatabase({redact(self.url)!r})"

    # --- lifecycle ------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, migrate, start listening; a failure names the variable, never the password."""
        try:
            self._pool = await asyncpg.create_pool(
                self.url,
                min_size=self.pool_min,
                max_size=self.pool_max,
                timeout=CONNECT_TIMEOUT,
                command_timeout=COMMAND_TIMEOUT,
                max_inactive_connection_lifetime=60.0,
                reset=_keep_session,
            )
            async with self._pool.acquire() as connection:
                await migrate(connection)
                self.epoch = str(
                    await connection.fetchval(
                        "SELECT value FROM atmosphere_meta WHERE key = 'epoch'"
                    )
                )
        except HarnessError:
            await self._close_pool()
            raise
        except Exception as exc:
            await self._close_pool()
            raise BackendUnavailable(
                f"{VARIABLE} is set but PostgreSQL at {redact(self.url)} is not usable: "
                f"{self.scrub(exc)}"
            ) from None
        self._listen_ready = asyncio.Event()
        self._listen_task = asyncio.get_running_loop().create_task(
            self._listen_forever(), name="postgres-listen"
        )
        await asyncio.wait_for(self._listen_ready.wait(), CONNECT_TIMEOUT * 2)
        log.info("PostgreSQL state backend open", url=redact(self.url))

    async def aclose(self) -> None:
        self._closing = True
        if self._listen_task is not None:
            self._listen_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listen_task
            self._listen_task = None
        await self._close_pool()

    async def _close_pool(self) -> None:
        if self._pool is not None:
            await self._release_kept()
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), 10)
            except Exception:
                pool.terminate()

    def scrub(self, exc: BaseException) -> str:
        """`exc` as text, with the URL's password (should a driver ever echo it) masked."""
        return self.mask(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)

    def mask(self, text: str) -> str:
        """`text` with the URL's password masked."""
        for secret in _secrets(self.url):
            text = text.replace(secret, "***")
        return text

    # --- queries --------------------------------------------------------------------------

    @property
    def pool(self) -> Any:
        if self._pool is None:
            raise BackendUnavailable("the PostgreSQL backend is not open")
        return self._pool

    async def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """`await work(connection)` on a pooled connection, once more if the first one died."""
        for attempt in range(2):
            try:
                return await self._once(work)
            except DISCONNECTS as exc:
                if attempt:
                    raise BackendUnavailable(
                        f"PostgreSQL is unavailable ({VARIABLE}): {self.scrub(exc)}"
                    ) from None
                fault(
                    log,
                    "PostgreSQL connection lost; retrying once",
                    exc,
                    every=False,
                    scrub=self.mask,
                )
                # The other idle connections were most likely cut too (a restart, a
                # `pg_terminate_backend` sweep): have the pool replace them all, so the retry
                # gets a fresh one instead of the next dead one.
                await self._release_kept()
                await self.pool.expire_connections()
        raise AssertionError("unreachable")

    async def _once(self, work: Callable[[Any], Awaitable[T]]) -> T:
        connection = await self._take_kept()
        if connection is None:
            self._acquiring += 1
            try:
                connection = await self.pool.acquire()
            except (asyncpg.PostgresError, *CLIENT_ERRORS) as exc:
                # No connection to be had (refused, the database closed to connections, the
                # server starting up): an outage, whatever the reason's class.
                raise ConnectionError(str(exc)) from exc
            finally:
                self._acquiring -= 1
        kept = False
        try:
            result = await work(connection)
            kept = self._keep(connection)
            return result
        except CLIENT_ERRORS as exc:
            if connection_lost(exc, connection):
                raise ConnectionError(str(exc)) from exc
            raise
        finally:
            if not kept:
                await self._release(connection)

    async def _take_kept(self) -> Any:
        """The connection `_keep` kept, if it is still open (a closed one goes back to the
        pool, which opens another)."""
        while self._kept:
            connection = self._kept.pop()
            if not _is_closed(connection):
                return connection
            await self._release(connection)
        return None

    def _keep(self, connection: Any) -> bool:
        """Keep `connection` for the next `run` instead of releasing it to the pool: asyncpg's
        release (a task of its own, the pool's timers) and its next acquire cost more of this
        process's CPU than the round trip they wrap. Only a connection as the pool would hand it
        out (open, no transaction), up to `KEPT` of them, and never while a `run` waits for the
        pool (it gets this one from the pool instead)."""
        if (
            len(self._kept) >= KEPT
            or self._acquiring
            or self._closing
            or _is_closed(connection)
            or connection.is_in_transaction()
        ):
            return False
        self._kept.append(connection)
        return True

    async def _release(self, connection: Any) -> None:
        try:
            await self.pool.release(connection)
        except Exception as exc:
            # The reset of a connection killed after `work` finished: the pool has
            # terminated it and opens another; `work`'s own outcome stands.
            log.debug("a dead connection was dropped from the pool", error=self.scrub(exc))

    async def _release_kept(self) -> None:
        kept, self._kept = self._kept, []
        for connection in kept:
            await self._release(connection)

    # --- LISTEN / NOTIFY ------------------------------------------------------------------

    def listen(self, channel: str, callback: Callable[[str], None]) -> None:
        """Call `callback(payload)` for every `NOTIFY channel` (register before `open`)."""
        self._listeners.setdefault(channel, []).append(callback)

    async def subscribe(self, channel: str, callback: Callable[[str], None]) -> bool:
        """`listen` while open: `LISTEN channel` now. `True` once the server listens; `False`
        if the `LISTEN` connection is down (it listens when reopened, then `on_reconnect` runs)."""
        callbacks = self._listeners.setdefault(channel, [])
        if callback not in callbacks:
            callbacks.append(callback)
        async with self._listen_lock:
            connection = self._listening
            if connection is None or connection.is_closed():
                return False
            try:
                await connection.add_listener(channel, self._dispatch)
            except (*DISCONNECTS, *CLIENT_ERRORS) as exc:
                # Its probe notices the loss and reopens it, listening on `channel` too.
                log.debug("LISTEN failed; the connection is reopened", error=self.scrub(exc))
                return False
            return True

    async def unsubscribe(self, channel: str, callback: Callable[[str], None]) -> None:
        """Undo `subscribe`: `UNLISTEN channel` once no callback is left on it."""
        callbacks = self._listeners.get(channel, [])
        if callback in callbacks:
            callbacks.remove(callback)
        if callbacks:
            return
        self._listeners.pop(channel, None)
        async with self._listen_lock:
            connection = self._listening
            if connection is not None and not connection.is_closed():
                with contextlib.suppress(*DISCONNECTS, *CLIENT_ERRORS):
                    await connection.remove_listener(channel, self._dispatch)

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        """Call `callback()` after the `LISTEN` connection was lost and reopened."""
        self._reconnect_hooks.append(callback)

    def _dispatch(self, _connection: Any, _pid: int, channel: str, payload: str) -> None:
        for callback in self._listeners.get(channel, ()):
            try:
                callback(payload)
            except Exception:
                log.exception("NOTIFY handler failed", channel=channel)

    async def _watch(self, connection: Any, lost: asyncio.Event) -> None:
        """Return only by raising: when the connection closes or stops answering."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lost.wait(), LISTEN_HEALTH_SECONDS)
            if lost.is_set():
                raise ConnectionError("LISTEN connection closed")
            async with self._listen_lock:
                await asyncio.wait_for(connection.fetchval("SELECT 1"), CONNECT_TIMEOUT)

    async def _listen_forever(self) -> None:
        failures = 0
        first = True
        while not self._closing:
            connection: Any = None
            try:
                connection = await asyncpg.connect(self.url, timeout=CONNECT_TIMEOUT)
                lost = asyncio.Event()
                connection.add_termination_listener(functools.partial(_set_on_close, lost))
                async with self._listen_lock:
                    for channel in list(self._listeners):
                        await connection.add_listener(channel, self._dispatch)
                    self._listening = connection
                if not first:
                    log.info("PostgreSQL LISTEN connection restored")
                    for hook in self._reconnect_hooks:
                        hook()
                first = False
                failures = 0
                assert self._listen_ready is not None
                self._listen_ready.set()
                await self._watch(connection, lost)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = RECONNECT_BACKOFF[min(failures, len(RECONNECT_BACKOFF) - 1)]
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    log.warning(
                        "PostgreSQL LISTEN connection lost; reconnecting",
                        error=self.scrub(exc),
                    )
                await asyncio.sleep(delay)
            finally:
                self._listening = None
                if connection is not None:
                    connection.terminate()
