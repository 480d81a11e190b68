"""Where conversation messages are stored: the `HistoryBackend` protocol and `InMemoryHistory`.

A conversation is keyed by endpoint path, user and conversation id: the same conversation id
used by another user is another conversation, so nobody continues (or reads) someone else's
history by guessing an id. The store keeps every message in full, plus the bookkeeping the
memory primitive needs: the running summary checkpoint, the last activity (the idle reaper) and
how far long-term-memory extraction has read.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from .._contracts import LockedRead, LockedStatus, LockedWrite
from .._runtimes.base import Message
from .compaction import Summary


class ConversationKey(NamedTuple):
    endpoint: str
    user_id: str | None
    conversation_id: str

    @property
    def user_key(self) -> str:
        return self.user_id or ""


RECENT_WRITES = 8
"""How many of a conversation's latest turns a shared backend (PostgreSQL, Redis) remembers by
their write keys: a turn sent again after its reply was lost is stored once if its key is among
them, even when other replicas stored turns in between."""

WRITE_KEYS_CHARS = RECENT_WRITES * 33 - 1
"""Those keys (32 hex characters each, `uuid4().hex`) as the backends keep them: newest first,
separated by spaces, cut to this length."""


class HistoryBackend(Protocol):
    """Storage for `ConversationMemory`; every method is safe to call concurrently."""

    durable: bool
    """Whether histories survive a restart (a volatile one is closed, and extracted, at stop)."""

    async def append(self, key: ConversationKey, messages: Sequence[Message]) -> None:
        """Store a finished turn (re-opens a closed conversation)."""
        ...

    async def tail(self, key: ConversationKey, limit: int) -> list[Message]:
        """The newest `limit` messages, oldest first."""
        ...

    async def since_summary(
        self, key: ConversationKey, limit: int
    ) -> tuple[Summary | None, list[tuple[int, Message]]]:
        """The summary checkpoint and up to `limit` newest `(seq, message)` after it."""
        ...

    async def save_summary(self, key: ConversationKey, summary: Summary, upto_seq: int) -> None:
        """Move the summary checkpoint forward (an older checkpoint never replaces a newer)."""
        ...

    async def messages(self, key: ConversationKey) -> list[Message]:
        """The whole stored history, oldest first."""
        ...

    async def clear(self, key: ConversationKey) -> None: ...

    async def close(self, key: ConversationKey) -> bool:
        """Mark the conversation closed; `False` when it is unknown."""
        ...

    async def unextracted(self, key: ConversationKey, limit: int) -> tuple[list[Message], int]:
        """Up to `limit` newest messages not yet read by extraction, and the last seq."""
        ...

    async def mark_extracted(self, key: ConversationKey, upto_seq: int) -> None: ...

    async def idle(self, before: float, limit: int) -> list[ConversationKey]:
        """Open conversations whose last activity is older than `before` (epoch seconds)."""
        ...

    async def aclose(self) -> None:
        """Finish background work (the primitive calls it at shutdown)."""
        ...


class HistoryRead(LockedRead):
    """A run's first history read, offered to its conversation's lock (`contracts.LockedRead`):
    the summary checkpoint and the newest `limit` messages after seq `after_seq` (`None`: after
    the summary checkpoint), delivered as `(summary, [(seq, message), ...])`, oldest first.

    A lock makes it only when `backend` keeps its histories on the lock's own server (the
    PostgreSQL and Redis backends say so with `locked_reads = True`).
    """

    __slots__ = ("after_seq", "backend", "key", "limit")

    def __init__(
        self, backend: HistoryBackend, key: ConversationKey, after_seq: int | None, limit: int
    ) -> None:
        super().__init__()
        self.backend = backend
        self.key = key
        self.after_seq = after_seq
        self.limit = limit


class HistoryWrite(LockedWrite):
    """A run's turn, handed to its conversation lock's release (`contracts.LockedWrite`): the
    Redis lock stores it in the script that stores the run's end and frees the lock
    (`RedisHistory.turn`), the PostgreSQL lock in the statement that stores the run's end
    (`PostgresHistory.turn`); `store` appends it as `ConversationMemory` would have."""

    __slots__ = ("__weakref__", "backend", "key", "messages", "status")

    def __init__(
        self,
        backend: HistoryBackend,
        key: ConversationKey,
        messages: Sequence[Message],
        status: LockedStatus,
    ) -> None:
        self.backend = backend
        self.key = key
        self.messages = list(messages)
        self.status = status
        """The run's status it was handed to (its writer takes it back there)."""

    async def store(self) -> None:
        await self.backend.append(self.key, self.messages)


# --- in memory -----------------------------------------------------------------------------


@dataclass
class _Conversation:
    messages: list[tuple[int, Message]] = field(default_factory=list)
    last_seq: int = 0
    updated_at: float = 0.0
    closed: bool = False
    extracted_seq: int = 0
    summary: Summary | None = None
    summary_seq: int = 0


class InMemoryHistory:
    """Histories in a dict, for tests and throwaway apps; the least recently used are evicted."""

    durable = False

    def __init__(self, max_conversations: int = 10_000) -> None:
        if max_conversations <= 0:
            raise ValueError("max_conversations must be positive")
        self.max_conversations = max_conversations
        self._data: OrderedDict[ConversationKey, _Conversation] = OrderedDict()

    def _get(self, key: ConversationKey) -> _Conversation | None:
        return self._data.get(key)

    async def append(self, key: ConversationKey, messages: Sequence[Message]) -> None:
        conversation = self._data.pop(key, None) or _Conversation()
        self._data[key] = conversation
        for message in messages:
            conversation.last_seq += 1
            conversation.messages.append((conversation.last_seq, message))
        conversation.updated_at = time.time()
        conversation.closed = False
        while len(self._data) > self.max_conversations:
            self._data.popitem(last=False)

    async def tail(self, key: ConversationKey, limit: int) -> list[Message]:
        conversation = self._get(key)
        if conversation is None or limit <= 0:
            return []
        return [message for _seq, message in conversation.messages[-limit:]]

    async def since_summary(
        self, key: ConversationKey, limit: int
    ) -> tuple[Summary | None, list[tuple[int, Message]]]:
        conversation = self._get(key)
        if conversation is None:
            return None, []
        after = [item for item in conversation.messages if item[0] > conversation.summary_seq]
        return conversation.summary, after[-limit:]

    async def save_summary(self, key: ConversationKey, summary: Summary, upto_seq: int) -> None:
        conversation = self._get(key)
        if conversation is not None and upto_seq > conversation.summary_seq:
            conversation.summary = summary
            conversation.summary_seq = upto_seq

    async def messages(self, key: ConversationKey) -> list[Message]:
        conversation = self._get(key)
        return [message for _seq, message in conversation.messages] if conversation else []

    async def clear(self, key: ConversationKey) -> None:
        self._data.pop(key, None)

    async def close(self, key: ConversationKey) -> bool:
        conversation = self._get(key)
        if conversation is None:
            return False
        conversation.closed = True
        return True

    async def unextracted(self, key: ConversationKey, limit: int) -> tuple[list[Message], int]:
        conversation = self._get(key)
        if conversation is None:
            return [], 0
        fresh = [item for item in conversation.messages if item[0] > conversation.extracted_seq]
        return [message for _seq, message in fresh[-limit:]], conversation.last_seq

    async def mark_extracted(self, key: ConversationKey, upto_seq: int) -> None:
        conversation = self._get(key)
        if conversation is not None:
            conversation.extracted_seq = max(conversation.extracted_seq, upto_seq)

    async def idle(self, before: float, limit: int) -> list[ConversationKey]:
        found = [
            key
            for key, conversation in self._data.items()
            if not conversation.closed and conversation.updated_at < before
        ]
        return found[:limit]

    async def aclose(self) -> None:
        return None
