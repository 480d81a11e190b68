"""`RedisConversationLocks`: one prompt at a time per conversation, across every replica.

A conversation's lock is a Redis key holding a random token, set with `NX` and a TTL
(redis-py's `Lock`: its release and extension are scripts that act only while the token is
still ours, so a replica never frees a lock another one took over). While the block runs, a
renewal task extends the TTL every third of it; a replica that dies stops renewing and its
locks lapse after `ttl` seconds, so the conversation is never stuck.

Prompts of one conversation on the same replica queue on an `asyncio.Lock` first, so they never
poll Redis against each other; only prompts on different replicas poll (every `poll` seconds,
the driver's way).

When the run offers its first history read (`memory.history.HistoryRead` on a `RedisHistory`
of this connection), each try is one script that takes the lock and, if it got it, reads the
history (`RedisHistory.lock_and_read`): the turn saves the history read's round trip, and the
read still happens under the lock (a script runs alone). Either way the token is the driver's
kind, so renewal and release stay redis-py's `Lock` scripts.

The release runs in a task of its own: the run does not wait for that round trip (its
`complete` frame leaves sooner). The next prompt of the conversation on this replica waits for
the release first (so it never polls against its own replica's lock); a prompt on another
replica may find the lock still taken for that round trip and polls as it would anyway. The
releases still running when the pool closes are finished first (`RedisConnection.on_close`).

The key is `lock:{digest(path, conversation)}`; `RedisHistory`'s cap reads it to never evict a
conversation a run is using on any replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
import weakref
from collections.abc import AsyncIterator

from redis.asyncio.lock import Lock
from redis.exceptions import LockError, RedisError

from ..._contracts import LockedRead
from ..._log import get_logger
from ..._memory.history import HistoryRead
from .connection import RedisConnection, lock_key
from .history import RedisHistory

log = get_logger(__name__)

LOCK_TTL = 20.0
"""Seconds a lock outlives its holder's last renewal (a killed replica's locks lapse then)."""
POLL = 0.02
"""Seconds between two attempts while another replica holds the lock."""


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
        connection.on_close(self.drain)

    def __repr__(self) -> str:
        return f"RedisConversationLocks({self.connection!r})"

    def _local_lock(self, key: str) -> asyncio.Lock:
        lock = self._local.get(key)
        if lock is None:
            lock = self._local[key] = asyncio.Lock()
        return lock

    @contextlib.asynccontextmanager
    async def hold(
        self, path: str, conversation_id: str, read: LockedRead | None = None
    ) -> AsyncIterator[None]:
        key = lock_key(self.connection, path, conversation_id)
        async with self._local_lock(key):
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
            with self.connection.unavailable("taking the conversation's lock"):
                if isinstance(read, HistoryRead) and self._serves(read):
                    await self._acquire_reading(key, lock, read)
                else:
                    await lock.acquire()
            renewal = asyncio.get_running_loop().create_task(
                self._renew(lock, path, conversation_id), name="redis-lock-renewal"
            )
            try:
                yield
            finally:
                renewal.cancel()
                task = asyncio.get_running_loop().create_task(
                    self._release(lock, renewal, conversation_id), name="redis-lock-release"
                )
                self._releasing[key] = task
                task.add_done_callback(functools.partial(self._released_one, key))

    def _serves(self, read: HistoryRead) -> bool:
        """Whether `read` reads a history on this lock's Redis (one script can make both)."""
        return isinstance(read.backend, RedisHistory) and read.backend.connection is self.connection

    async def _acquire_reading(self, key: str, lock: Lock, read: HistoryRead) -> None:
        """`lock.acquire()` (a random token, `SET NX PX`, a retry every `poll` seconds), each
        try also making `read` if it takes the lock."""
        assert isinstance(read.backend, RedisHistory)
        token = uuid.uuid4().hex.encode()
        ttl_ms = int(self.ttl * 1000)
        while True:
            try:
                got = await read.backend.lock_and_read(key, token, ttl_ms, read)
            except BaseException:
                # A script keeps the writes it made before an error (its `SET`, if its read
                # then failed), and a cancelled try may have run: free the lock if it holds
                # our token (the release script checks), as after a block.
                lock.local.token = token
                task = asyncio.get_running_loop().create_task(
                    self._free(lock), name="redis-lock-release"
                )
                self._releasing[key] = task
                task.add_done_callback(functools.partial(self._released_one, key))
                raise
            if got:
                lock.local.token = token
                return
            await asyncio.sleep(self.poll)  # another replica's lock: polled, as `Lock` does

    async def _free(self, lock: Lock) -> None:
        with contextlib.suppress(LockError, RedisError, OSError):
            await lock.release()

    def _released_one(self, key: str, task: asyncio.Task[None]) -> None:
        if self._releasing.get(key) is task:
            del self._releasing[key]

    async def drain(self) -> None:
        """Wait for the releases still running (before the pool closes)."""
        if self._releasing:
            await asyncio.gather(*self._releasing.values(), return_exceptions=True)

    async def _release(self, lock: Lock, renewal: asyncio.Task[None], conversation_id: str) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await renewal
        try:
            await lock.release()
        except (LockError, RedisError, OSError) as exc:
            # Lapsed (Redis was away longer than the TTL) or unreachable: the TTL frees it
            # either way; the run itself is over.
            log.warning(
                "conversation lock not released cleanly; it lapses by itself",
                conversation=conversation_id,
                error=self.connection.scrub(exc),
            )

    async def _renew(self, lock: Lock, path: str, conversation_id: str) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await lock.reacquire()
            except (LockError, RedisError, OSError) as exc:
                log.warning(
                    "could not renew a conversation lock; another replica may take it "
                    "after its TTL",
                    endpoint=path,
                    conversation=conversation_id,
                    error=self.connection.scrub(exc),
                )
