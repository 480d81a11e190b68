"""The memory attach engine: conversation memory, compaction and long-term memory.

On start it opens the workspace database (`{workspace_root}/atmosphere.db`), resolves the one
long-term memory store the app uses and starts the idle reaper. On each endpoint that gets
memory it installs a `ConversationMemory` as the loop's history and, with `Harness.MEMORY`, the
long-term-memory interceptor. A conversation closes through `Host.close_conversation`
(the close route, a WebSocket disconnect), the idle reaper, or shutdown; closing schedules fact
extraction in the background and returns at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

from .._cancel import reraise_cancellation
from .._contracts import USER_DAILY_CAP, Endpoint, Host, Key, Primitive
from .._errors import UsageLimitExceeded
from .._harness import Harness
from .._log import get_logger
from .._preset import ACTIVE, COMPACTION, CONVERSATION_MEMORY, LONG_TERM_MEMORY
from .compaction import build_strategy, token_budget
from .conversation import DEFAULT_MAX_HISTORY, ConversationMemory
from .history import ConversationKey, HistoryBackend, InMemoryHistory
from .interceptor import LongTermMemoryInterceptor
from .long_term import LongTermMemory, SqliteLongTermMemory
from .providers import LongTermMemoryProvider, load_providers, resolve_provider
from .sqlite import DATABASE_FILE, SqliteDatabase
from .sqlite_history import SqliteHistory

log = get_logger(__name__)

LONG_TERM_MEMORY_SERVICE: Key[LongTermMemory] = Key("memory.long_term")
"""`host.services` key of the app's long-term memory store."""
CONVERSATION_MEMORY_SERVICE: Key[ConversationMemory] = Key("memory.conversation")
"""`endpoint.services` key of the endpoint's conversation memory."""

MAX_EXTRACTION_MESSAGES = 200
REAP_BATCH = 256


def qualified_name(value: object) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


class MemoryPrimitive(Primitive):
    """Attaches `Harness.MEMORY` (and explicit `conversation_memory=True`).

    `history=` and `long_term_memory=` replace the SQLite defaults (tests pass in-memory ones);
    `providers=` replaces entry-point discovery; `fallback_long_term_memory=` (a state backend's
    store) replaces only the SQLite default, so an entry-point provider still wins over it.
    """

    name = "memory"

    def __init__(
        self,
        *,
        history: HistoryBackend | None = None,
        long_term_memory: LongTermMemory | None = None,
        fallback_long_term_memory: LongTermMemory | None = None,
        providers: list[LongTermMemoryProvider] | None = None,
    ) -> None:
        self._given_history = history
        self._given_store = long_term_memory
        self._fallback_store = fallback_long_term_memory
        self._providers = providers
        self.database: SqliteDatabase | None = None
        self.history: HistoryBackend = history or InMemoryHistory()
        self.store: LongTermMemory | None = None
        self._owned_store: LongTermMemory | None = None
        self._interceptors: dict[str, LongTermMemoryInterceptor] = {}
        self._extracting: set[ConversationKey] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._host: Host | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, host: Host) -> None:
        self._host = host
        settings = host.settings
        store = self._given_store
        if self._given_history is None or (store is None and self._fallback_store is None):
            self.database = SqliteDatabase.shared(
                settings.groups.filesystem.workspace_root / DATABASE_FILE
            )
        if self._given_history is None:
            assert self.database is not None
            self.history = SqliteHistory(self.database)
        if store is None:
            providers = self._providers if self._providers is not None else load_providers()
            found = resolve_provider(settings, providers)
            if found is not None:
                provider, store = found
                self._owned_store = store
                log.info("long-term memory from provider", provider=provider.name)
        if store is None and self._fallback_store is not None:
            store = self._fallback_store
        if store is None:
            assert self.database is not None
            store = SqliteLongTermMemory(
                database=self.database, max_facts_per_user=settings.groups.memory.max_facts
            )
        if not isinstance(store, LongTermMemory):
            raise TypeError(f"long_term_memory must be a LongTermMemory, got {store!r}")
        self.store = store
        if self.database is not None:
            await self.database.open()
        host.services.set(LONG_TERM_MEMORY_SERVICE, store)
        host.user_forget_hooks.append(store.clear)
        idle_timeout = settings.groups.memory.idle_timeout
        if idle_timeout > 0:
            self._reaper = asyncio.get_running_loop().create_task(
                self._reap_forever(idle_timeout), name="memory-idle-reaper"
            )

    def attach(self, endpoint: Endpoint, host: Host) -> None:
        spec = endpoint.spec
        explicit = spec is not None and spec.conversation_memory
        if not (endpoint.has(Harness.MEMORY) or explicit):
            return
        settings = host.settings.groups.memory
        strategy = build_strategy(
            settings.compaction,
            runtime=endpoint.runtime,
            model_timeout=settings.model_timeout,
            recent_window=settings.recent_window,
            context_tokens=token_budget(host.settings, endpoint.runtime),
            cap=host.services.get(USER_DAILY_CAP),
        )
        memory = ConversationMemory(
            self.history,
            endpoint=endpoint.path,
            max_messages=spec.max_history_messages if spec is not None else DEFAULT_MAX_HISTORY,
            strategy=strategy,
        )
        endpoint.history = memory
        endpoint.history_mark = memory
        endpoint.locked_reader = memory
        endpoint.services.set(CONVERSATION_MEMORY_SERVICE, memory)
        endpoint.provide(ConversationMemory, lambda run: memory)
        endpoint.close_hooks.append(
            lambda conversation, user: self.close(endpoint, conversation, user)
        )
        endpoint.forget_hooks.append(memory.clear)
        endpoint.expire_hooks.append(
            lambda conversation, user: self.extract_now(endpoint, conversation, user)
        )
        if not endpoint.has(Harness.MEMORY):
            return
        endpoint.report(CONVERSATION_MEMORY, ACTIVE)
        endpoint.report(COMPACTION, strategy.name)
        interceptor = next(
            (i for i in endpoint.interceptors if isinstance(i, LongTermMemoryInterceptor)), None
        )
        if interceptor is None:
            assert self.store is not None
            interceptor = LongTermMemoryInterceptor(self.store)
            endpoint.interceptors.append(interceptor)
            endpoint.report(LONG_TERM_MEMORY, f"{ACTIVE}({qualified_name(self.store)})")
        self._interceptors[endpoint.path] = interceptor
        memory.on_load.append(interceptor.prefetch)
        store = interceptor.store
        endpoint.provide(LongTermMemory, lambda run: store)

    async def stop(self, host: Host) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        # A history that dies with the process closes every conversation now; a durable one
        # closes those already idle (the others may continue after a restart).
        timeout = host.settings.groups.memory.idle_timeout
        if not self.history.durable:
            await self.reap(math.inf)
        elif timeout > 0:
            await self.reap(time.time() - timeout)
        await host.drain()
        await self.history.aclose()
        if self._owned_store is not None:
            await self._owned_store.aclose()
        if self.database is not None:
            await self.database.aclose()

    # --- closing conversations ------------------------------------------------------------

    async def close(self, endpoint: Endpoint, conversation_id: str, user_id: str | None) -> bool:
        """Close one conversation; extraction (when there is a user) runs in the background."""
        key = ConversationKey(endpoint.path, user_id, conversation_id)
        if not await self.history.close(key):
            return False
        interceptor = self._interceptors.get(endpoint.path)
        if user_id and interceptor is not None and key not in self._extracting and self._host:
            self._extracting.add(key)
            self._host.spawn(
                self._extract(endpoint, interceptor, key, user_id),
                name=f"memory-extraction:{endpoint.path}:{conversation_id}",
            )
        return True

    async def extract_now(
        self, endpoint: Endpoint, conversation_id: str, user_id: str | None
    ) -> None:
        """Extract the conversation's facts and wait for it (before retention deletes it);
        raises when the extraction failed, so the conversation is kept for a later try."""
        interceptor = self._interceptors.get(endpoint.path)
        if not user_id or interceptor is None:
            return
        key = ConversationKey(endpoint.path, user_id, conversation_id)
        await self._extract(endpoint, interceptor, key, user_id, fail=True)

    async def _extract(
        self,
        endpoint: Endpoint,
        interceptor: LongTermMemoryInterceptor,
        key: ConversationKey,
        user_id: str,
        *,
        fail: bool = False,
    ) -> None:
        assert self._host is not None
        try:
            messages, last_seq = await self.history.unextracted(key, MAX_EXTRACTION_MESSAGES)
            if not messages:
                return
            stored = await interceptor.extract(
                user_id,
                messages,
                runtime=endpoint.runtime,
                timeout=self._host.settings.groups.memory.model_timeout,
                conversation_id=key.conversation_id,
                cap=self._host.services.get(USER_DAILY_CAP),
            )
            await self.history.mark_extracted(key, last_seq)
            log.info("long-term memory extracted", endpoint=endpoint.path, facts=len(stored))
        except asyncio.CancelledError:
            raise
        except UsageLimitExceeded:
            # Left unextracted: a later close of the conversation extracts it.
            log.info("long-term memory extraction skipped: the user reached the daily token limit")
        except Exception as exc:
            log.warning(
                "long-term memory extraction failed", endpoint=endpoint.path, error=str(exc)
            )
            if fail:
                raise
        finally:
            self._extracting.discard(key)

    async def reap(self, before: float) -> int:
        """Close every open conversation idle since before `before`; returns how many."""
        closed = 0
        while True:
            keys = await self.history.idle(before, REAP_BATCH)
            if not keys:
                return closed
            for key in keys:
                endpoint = self._host.endpoint(key.endpoint) if self._host else None
                if endpoint is None:
                    await self.history.close(key)
                else:
                    await self.close(endpoint, key.conversation_id, key.user_id)
                closed += 1

    async def _reap_forever(self, timeout: float) -> None:
        interval = min(max(timeout / 4, 1.0), 60.0)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reap(time.time() - timeout)
            except Exception as exc:
                log.warning("idle conversation reaper failed", error=str(exc))
            reraise_cancellation()  # (one the history's driver swallowed: `_cancel`)
