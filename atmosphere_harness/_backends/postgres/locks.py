"""`PostgresConversationLocks`: one prompt at a time per conversation, across every replica.

The lock is a session-level advisory lock on a 64-bit hash of (endpoint path, conversation id).
Session-level advisory locks belong to the connection that took them, so this replica takes all
of its locks on **one dedicated connection** (not a pooled one that would go back to the pool,
and not one connection per held lock, which would exhaust the pool under load):

1. a local `asyncio.Lock` per conversation first, because a session's advisory locks are
   re-entrant: two prompts of this replica must not both "get" the lock on the same session;
2. then `pg_try_advisory_lock` on the lock connection; when another replica holds it, wait for
   the `NOTIFY atmosphere_locks` its release sends (or `RETRY_SECONDS`, whichever is first) and
   try again. A waiter first marks the lock (`MARK`, a shared advisory lock it holds while it
   waits) and tries once more; a release sends the `NOTIFY` only when the lock is marked, so an
   uncontended turn sends none (each `NOTIFY` wakes every replica's listener). When the run's
   first history read is offered (`memory.history.HistoryRead` on this database's
   `PostgresHistory`), each try is `history.LOCK_NEWEST` instead: one statement that takes the
   lock and, only once it has, reads the history with a fresh snapshot (a PL/pgSQL function,
   schema migration 5), so the turn saves the history load's round trip and the read still
   happens under the lock. The lock connection runs in READ COMMITTED whatever the server's
   default, which that fresh snapshot needs. When the run's status is offered with the read
   (`contracts.LockedStatus`, of this database's `PostgresRunRegistry`), each try is `LOCK_RUN`,
   which stores it too (`running`, or `queued` on the first try that finds the lock taken;
   schema migration 11), so the run's status costs the turn no round trip of its own. When a
   prompt's owner claim is offered too (`contracts.LockedClaim`, on this database's
   `PostgresConversationOwners`), each try is `CLAIM_LOCK_RUN` (schema migration 15), which
   claims the conversation first and, for another user's, stops there (`ConversationTaken`,
   nothing locked or stored); a prompt that finds this replica's local lock taken claims at
   once with a `CLAIM_LOCK_RUN` that does not try the lock, so its answer does not wait;
3. release: `pg_advisory_unlock` and, if the lock is marked, the `NOTIFY` (`RELEASE`, one
   statement), on the same connection, in a task of its own, which the run does not wait for
   (its `complete` frame leaves without that round trip). Where the lock stored the run's
   status, the release first waits for the run's end (`contracts.LockedStatus.end`) and stores
   it; while its block runs, such a lock also takes the run's turn
   (`contracts.LockedStatus.hand`, from `ConversationMemory`), and the release stores the turn
   and the end in one statement (`APPEND_END`, the end alone when no turn was handed) on a
   pooled connection, not the lock connection, where every turn of the replica would wait for
   the WAL flush of the one before. The run waits for that statement (its turn and its end are
   stored before its last frame); then the release tells it (`LockedStatus.wrote`,
   `released`) and only then frees the lock. If that statement fails, or the end does not come
   in time, the turn is stored on its own (`PostgresHistory.store_turn`, with the turn's write
   key: stored once) before the lock is freed, and the run learns whether it could be
   (a turn that could not be stored fails the run). The next prompt of that conversation on
   this replica waits for the whole release first; one on another replica finds the lock
   taken until the unlock arrives and waits for the `NOTIFY` as it would anyway. `aclose` waits
   for the releases still running.

The locks of a replica that dies go with its lock connection: at once when its process dies (its
host closes the connection), and within about a durable-runs lease
(`ATMOSPHERE_DURABLE_RUNS_LEASE_SECONDS`) when its whole host vanishes without closing it: the
lock connection asks the server for TCP keepalives scaled to the lease (`lock_session`), so the
server drops a silent peer's connection, and its locks, about when that replica's runs' leases
run out, instead of after the operating system's default of hours. A replica taking a run over
is then not kept waiting for the conversation longer than for the run.

If the lock connection is lost, PostgreSQL drops its locks: the prompts holding them run to their
end (their turns are still written atomically, one transaction each, by their releases on the
pool), a new connection is opened for the next acquisitions, and a WARN says mutual exclusion
was interrupted. A lock release that finds its connection gone has nothing left to unlock.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from ..._cancel import reraise_cancellation
from ..._contracts import LockedClaim, LockedRead, LockedStatus, LockedWrite
from ..._errors import BackendUnavailable
from ..._log import fault, get_logger
from ..._memory.history import HistoryRead, HistoryWrite
from .control import PostgresRunRegistry, lock_run_args, run_values, status_upsert
from .database import (
    CLIENT_ERRORS,
    CONNECT_TIMEOUT,
    DISCONNECTS,
    VARIABLE,
    PostgresDatabase,
    connection_lost,
)
from .history import (
    LOCK_NEWEST,
    PostgresHistory,
    Turn,
    append_with,
    lock_newest_args,
    newest_rows,
)
from .owners import PostgresConversationOwners

log = get_logger(__name__)

CHANNEL = "atmosphere_locks"
RETRY_SECONDS = 0.5
"""Upper bound on how long a waiter sleeps between tries if a release notification is missed."""


LEASE_SECONDS = 15.0
"""The durable-runs lease a lock connection's keepalives follow unless told another."""
KEEPALIVE_PROBES = 2


def lock_session(lease_seconds: float = LEASE_SECONDS) -> dict[str, str]:
    """The lock connection's settings. `LOCK_NEWEST` reads with a snapshot taken after the
    lock, which READ COMMITTED gives (a stricter server default would read with an older one).
    TCP keepalives: idle, then `KEEPALIVE_PROBES` probes, a third of the lease apart, so the
    server closes the connection of a replica whose host went silent (and releases its locks)
    about a lease later. A live replica's kernel answers the probes, however busy it is."""
    step = str(max(1, round(lease_seconds / 3)))
    return {
        "default_transaction_isolation": "read committed",
        "tcp_keepalives_idle": step,
        "tcp_keepalives_interval": step,
        "tcp_keepalives_count": str(KEEPALIVE_PROBES),
    }


LOCK_RUN = (
    "SELECT * FROM atmosphere_lock_run($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, "
    "$14, $15, $16)"
)
"""`LOCK_NEWEST` that also stores the run's status (`contracts.LockedStatus`; schema migration
11): `running` once the lock is taken, `queued` on the first try that finds it taken."""

CLAIM_LOCK_RUN = (
    "SELECT * FROM atmosphere_claim_lock_run(" + ", ".join(f"${n}" for n in range(1, 23)) + ")"
)
"""`LOCK_RUN` that first claims the conversation for the prompt's user (`contracts.LockedClaim`;
schema migration 15): its first column is the owner found; a conversation another user owns is
neither locked nor read, and the run's status is not stored. With its second argument false it
claims (and stores `queued`) without trying the lock."""

NO_STATUS = (None,) * 9 + (False,)
"""`CLAIM_LOCK_RUN`'s run arguments when no status rides with the try."""

MARK = "SELECT pg_advisory_lock_shared($1, $2)"
"""A waiter's mark on a conversation's lock, held while it waits: a shared advisory lock on the
lock id's two halves (the two-`int4` key space, apart from every single-key lock)."""
UNMARK = "SELECT pg_advisory_unlock_shared($1, $2)"
RELEASE = """
SELECT CASE WHEN pg_try_advisory_xact_lock($3, $4) THEN NULL ELSE pg_notify($2, $1::text) END
FROM (SELECT pg_advisory_unlock($1) OFFSET 0) AS released
"""
"""Unlock, then `NOTIFY` only if a waiter marked the lock (its shared mark makes the exclusive
try fail; `OFFSET 0` keeps the unlock first). A `NOTIFY` wakes every replica's listener
whoever waits, and cost a turn 0.3-0.5 ms here when sent on each release."""

APPEND_END = append_with("status AS (" + status_upsert(7, relaxed=False) + ")")
"""The run's turn (`history.APPEND`, its arguments first) and its end in its status row
(`control.UPSERT`'s arguments next), one statement on a pooled connection: one round trip and
one commit for both. The commit waits for the WAL flush as the turn's own would (the status's
`set_config` is left out, so the turn keeps the server's `synchronous_commit`). Sent again after
a lost acknowledgement (`PostgresDatabase.run`), the turn is skipped by its write key and the
end stored again as it was."""


def lock_key(path: str, conversation_id: str) -> int:
    """The advisory lock id of a conversation (a signed 64-bit hash)."""
    digest = hashlib.blake2b(f"{path}\0{conversation_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def mark_key(key: int) -> tuple[int, int]:
    """Lock id `key` as two signed `int4`s: the key of its waiters' mark (`MARK`)."""
    low = key & 0xFFFFFFFF
    return key >> 32, low - (1 << 32) if low >= 1 << 31 else low


def deliver(read: HistoryRead, rows: Any) -> None:
    """Hand `read` its rows; rows it cannot decode are left for its own read to meet (the
    lock is held by then, and an exception here would keep it from being released)."""
    try:
        read.deliver(newest_rows(rows))
    except Exception as exc:
        log.debug("history read with the lock not delivered", error=str(exc))


def found(claim: LockedClaim, owner: str | None) -> None:
    """Tell `claim` the owner a try found (`ConversationTaken` for another user's)."""
    if owner is None:  # (three claims in a row met rows deleted under them)
        raise RuntimeError(f"could not claim conversation {claim.conversation_id!r}")
    claim.found(owner)


class PostgresConversationLocks:
    """A `contracts.ConversationLocks` held in PostgreSQL (see the module docstring)."""

    def __init__(self, database: PostgresDatabase, *, lease_seconds: float = LEASE_SECONDS) -> None:
        self.database = database
        self.session = lock_session(lease_seconds)
        """The lock connection's server settings (`lock_session`)."""
        self._local: weakref.WeakValueDictionary[int, asyncio.Lock] = weakref.WeakValueDictionary()
        self._released: dict[int, asyncio.Event] = {}
        self._releasing: dict[int, asyncio.Task[None]] = {}
        """Releases not finished yet, by lock key (the next hold of that key waits for it)."""
        self._unmarking: set[asyncio.Task[None]] = set()
        self._connection: Any = None
        self._guard = asyncio.Lock()
        """One statement at a time on the lock connection (asyncpg requires it)."""
        database.listen(CHANNEL, self._notified)

    async def open(self) -> None:
        """Nothing to do: the lock connection opens on first use."""

    async def aclose(self) -> None:
        if self._releasing or self._unmarking:
            await asyncio.gather(
                *self._releasing.values(), *self._unmarking, return_exceptions=True
            )
        async with self._guard:
            connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 5)

    def carries(self, claim: LockedClaim, read: LockedRead | None) -> bool:
        """`contracts.ClaimingLocks`: a claim on this database's owners, with a read this lock
        makes (one statement does all: `CLAIM_LOCK_RUN`)."""
        return (
            self._serves(read)
            and isinstance(claim.owners, PostgresConversationOwners)
            and claim.owners.database is self.database
        )

    @contextlib.asynccontextmanager
    async def hold(
        self,
        path: str,
        conversation_id: str,
        read: LockedRead | None = None,
        *,
        claim: LockedClaim | None = None,
    ) -> AsyncIterator[None]:
        key = lock_key(path, conversation_id)
        if not self._serves(read):
            read = None
        if claim is not None and not self.carries(claim, read):
            claim = None
        local = self._local.get(key)
        if local is None:
            local = self._local[key] = asyncio.Lock()
        if claim is not None and local.locked() and isinstance(read, HistoryRead):
            # A prompt of this replica holds (or waits for) the conversation: claim now, so
            # the prompt's answer does not wait for it (and store `queued`).
            _got, _session, owner = await self._try(key, read, claim, lock=False)
            found(claim, owner)
        async with local:
            pending = self._releasing.get(key)
            if pending is not None:
                # This replica's previous prompt of the conversation is still releasing it.
                await asyncio.wait([pending])
            session = await self._acquire(key, read, claim)
            end = read.status if read is not None and self._carries(read.status) else None
            if end is not None:
                end.carries_end = True  # (the release stores the run's end)
                end.carries_write = True  # (and the turn, handed: `APPEND_END`)
            try:
                yield
            finally:
                if end is not None:
                    end.carries_write = False  # (a turn written from now on is its writer's)
                self._schedule_release(key, session, end)

    def _schedule_release(self, key: int, session: Any, end: LockedStatus | None = None) -> None:
        task = asyncio.get_running_loop().create_task(
            self._release(key, session, end), name="postgres-lock-release"
        )
        self._releasing[key] = task
        task.add_done_callback(functools.partial(self._released_one, key, end))

    def _released_one(self, key: int, end: LockedStatus | None, task: asyncio.Task[None]) -> None:
        if self._releasing.get(key) is task:
            del self._releasing[key]
        if end is not None:
            end.release_dropped()  # (nothing to do unless it was cancelled before it ran)

    def _serves(self, read: LockedRead | None) -> bool:
        """Whether `read` reads this database's history (the lock's statement can make it)."""
        return (
            isinstance(read, HistoryRead)
            and isinstance(read.backend, PostgresHistory)
            and read.backend.database is self.database
        )

    def _carries(self, status: LockedStatus | None) -> bool:
        """Whether the lock's statement can store `status` (its registry is this database's)."""
        return (
            isinstance(status, LockedStatus)
            and isinstance(status.registry, PostgresRunRegistry)
            and status.registry.database is self.database
        )

    async def _try(
        self, key: int, read: HistoryRead, claim: LockedClaim, *, lock: bool = True
    ) -> tuple[bool, Any, str | None]:
        """One `CLAIM_LOCK_RUN` (trying the lock only with `lock`): whether it took the lock,
        the session, and the owner it found (for `found`, after the statement: a conversation
        another user owns was not locked)."""
        status = read.status if self._carries(read.status) else None
        queue = status is not None and status.stored is None
        run_args = NO_STATUS if status is None else lock_run_args(status.record("running"), queue)
        rows, session = await self._statement(
            CLAIM_LOCK_RUN,
            key,
            lock,
            claim.path,
            claim.conversation_id,
            claim.user,
            time.time(),
            claim.title,
            *lock_newest_args(key, read)[1:],
            *run_args,
            retry=True,
            rows=True,
        )
        head = rows[0]
        got = bool(head["locked"])
        if head["owner_key"] == claim.user and status is not None and (got or queue):
            status.stored = "running" if got else "queued"
        if got:
            deliver(read, rows)
        owner: str | None = head["owner_key"]
        return got, session, owner

    async def _acquire(self, key: int, read: LockedRead | None, claim: LockedClaim | None) -> Any:
        """Take the advisory lock (and make `read`, a `HistoryRead` this lock serves, once it
        is taken, and `claim` in each try); returns the session the lock is held on."""
        # The local lock is held: this is the replica's only waiter for `key`.
        released = self._released[key] = asyncio.Event()
        marked: Any = None
        """The session holding this waiter's mark (`MARK`), once it waited."""
        try:
            while True:
                released.clear()
                owner: str | None = None
                try:
                    if isinstance(read, HistoryRead) and claim is not None:
                        got, session, owner = await self._try(key, read, claim)
                    elif isinstance(read, HistoryRead):
                        status = read.status if self._carries(read.status) else None
                        if status is None:
                            query, args = LOCK_NEWEST, lock_newest_args(key, read)
                        else:
                            queue = status.stored is None
                            query = LOCK_RUN
                            args = (
                                *lock_newest_args(key, read),
                                *lock_run_args(status.record("running"), queue),
                            )
                        rows, session = await self._statement(query, *args, retry=True, rows=True)
                        got = bool(rows[0]["locked"])
                        if status is not None and (got or queue):
                            status.stored = "running" if got else "queued"
                        if got:
                            deliver(read, rows)
                    else:
                        got, session = await self._statement(
                            "SELECT pg_try_advisory_lock($1)", key, retry=True
                        )
                except BaseException:
                    # A try that failed or was cancelled midway may have taken the lock: a
                    # session-level advisory lock outlives the statement that failed after
                    # taking it (`LOCK_NEWEST`'s read), so it is released as after a block
                    # (unlocking a lock not held is a no-op).
                    lost = self._connection
                    if lost is not None and not lost.is_closed():
                        self._schedule_release(key, lost)
                    raise
                if claim is not None:
                    found(claim, owner)  # (another user's: raises, nothing was locked)
                if got:
                    return session
                if marked is None:
                    # Waiting: mark it, so the holder's release sends the `NOTIFY`, then try
                    # again at once (a release between that try and the mark sent none).
                    _value, marked = await self._statement(MARK, *mark_key(key), retry=True)
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(released.wait(), RETRY_SECONDS)
                reraise_cancellation()  # (one `wait_for` swallowed: `_cancel`)
        finally:
            self._released.pop(key, None)
            if marked is not None:
                task = asyncio.get_running_loop().create_task(
                    self._unmark(key, marked), name="postgres-lock-unmark"
                )
                self._unmarking.add(task)
                task.add_done_callback(self._unmarking.discard)

    async def _unmark(self, key: int, session: Any) -> None:
        if session is not self._connection:
            return  # the mark went with its session
        with contextlib.suppress(Exception):
            await self._statement(UNMARK, *mark_key(key), retry=False)

    async def _release(self, key: int, session: Any, end: LockedStatus | None = None) -> None:
        if end is not None:
            await self._end(end)
        if session is not self._connection or session.is_closed():
            return  # the session that held it is gone, and PostgreSQL released the lock with it
        try:
            await self._statement(RELEASE, key, CHANNEL, *mark_key(key), retry=False)
        except Exception as exc:
            fault(log, "conversation lock release failed", exc, every=False)

    async def _end(self, end: LockedStatus) -> None:
        """Store the run's end and the turn it handed (`APPEND_END`, on a pooled connection:
        the lock connection would make every turn of the replica wait for the WAL flush of the
        one before), or the end alone, then tell the run (`wrote`, `released`): the lock is
        freed after that, so the run's last frame does not wait for the unlock. The turn is
        stored whatever happens (alone, if that statement failed), before the lock is freed."""
        stored = False
        write: LockedWrite | None = None
        made: tuple[PostgresHistory, Turn] | None = None
        try:
            record = await end.ending()
            write = end.take_write()
            if write is None and end.handed:
                await end.written()  # (taken back and being stored: it comes first)
            made = self._turn(write)
            if record is not None and (write is None or made is not None):
                if made is None:
                    await end.registry.put(record)
                else:
                    turn = (*made[1], *run_values(record))

                    async def work(connection: Any) -> None:
                        await connection.execute(APPEND_END, *turn)

                    await self.database.run(work)
                    write = None
                    end.wrote(None)
                stored = True
        except Exception as exc:
            # The run stores its end itself (`released(False)`), the turn is stored below.
            fault(log, "a run's end did not ride on its lock's release", exc, every=False)
        finally:
            write = write or end.take_write()  # (a release cancelled before it took it)
            if write is not None:
                # Stored on its own before the lock is freed (the run waits for it): sent again
                # with its write key, a turn `APPEND_END` stored (its reply lost) is stored once.
                await self._store(end, write, made)
            end.no_end()
            end.released(stored)

    def _turn(self, write: LockedWrite | None) -> tuple[PostgresHistory, Turn] | None:
        """The turn `write` holds, if it is one of this database's history (`APPEND_END` can
        store it)."""
        if (
            isinstance(write, HistoryWrite)
            and isinstance(write.backend, PostgresHistory)
            and write.backend.database is self.database
            and write.messages
        ):
            return write.backend, write.backend.turn(write.key, write.messages)
        return None

    async def _store(
        self, end: LockedStatus, write: LockedWrite, made: tuple[PostgresHistory, Turn] | None
    ) -> None:
        """Store the turn handed to the release on its own and tell the run how it went."""
        failure = await end.store_taken(
            made[0].store_turn(made[1]) if made is not None else write.store()
        )
        if failure is not None:
            log.debug("the turn handed to a lock's release was not stored", error=str(failure))

    async def _statement(
        self, query: str, *args: Any, retry: bool, rows: bool = False
    ) -> tuple[Any, Any]:
        """Run `query` on the lock connection (reopened when lost); returns (value, session),
        the value being the first column of the first row, or every row with `rows`."""
        async with self._guard:
            for attempt in range(2):
                if self._connection is None or self._connection.is_closed():
                    if self._connection is not None:
                        log.warning(
                            "PostgreSQL lock connection lost: conversation locks held on it "
                            "were released by the server"
                        )
                    self._connection = None
                    try:
                        self._connection = await asyncpg.connect(
                            self.database.url,
                            timeout=CONNECT_TIMEOUT,
                            server_settings=self.session,
                        )
                    except Exception as exc:
                        raise BackendUnavailable(
                            f"PostgreSQL is unavailable ({VARIABLE}): {self.database.scrub(exc)}"
                        ) from None
                session = self._connection
                try:
                    try:
                        if rows:
                            return await session.fetch(query, *args), session
                        return await session.fetchval(query, *args), session
                    except CLIENT_ERRORS as exc:
                        if connection_lost(exc, session):
                            raise ConnectionError(str(exc)) from exc
                        raise
                except DISCONNECTS as exc:
                    session.terminate()
                    if attempt or not retry:
                        raise BackendUnavailable(
                            f"PostgreSQL is unavailable ({VARIABLE}): {self.database.scrub(exc)}"
                        ) from None
            raise AssertionError("unreachable")

    def _notified(self, payload: str) -> None:
        try:
            key = int(payload)
        except ValueError:
            return
        released = self._released.get(key)
        if released is not None:
            released.set()
