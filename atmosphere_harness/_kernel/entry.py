"""A prompt's entry into its conversation: the owner claim and the conversation's lock, one step.

A conversation belongs to the user whose prompt first used its id (`kernel.owners`). A prompt
claims the id as it takes the conversation's lock: where the lock's store also holds the owners
(the embedded lock, PostgreSQL, Redis: `contracts.ClaimingLocks`) the claim is made in the lock's
own round trip (`contracts.LockedClaim`), in its first try and again in the try that takes it.
So the claim costs a turn no round trip of its own, and a deletion (which forgets the owner under
the same lock) is wholly before or wholly after the prompt: a prompt that waited for the lock
while its conversation was deleted finds the id unused and claims it again (as any prompt on an
unused id does), or finds another user's prompt claimed it meanwhile and ends with a
`ConversationTaken` error frame, having run and written nothing.

A streamed prompt answers 404 before its response starts when the conversation is another
user's, so its entry (`Entry`) begins in the route: the lock's first try is made there (with
the run's first history read and its status, as every first try is), and the route waits for
its claim only. The run starts afterwards and waits for the lock through the entry. A lock
that cannot claim (an application's own `ConversationLocks`) gets a claim of its own first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Generic, TypeGuard, TypeVar

from .._contracts import (
    ClaimingLocks,
    ConversationLocks,
    LockedClaim,
    LockedRead,
    LockedReader,
    Run,
    user_key,
)

if TYPE_CHECKING:
    from .control import RunTicket
    from .owners import ConversationAccess

R = TypeVar("R", bound=Run)


def offered_read(
    reader: LockedReader | None, run: Run, ticket: RunTicket | None
) -> LockedRead | None:
    """The run's first history read to offer its lock (with the run's status riding on it),
    or `None` when its history (`reader`, the endpoint's) cannot be read that way."""
    read = reader.locked_read(run) if reader is not None else None
    if ticket is not None:
        ticket.offer(read)  # (the run's status may ride with the read)
    return read


def carried(
    locks: ConversationLocks, claim: LockedClaim, read: LockedRead | None
) -> TypeGuard[ClaimingLocks]:
    """Whether `locks` claims the conversation as it takes the lock."""
    return isinstance(locks, ClaimingLocks) and locks.carries(claim, read)


def hold(
    locks: ConversationLocks, run: Run, read: LockedRead | None, claim: LockedClaim | None
) -> contextlib.AbstractAsyncContextManager[None]:
    """The run's conversation lock, with `read` (only passed when there is one, so a
    `ConversationLocks` of the application's own needs no parameter for it) and `claim` (only
    passed to a lock that carries it; another lock ignores it)."""
    path, conversation_id = run.endpoint.path, run.conversation_id
    if claim is not None and carried(locks, claim, read):
        return locks.hold(path, conversation_id, read, claim=claim)
    if read is None:
        return locks.hold(path, conversation_id)
    return locks.hold(path, conversation_id, read)


@contextlib.asynccontextmanager
async def take_lock(
    locks: ConversationLocks,
    access: ConversationAccess,
    reader: LockedReader | None,
    run: Run,
    ticket: RunTicket | None,
    *,
    message: str | None,
) -> AsyncIterator[None]:
    """Hold the run's conversation lock for the block (a run begun without an `Entry`); with
    `message` (a prompt's run, claimed by its route already) the lock's tries claim the
    conversation again as they take it, where the lock can."""
    read = offered_read(reader, run, ticket)
    claim = None
    if message is not None:
        claim = access.locked_claim(run.endpoint.path, run.conversation_id, run.user_id, message)
    async with hold(locks, run, read, claim):
        yield


class Entry(Generic[R]):
    """A streamed prompt's claim and lock, begun before its response starts
    (`enter_conversation`)."""

    def __init__(
        self, locks: ConversationLocks, run: R, ticket: RunTicket, read: LockedRead | None
    ) -> None:
        self.run = run
        self.ticket = ticket
        """The run's control (its first status rides on the lock's first try)."""
        self.read = read
        """The run's first history read, offered to the lock (`None`: the run reads itself)."""
        self._locks = locks
        loop = asyncio.get_running_loop()
        self._decided: asyncio.Future[str] = loop.create_future()
        self._held: asyncio.Future[None] = loop.create_future()
        self._lock: contextlib.AbstractAsyncContextManager[None] | None = None
        """The conversation's lock once taken, until it is freed (`close`)."""
        self._task: asyncio.Task[None] | None = None
        """Taking the lock, then freeing it: neither is kept while the run holds the lock (a
        run in flight keeps no task of its entry)."""
        self._takes = False
        """Whether the entry takes the lock (`_begin`); else (a lock that cannot claim) the
        run takes it."""

    def _begin(self, claim: LockedClaim) -> None:
        """Start taking the lock in a task of its own (it outlives the route's handler)."""
        claim.decided = self._decide
        self._takes = True
        self._task = asyncio.get_running_loop().create_task(
            self._take(claim), name=f"entry:{self.run.endpoint.path}"
        )

    def _decide(self, owner: str) -> None:
        if not self._decided.done():
            self._decided.set_result(owner)

    async def _take(self, claim: LockedClaim) -> None:
        """Take the lock (its first try decides the claim); it stays taken past this task,
        until `close` frees it."""
        lock = hold(self._locks, self.run, self.read, claim)
        try:
            await lock.__aenter__()
        except BaseException as exc:
            for future in (self._decided, self._held):
                if future.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
                    future.exception()  # (marked retrieved: whoever waits has it raised)
            if not isinstance(exc, Exception):
                raise
            return
        self._lock = lock
        self._task = None  # (done: a finished task keeps its coroutine)
        self._held.set_result(None)

    async def owner(self) -> str:
        """The owner the first claim found (raises what made it fail: `BackendUnavailable`)."""
        await asyncio.wait([self._decided])
        return self._decided.result()

    def holding(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The run's block under the lock: waits until the lock is taken (raising what made
        taking it fail), frees it after. The entry itself, when its task takes the lock (no
        generator-based context manager a run in flight would keep)."""
        if not self._takes:
            return hold(self._locks, self.run, self.read, None)
        return self

    async def __aenter__(self) -> None:
        try:
            await asyncio.wait([self._held])
            self._held.result()
        except BaseException:
            await self._free()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        await self._free()

    async def _free(self) -> None:
        self.close()
        task = self._task
        if task is not None and not task.done():
            await asyncio.wait([task])

    def close(self) -> None:
        """Free the lock (or stop taking it): the run ended, or never started. The lock is
        freed in a task of its own, which `holding` waits for."""
        if self._task is not None and not self._held.done():
            self._task.cancel()
        lock, self._lock = self._lock, None
        if lock is not None:
            self._task = asyncio.get_running_loop().create_task(
                _leave(lock), name=f"entry-free:{self.run.endpoint.path}"
            )

    def abandon(self) -> None:
        """The run will never start (its response never streamed): free the lock, and end the
        run's status its lock's first try stored."""
        self.close()
        status = self.read.status if self.read is not None else None
        if status is not None and status.stored is not None:
            self.ticket.finish("cancelled")


async def _leave(lock: contextlib.AbstractAsyncContextManager[None]) -> None:
    """Leave the lock's block: what went wrong there is the lock's to report (its release is
    retried or logged by the lock), not the run's."""
    with contextlib.suppress(Exception):
        await lock.__aexit__(None, None, None)


async def enter_conversation(
    locks: ConversationLocks,
    access: ConversationAccess,
    reader: LockedReader | None,
    run: R,
    ticket: RunTicket,
    message: str,
) -> Entry[R] | None:
    """Begin `run`'s entry into its conversation (see the module docstring): `None` when the
    conversation is another user's (answer 404; nothing ran or was stored). `reader` is the
    endpoint's `locked_reader`."""
    read = offered_read(reader, run, ticket)
    path, conversation_id, user_id = run.endpoint.path, run.conversation_id, run.user_id
    entry = Entry(locks, run, ticket, read)
    claim = access.locked_claim(path, conversation_id, user_id, message)
    if not carried(locks, claim, read):
        if not await access.claim(path, conversation_id, user_id, message):
            return None
        return entry  # (the run takes the lock)
    entry._begin(claim)
    try:
        owner = await entry.owner()
    except BaseException:
        entry.close()
        raise
    if owner != user_key(user_id):
        entry.close()
        return None
    return entry
