"""The embedded `contracts.ConversationLocks`: one `asyncio.Lock` per conversation, one process."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator

from .._contracts import LockedRead


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

    @contextlib.asynccontextmanager
    async def hold(
        self, path: str, conversation_id: str, read: LockedRead | None = None
    ) -> AsyncIterator[None]:
        """Hold the conversation's lock; `read` is left to its reader (the read is local)."""
        async with self.lock(path, conversation_id):
            yield
