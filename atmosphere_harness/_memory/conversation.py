"""`ConversationMemory`: an endpoint's multi-turn history, as the loop loads and stores it.

It is the endpoint's `HistoryStore`: `load(run)` returns the compacted view of the run's
conversation, `append(run, turn)` stores the finished turn in full. It is also injectable into a
`@prompt` method, for code that wants to read or clear a conversation itself.

Where the run's conversation lock can store the turn with its release (`contracts.LockedStatus.
hand`: the Redis lock, whose release stores the turn, the run's end and the unlock in one
script, and the PostgreSQL lock, whose release stores the turn and the end in one statement),
`append` hands the turn to it instead of storing it, and the run's end waits for it.
Anything this memory does next with that conversation (a second `load` of the run, a `view`, a
`clear`, ...) takes the turn back and stores it first, so every read through it sees the turn.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._contracts import Key
from .._runtimes.base import Message
from .compaction import CompactionStrategy, SlidingWindowCompaction, Summary
from .history import ConversationKey, HistoryBackend, HistoryRead, HistoryWrite, InMemoryHistory

if TYPE_CHECKING:
    from .._contracts import Run

DEFAULT_MAX_HISTORY = 20
MAX_UNSUMMARIZED = 500
"""Messages after the summary checkpoint read per load (bounds a strategy switch on old data)."""

_LOCKED_READ: Key[HistoryRead] = Key("memory.history.locked-read")
_HANDOFF: Key[HistoryRead] = Key("memory.history.handoff")
"""Run state: the read offered to the run's lock, kept for the whole run (its `status` may
take the run's turn: `contracts.LockedStatus.hand`)."""


class ConversationMemory:
    """History plus compaction for one endpoint.

    Example:
        ```python
        @agent(name="notes")
        class Notes:
            @prompt
            async def chat(self, message: str, session: StreamingSession,
                           memory: ConversationMemory) -> None:
                if message == "/forget":
                    await memory.clear(session.conversation_id, session.user_id)
                    await session.send("Forgotten.")
                    return
                await session.stream(message)
        ```
    """

    def __init__(
        self,
        backend: HistoryBackend | None = None,
        *,
        endpoint: str = "",
        max_messages: int = DEFAULT_MAX_HISTORY,
        strategy: CompactionStrategy | None = None,
    ) -> None:
        if max_messages < 2:
            raise ValueError(f"maxMessages must be >= 2, got {max_messages}")
        self.backend: HistoryBackend = backend if backend is not None else InMemoryHistory()
        self.endpoint = endpoint
        self.max_messages = max_messages
        self.strategy: CompactionStrategy = strategy or SlidingWindowCompaction()
        self.on_load: list[Callable[[Run], None]] = []
        """Called as a run's load starts, to start reads that need not wait for the history
        (the long-term-memory recall of the user's facts: `LongTermMemoryInterceptor.prefetch`);
        with a read offered to the lock (`locked_read`), already as the lock is taken. A hook
        does its work once per run (it is called again at each load)."""
        self._offered: weakref.WeakSet[HistoryRead] = weakref.WeakSet()
        """Reads offered to a lock and not loaded yet: a write to their conversation through
        this memory drops what they hold (`_forget`)."""
        self._handed: weakref.WeakValueDictionary[ConversationKey, HistoryWrite] = (
            weakref.WeakValueDictionary()
        )
        """Turns handed to their lock's release and maybe not stored yet, by conversation."""

    def key(self, conversation_id: str, user_id: str | None = None) -> ConversationKey:
        return ConversationKey(self.endpoint, user_id, conversation_id)

    # --- HistoryStore (what the loop calls) ---------------------------------------------------

    def locked_read(self, run: Run) -> HistoryRead | None:
        """`contracts.LockedReader` (the endpoint's `locked_reader`): the read `load` makes
        first, for the kernel to offer the conversation's lock, which makes it in the round
        trip that takes the lock when the history is on the lock's server (PostgreSQL, Redis);
        `None` for a local history.

        What the lock delivers serves this run's first `load` only, and only if nothing was
        written to the conversation through this memory in between: nothing outlives the run.
        The `on_load` hooks start here, so their reads go out beside the lock's.
        """
        if not getattr(self.backend, "locked_reads", False):
            return None
        for hook in self.on_load:
            hook(run)
        key = self.key(run.conversation_id, run.user_id)
        if self.strategy.summarizes:
            read = HistoryRead(self.backend, key, None, MAX_UNSUMMARIZED)
        else:
            read = HistoryRead(self.backend, key, 0, self.max_messages)
        run.state.set(_LOCKED_READ, read)
        run.state.set(_HANDOFF, read)
        self._offered.add(read)
        return read

    async def load(self, run: Run) -> list[Message]:
        for hook in self.on_load:
            hook(run)
        key = self.key(run.conversation_id, run.user_id)
        await self._store_handed(key)
        read = run.state.pop(_LOCKED_READ)
        if read is not None:
            self._offered.discard(read)
            delivered, result = read.take()
            if delivered and read.key == key:
                return await self._view(key, result)
        return await self._view(key)

    async def append(self, run: Run, messages: Sequence[Message]) -> None:
        if messages:
            key = self.key(run.conversation_id, run.user_id)
            self._forget(key)
            await self._store_handed(key)
            read = run.state.get(_HANDOFF)
            if read is not None and read.key == key and read.status is not None:
                write = HistoryWrite(self.backend, key, messages, read.status)
                if read.status.hand(write):
                    self._handed[key] = write  # (stored by the lock's release)
                    return
            await self.backend.append(key, messages)

    async def _store_handed(self, key: ConversationKey) -> None:
        """Store now the turn of `key` handed to its lock's release, if the release has not
        taken it yet (reads and writes through this memory come after it, as if it had been
        stored when it was appended)."""
        write = self._handed.pop(key, None)
        if write is None:
            return
        status = write.status
        if status.take_write() is not write:
            return  # (the release has it)
        try:
            await write.store()
        except Exception as exc:
            status.wrote(exc)
            raise
        except BaseException:
            status.wrote(RuntimeError("the turn's write was stopped: it may not be stored"))
            raise
        status.wrote(None)

    def _forget(self, key: ConversationKey) -> None:
        """Drop what a lock delivered for `key` and nobody loaded yet (it is stale now)."""
        for read in list(self._offered):
            if read.key == key:
                read.take()

    async def newest_seq(self, run: Run) -> int:
        """`contracts.HistoryMark` (the endpoint's `history_mark`): the seq of the
        conversation's newest stored message.

        Read through `since_summary` (every backend has it, and a limit of one makes it one
        small read): the summary checkpoint never covers the newest messages (compaction keeps
        the recent ones), and a cleared conversation restarts its seqs, which a caller comparing
        two marks for equality sees as a change too.
        """
        key = self.key(run.conversation_id, run.user_id)
        await self._store_handed(key)
        _summary, newest = await self.backend.since_summary(key, 1)
        return newest[-1][0] if newest else 0

    # --- for application code -----------------------------------------------------------------

    async def view(self, conversation_id: str, user_id: str | None = None) -> list[Message]:
        """What the model is sent for this conversation: the compacted history."""
        return await self._view(self.key(conversation_id, user_id))

    async def _view(self, key: ConversationKey, read: Any = None) -> list[Message]:
        """The compacted history of `key`; `read` is what a `HistoryRead` delivered for it."""
        if read is None:
            await self._store_handed(key)
        found: tuple[Summary | None, list[tuple[int, Message]]] | None = read
        if self.strategy.summarizes:
            if found is None:
                found = await self.backend.since_summary(key, MAX_UNSUMMARIZED)
            summary, stored = found
            messages = [message for _seq, message in stored]
            result = await self.strategy.compact(messages, self.max_messages, summary, key.user_id)
            if result.summary is not None and result.absorbed > 0:
                await self.backend.save_summary(key, result.summary, stored[result.absorbed - 1][0])
            return result.messages
        if found is None:
            tail = await self.backend.tail(key, self.max_messages)
        else:
            tail = [message for _seq, message in found[1]]
        return (await self.strategy.compact(tail, self.max_messages)).messages

    async def messages(self, conversation_id: str, user_id: str | None = None) -> list[Message]:
        """Every stored message of the conversation, oldest first (nothing is compacted away)."""
        key = self.key(conversation_id, user_id)
        await self._store_handed(key)
        return await self.backend.messages(key)

    async def clear(self, conversation_id: str, user_id: str | None = None) -> None:
        """Forget the conversation entirely."""
        key = self.key(conversation_id, user_id)
        self._forget(key)
        await self._store_handed(key)
        await self.backend.clear(key)
