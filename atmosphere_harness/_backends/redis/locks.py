"""`RedisConversationLocks`: one prompt at a time per conversation, across every replica.

A conversation's lock is a Redis key holding a random token, set with `NX` and a TTL
(redis-py's `Lock`: its release and extension are scripts that act only while the token is
still ours, so a replica never frees a lock another one took over). The TTL is the durable-runs
lease (`ATMOSPHERE_DURABLE_RUNS_LEASE_SECONDS`, 15 s by default): while the block runs, a
renewal task extends it every third of it, so a replica that dies stops renewing and its locks
lapse within one lease, as its runs' leases do; the replica that takes a run over is then not
kept waiting for the conversation longer than for the run.

If Redis is away longer than the TTL, the lock lapses under its holder: the renewal takes it
back if nobody else has, and otherwise says once (WARN) that another replica took the
conversation over (mutual exclusion was interrupted; the run goes on, as on PostgreSQL when
its lock connection drops).

Prompts of one conversation on the same replica queue on an `asyncio.Lock` first, so they never
poll Redis against each other; only prompts on different replicas poll (every `poll` seconds,
the driver's way).

When the run offers its first history read (`memory.history.HistoryRead` on a `RedisHistory`
of this connection), each try is one script that takes the lock and, if it got it, reads the
history (`RedisHistory.lock_and_read`): the turn saves the history read's round trip, and the
read still happens under the lock (a script runs alone). When the run's status is offered with
the read (`contracts.LockedStatus`, of this connection's `RedisRunRegistry`), the same script
stores it (`running`, or `queued` on the first try that finds the lock taken). When a prompt's
owner claim is offered too (`contracts.LockedClaim`, on this connection's
`RedisConversationOwners`), each try is `RedisHistory.claim_lock_and_read`, which claims the
conversation first and, for another user's, stops there (`ConversationTaken`, nothing locked
or stored); a prompt that finds this replica's local lock taken claims at once with that
script, told not to try the lock, so its answer does not wait. Either way the token is the
driver's kind, so renewal and release stay redis-py's `Lock` scripts.

The release runs in a task of its own: the run does not wait for that round trip (its
`complete` frame leaves sooner), unless the lock's script stored the run's status: then the
release waits for the run's end (`contracts.LockedStatus.end`) and stores it in the same
script (`_RELEASE_RUN`), which the run waits for before its last frame, so the end and the
unlock cost one round trip. While its block runs, such a lock also takes the run's turn
(`contracts.LockedStatus.hand`, from `ConversationMemory`): the release stores the turn, the end
and the unlock in one script (`_APPEND_RELEASE_RUN`), the turn first. If that script fails (or
its reply is lost), or the end does not come in time, the release stores the turn on its own
(`RedisHistory.store_turn`, with the turn's write key: stored once) before it frees the lock,
and tells the run how it went (`LockedStatus.wrote`). A release that cannot reach Redis is
tried again (backing off up to a second) until the lock would have lapsed anyway, so after an
outage the conversation is free as soon as Redis is back, not a lease later. The next prompt of
the conversation on this replica waits for the release first (so it never polls against its
own replica's lock); a prompt on another replica may find the lock still taken for that round
trip and polls as it would anyway. When the pool closes, the releases still running get
`DRAIN_SECONDS` to finish.

The acquisition loop and the renewal end when their task is cancelled, even when the driver
swallowed the cancellation (`_cancel.reraise_cancellation`): a stopped run never goes on
waiting for, taking or renewing a lock.

The key is `lock:{digest(path, conversation)}`; `RedisHistory`'s cap reads it to never evict a
conversation a run is using on any replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import uuid
import weakref
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from redis.asyncio.lock import Lock
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import LockError, LockNotOwnedError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..._cancel import reraise_cancellation
from ..._contracts import LockedClaim, LockedRead, LockedStatus, LockedWrite
from ..._errors import ConversationTaken
from ..._log import fault, get_logger
from ..._memory.history import HistoryRead, HistoryWrite
from .connection import RedisConnection, lock_key
from .control import PUT_RECORD, RedisRunRegistry, status_keys_args
from .history import APPEND_FUNCTION, RedisHistory, Turn
from .owners import RedisConversationOwners

log = get_logger(__name__)

LOCK_TTL = 15.0
"""Seconds a lock outlives its holder's last renewal (a killed replica's locks lapse then):
the default durable-runs lease; `redis_backends` passes the configured one."""
POLL = 0.02
"""Seconds between two attempts while another replica holds the lock."""
RELEASE_BACKOFF = (0.05, 0.1, 0.25, 0.5, 1.0)
"""Seconds between the tries of a release that could not reach Redis (the last one repeats)."""
DRAIN_SECONDS = 5.0
"""How long closing the pool waits for the releases still running (then they are cancelled:
their locks lapse by themselves)."""
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)

_RELEASE_RUN = (
    PUT_RECORD
    + """
put_record(KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3], ARGV[4])
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    return 1
end
return 0
"""
)
"""The lock's release (as redis-py's, only while the key holds our token) that first stores
the run's end in its status record, as `RedisRunRegistry.put` does
(`contracts.LockedStatus.end`): the run's end and the unlock are one round trip."""
# KEYS: the lock, then `control.status_keys_args`'s. ARGV: the token, then its arguments.

_APPEND_RELEASE_RUN = (
    PUT_RECORD
    + APPEND_FUNCTION
    + """
local ours = redis.call('GET', KEYS[1]) == ARGV[1]
local stored = append_turn(KEYS[5], KEYS[6], KEYS[7], KEYS[8], 4)
put_record(KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3], ARGV[4])
if ours then redis.call('DEL', KEYS[1]) end
return {ours and 1 or 0, stored[2]}
"""
)
"""`_RELEASE_RUN` that first stores the run's turn, as `RedisHistory.append` does (the
turn handed to the release, `contracts.LockedStatus.hand`): the turn, the run's end and the
unlock are one round trip, in that order, and the script runs alone, so no replica can take the
lock and read the history without the turn. Everything it checks (whose the lock is, whether
the turn is stored already) is read before its first write; a turn stored under a lock that
lapsed and another replica took is stored all the same, as `append` would (the lock is then
left to its holder). `{whether the lock was ours, conversations kept}`."""
# KEYS: the lock, `control.status_keys_args`'s, `RedisHistory.turn`'s. ARGV: the token,
# `status_keys_args`'s arguments, then `turn`'s.


__all__ = ["LOCK_TTL", "POLL", "RedisConversationLocks", "lock_key"]


class RedisConversationLocks:
    """A `contracts.ConversationLocks` shared by every replica on one Redis."""

    def __init__(
        self, connection: RedisConnection, *, ttl: float = LOCK_TTL, poll: float = POLL
    ) -> None:
        if ttl <= 0 or poll <= 0:
            raise ValueError("lock ttl and poll must be positive")
        self.connection = connection
        self.ttl = ttl
        self.poll = poll
        self._local: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._releasing: dict[str, asyncio.Task[None]] = {}
        """Releases not finished yet, by lock key (the next hold of that key waits for it)."""
        self._release_run = connection.script(_RELEASE_RUN)
        self._append_release_run = connection.script(_APPEND_RELEASE_RUN)
        connection.on_close(self.drain)

    def __repr__(self) -> str:
        return f"RedisConversationLocks({self.connection!r})"

    def _local_lock(self, key: str) -> asyncio.Lock:
        lock = self._local.get(key)
        if lock is None:
            lock = self._local[key] = asyncio.Lock()
        return lock

    def carries(self, claim: LockedClaim, read: LockedRead | None) -> bool:
        """`contracts.ClaimingLocks`: a claim on this Redis's owners, with a read this lock
        makes (one script does all: `RedisHistory.claim_lock_and_read`)."""
        return (
            isinstance(read, HistoryRead)
            and self._serves(read)
            and isinstance(claim.owners, RedisConversationOwners)
            and claim.owners.connection is self.connection
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
        key = lock_key(self.connection, path, conversation_id)
        if claim is not None and not self.carries(claim, read):
            claim = None
        local = self._local_lock(key)
        if claim is not None and local.locked() and isinstance(read, HistoryRead):
            # A prompt of this replica holds (or waits for) the conversation: claim now, so
            # the prompt's answer does not wait for it (and store `queued`).
            with self.connection.unavailable("claiming the conversation"):
                await self._try(key, b"", 0, read, claim, try_lock=False)
        async with local:
            pending = self._releasing.get(key)
            if pending is not None:
                await asyncio.wait([pending])
            lock = Lock(
                self.connection.client,
                key,
                timeout=self.ttl,
                sleep=self.poll,
                thread_local=False,
                raise_on_release_error=False,
            )
            served = read if isinstance(read, HistoryRead) and self._serves(read) else None
            with self.connection.unavailable("taking the conversation's lock"):
                await self._acquire(key, lock, served, claim)
            renewal = asyncio.get_running_loop().create_task(
                self._renew(lock, path, conversation_id), name="redis-lock-renewal"
            )
            end = served.status if served is not None and self._carries(served.status) else None
            if end is not None:
                end.carries_end = True  # (the release stores the run's end: `_RELEASE_RUN`)
                end.carries_write = True  # (and the turn, handed: `_APPEND_RELEASE_RUN`)
            try:
                yield
            finally:
                if end is not None:
                    end.carries_write = False  # (a turn written from now on is its writer's)
                renewal.cancel()
                self._schedule(key, self._release(lock, renewal, conversation_id, end), end)

    def _serves(self, read: HistoryRead) -> bool:
        """Whether `read` reads a history on this lock's Redis (one script can make both)."""
        return isinstance(read.backend, RedisHistory) and read.backend.connection is self.connection

    def _carries(self, status: LockedStatus | None) -> bool:
        """Whether the lock's script can store `status` (its registry is on this Redis)."""
        return (
            isinstance(status, LockedStatus)
            and isinstance(status.registry, RedisRunRegistry)
            and status.registry.connection is self.connection
        )

    async def _try(
        self,
        key: str,
        token: bytes,
        ttl_ms: int,
        read: HistoryRead,
        claim: LockedClaim,
        *,
        try_lock: bool = True,
    ) -> bool:
        """One claiming try (`RedisHistory.claim_lock_and_read`): whether it took the lock.
        The owner it found goes to `claim`, which raises `ConversationTaken` for another
        user's conversation (not locked then)."""
        assert isinstance(read.backend, RedisHistory)
        assert isinstance(claim.owners, RedisConversationOwners)
        got, owner = await read.backend.claim_lock_and_read(
            key,
            token,
            ttl_ms,
            read,
            claim.owners.claim_keys_args(claim),
            status=self._carries(read.status),
            try_lock=try_lock,
        )
        claim.found(owner)
        return got

    async def _acquire(
        self, key: str, lock: Lock, read: HistoryRead | None, claim: LockedClaim | None
    ) -> None:
        """Take `lock` with a random token (`SET NX PX`, a retry every `poll` seconds, as
        `Lock.acquire` does), each try also making `read` if it takes the lock (and `claim`,
        first, in the same script)."""
        token = uuid.uuid4().hex.encode()
        ttl_ms = int(self.ttl * 1000)
        while True:
            try:
                if read is not None and claim is not None:
                    got = await self._try(key, token, ttl_ms, read, claim)
                elif read is not None:
                    assert isinstance(read.backend, RedisHistory)
                    if self._carries(read.status):
                        got = await read.backend.lock_and_read(
                            key, token, ttl_ms, read, status=True
                        )
                    else:
                        got = await read.backend.lock_and_read(key, token, ttl_ms, read)
                else:
                    got = await lock.do_acquire(token)
                reraise_cancellation()
            except ConversationTaken:
                raise  # (nothing was locked)
            except BaseException:
                # A script keeps the writes it made before an error (its `SET`, if its read
                # then failed), and a cancelled try may have run: free the lock if it holds
                # our token (the release script checks), as after a block.
                lock.local.token = token
                self._schedule(key, self._free(lock))
                raise
            if got:
                lock.local.token = token
                return
            await asyncio.sleep(self.poll)  # another replica's lock: polled, as `Lock` does

    def _schedule(
        self, key: str, release: Coroutine[Any, Any, None], end: LockedStatus | None = None
    ) -> None:
        task = asyncio.get_running_loop().create_task(release, name="redis-lock-release")
        self._releasing[key] = task
        task.add_done_callback(functools.partial(self._released_one, key, end))

    async def _free(self, lock: Lock) -> None:
        with contextlib.suppress(LockError, RedisError, OSError):
            await lock.release()

    def _released_one(self, key: str, end: LockedStatus | None, task: asyncio.Task[None]) -> None:
        if self._releasing.get(key) is task:
            del self._releasing[key]
        if end is not None:
            end.release_dropped()  # (nothing to do unless it was cancelled before it ran)

    async def drain(self) -> None:
        """Let the releases still running finish (before the pool closes), for at most
        `DRAIN_SECONDS`; those left are cancelled (their locks lapse by themselves)."""
        if not self._releasing:
            return
        tasks = list(self._releasing.values())
        _done, left = await asyncio.wait(tasks, timeout=DRAIN_SECONDS)
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=DRAIN_SECONDS)

    def _turn(self, write: LockedWrite | None) -> tuple[RedisHistory, Turn] | None:
        """The turn `write` holds, if it is one of a history on this lock's Redis (one script
        can store it with the release)."""
        if (
            isinstance(write, HistoryWrite)
            and isinstance(write.backend, RedisHistory)
            and write.backend.connection is self.connection
            and write.messages
        ):
            return write.backend, write.backend.turn(write.key, write.messages)
        return None

    async def _release(
        self,
        lock: Lock,
        renewal: asyncio.Task[None],
        conversation_id: str,
        end: LockedStatus | None = None,
    ) -> None:
        await asyncio.wait([renewal])
        if end is not None:
            stored = False
            write: LockedWrite | None = None
            turn: tuple[RedisHistory, Turn] | None = None
            try:
                record = await end.ending()
                write = end.take_write()
                if write is None and end.handed:
                    await end.written()  # (taken back and being stored: it comes first)
                token = lock.local.token
                turn = self._turn(write)
                if record is not None and token is not None and (write is None or turn):
                    keys, args = status_keys_args(self.connection, record)
                    if turn is None:
                        await self._release_run(keys=[lock.name, *keys], args=[token, *args])
                    else:
                        history, made = turn
                        _ours, kept = await self._append_release_run(
                            keys=[lock.name, *keys, *made.keys], args=[token, *args, *made.args]
                        )
                        write = None
                        end.wrote(None)
                        await self._make_room(history, made, int(kept))
                    stored = True
                    lock.local.token = None
                    return  # (freed, or lapsed and another holder's: left to it)
            except Exception as exc:
                log.debug("a run's end did not ride on its lock's release", error=str(exc))
            finally:
                write = write or end.take_write()  # (a release stopped before it took it)
                if write is not None:
                    # Stored on its own before the lock is freed (the run waits for it), as the
                    # run would have stored it: sent again with its write key, a turn the
                    # script above stored (its reply lost) is stored once.
                    await self._store(end, write, turn)
                end.no_end()
                end.released(stored)
        loop = asyncio.get_running_loop()
        lapses = loop.time() + self.ttl
        """When the lock lapses by itself at the latest (the last renewal was before now)."""
        for attempt in itertools.count():
            try:
                await lock.release()
                return
            except LockNotOwnedError:
                return  # lapsed while Redis was away (the renewal said so) or never taken
            except UNREACHABLE as exc:
                delay = RELEASE_BACKOFF[min(attempt, len(RELEASE_BACKOFF) - 1)]
                if loop.time() + delay < lapses:
                    await asyncio.sleep(delay)
                    continue
                error: BaseException = exc
            except (LockError, RedisError) as exc:
                error = exc
            fault(
                log,
                "conversation lock not released; it lapses by itself",
                error,
                every=False,
                scrub=self.connection.scrub,
                conversation=conversation_id,
            )
            return

    async def _store(
        self, end: LockedStatus, write: LockedWrite, turn: tuple[RedisHistory, Turn] | None
    ) -> None:
        """Store the turn handed to the release on its own and tell the run how it went."""
        failure = await end.store_taken(
            turn[0].store_turn(turn[1]) if turn is not None else write.store()
        )
        if failure is not None:
            log.debug("the turn handed to a lock's release was not stored", error=str(failure))

    async def _make_room(self, history: RedisHistory, turn: Turn, kept: int) -> None:
        """Past the conversation cap after a turn the release stored, make room
        (`RedisHistory.stored`); the turn is stored whatever this does."""
        try:
            await history.stored(turn, kept)
        except Exception as exc:
            fault(
                log,
                "could not delete conversations past the cap; the next turn tries again",
                exc,
                every=False,
                scrub=self.connection.scrub,
            )

    async def _renew(self, lock: Lock, path: str, conversation_id: str) -> None:
        """Extend the lock every third of its TTL while the block runs. A lock that lapsed
        (Redis was away longer than the TTL) is taken back with the same token if it is
        free; one another replica took meanwhile is left to it (said once)."""
        failing = False
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                try:
                    await lock.reacquire()
                except LockNotOwnedError:
                    token = lock.local.token
                    if token is None or not await lock.do_acquire(token):
                        reraise_cancellation()
                        log.warning(
                            "a conversation lock lapsed and another replica took it: two "
                            "prompts of the conversation may run at once",
                            endpoint=path,
                            conversation=conversation_id,
                        )
                        return
                reraise_cancellation()
            except (LockError, RedisError, OSError) as exc:
                if not failing:
                    fault(
                        log,
                        "could not renew a conversation lock; retrying (another replica may "
                        "take it once it lapses)",
                        exc,
                        every=False,
                        scrub=self.connection.scrub,
                        endpoint=path,
                        conversation=conversation_id,
                        ttl=self.ttl,
                    )
                failing = True
                continue
            failing = False
