"""The embedded `contracts.ConversationLocks`: one `asyncio.Lock` per conversation, one process.

It carries a prompt's owner claim (`contracts.LockedClaim`): the claim is made once the lock is
taken, so a deletion (which forgets the owner under the same lock) is either wholly before it
(the id is unused: the prompt claims it again) or wholly after the run. A prompt that finds the
lock taken claims once before it waits too, so its answer (its stream, or a 404) does not wait
for the run ahead of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref

from .._contracts import LockedClaim, LockedRead


class InProcessConversationLocks:
    """Prompts of one conversation run one at a time in this process.

    Locks are kept weakly: a conversation nobody is prompting costs nothing.
    """

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def lock(self, path: str, conversation_id: str) -> asyncio.Lock:
        key = (path, conversation_id)
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        return lock

    def carries(self, claim: LockedClaim, read: LockedRead | None) -> bool:
        """`contracts.ClaimingLocks`: every claim (the lock calls its owners' store itself)."""
        return True

    def hold(
        self,
        path: str,
        conversation_id: str,
        read: LockedRead | None = None,
        *,
        claim: LockedClaim | None = None,
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold the conversation's lock; `read` is left to its reader (the read is local);
        `claim` is made as the module docstring says."""
        return _Hold(self.lock(path, conversation_id), claim)


class _Hold:
    """One hold of a conversation's lock: a class rather than a generator-based context
    manager, which a run in flight would keep as four objects (with its generator) for as long
    as it runs."""

    __slots__ = ("_claim", "_lock")

    def __init__(self, lock: asyncio.Lock, claim: LockedClaim | None) -> None:
        self._lock = lock
        self._claim = claim

    async def __aenter__(self) -> None:
        lock, claim = self._lock, self._claim
        if claim is not None and lock.locked():
            await _claim(claim)
        await lock.acquire()
        if claim is not None:
            self._claim = None  # (made: a run in flight keeps no claim)
            try:
                await _claim(claim)
            except BaseException:
                lock.release()
                raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._lock.release()


async def _claim(claim: LockedClaim) -> None:
    claim.found(
        await claim.owners.claim(claim.path, claim.conversation_id, claim.user, claim.title)
    )
