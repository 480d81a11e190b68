"""`ConversationMemory`: an endpoint's multi-turn history, as the loop loads and stores it.

It is the endpoint's `HistoryStore`: `load(run)` returns the compacted view of the run's
conversation, `append(run, turn)` stores the finished turn in full. It is also injectable into a
`@prompt` method, for code that wants to read or clear a conversation itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..injection import register_injectable
from ..runtimes.base import Message
from .compaction import CompactionStrategy, SlidingWindowCompaction
from .history import ConversationKey, HistoryBackend, InMemoryHistory

if TYPE_CHECKING:
    from ..contracts import Run

DEFAULT_MAX_HISTORY = 20
MAX_UNSUMMARIZED = 500
"""Messages after the summary checkpoint read per load (bounds a strategy switch on old data)."""


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
        (the long-term-memory recall of the user's facts: `LongTermMemoryInterceptor.prefetch`)."""

    def key(self, conversation_id: str, user_id: str | None = None) -> ConversationKey:
        return ConversationKey(self.endpoint, user_id, conversation_id)

    # --- HistoryStore (what the loop calls) ---------------------------------------------------

    async def load(self, run: Run) -> list[Message]:
        for hook in self.on_load:
            hook(run)
        return await self.view(run.conversation_id, run.user_id)

    async def append(self, run: Run, messages: Sequence[Message]) -> None:
        if messages:
            await self.backend.append(self.key(run.conversation_id, run.user_id), messages)

    async def newest_seq(self, run: Run) -> int:
        """`contracts.HistoryMark`: the seq of the conversation's newest stored message.

        Read through `since_summary` (every backend has it, and a limit of one makes it one
        small read): the summary checkpoint never covers the newest messages (compaction keeps
        the recent ones), and a cleared conversation restarts its seqs, which a caller comparing
        two marks for equality sees as a change too.
        """
        key = self.key(run.conversation_id, run.user_id)
        _summary, newest = await self.backend.since_summary(key, 1)
        return newest[-1][0] if newest else 0

    # --- for application code -----------------------------------------------------------------

    async def view(self, conversation_id: str, user_id: str | None = None) -> list[Message]:
        """What the model is sent for this conversation: the compacted history."""
        key = self.key(conversation_id, user_id)
        if self.strategy.summarizes:
            summary, stored = await self.backend.since_summary(key, MAX_UNSUMMARIZED)
            messages = [message for _seq, message in stored]
            result = await self.strategy.compact(messages, self.max_messages, summary)
            if result.summary is not None and result.absorbed > 0:
                await self.backend.save_summary(key, result.summary, stored[result.absorbed - 1][0])
            return result.messages
        tail = await self.backend.tail(key, self.max_messages)
        return (await self.strategy.compact(tail, self.max_messages)).messages

    async def messages(self, conversation_id: str, user_id: str | None = None) -> list[Message]:
        """Every stored message of the conversation, oldest first (nothing is compacted away)."""
        return await self.backend.messages(self.key(conversation_id, user_id))

    async def clear(self, conversation_id: str, user_id: str | None = None) -> None:
        """Forget the conversation entirely."""
        await self.backend.clear(self.key(conversation_id, user_id))


register_injectable(ConversationMemory)
