"""Memory: conversation history with compaction, and durable long-term memory about users."""

from .compaction import (
    CompactionStrategy,
    SlidingWindowCompaction,
    SummarizingCompaction,
    TokenWindowCompaction,
)
from .conversation import ConversationMemory
from .history import HistoryBackend, InMemoryHistory
from .interceptor import LongTermMemoryInterceptor
from .long_term import InMemoryLongTermMemory, LongTermMemory, SqliteLongTermMemory
from .providers import ENTRY_POINT_GROUP, LongTermMemoryProvider
from .sqlite_history import SqliteHistory

# Runtime truth and reprs show the import path users know, not the defining module.
for _public in (LongTermMemory, InMemoryLongTermMemory, SqliteLongTermMemory):
    _public.__module__ = __name__

__all__ = [
    "ENTRY_POINT_GROUP",
    "CompactionStrategy",
    "ConversationMemory",
    "HistoryBackend",
    "InMemoryHistory",
    "InMemoryLongTermMemory",
    "LongTermMemory",
    "LongTermMemoryInterceptor",
    "LongTermMemoryProvider",
    "SlidingWindowCompaction",
    "SqliteHistory",
    "SqliteLongTermMemory",
    "SummarizingCompaction",
    "TokenWindowCompaction",
]
