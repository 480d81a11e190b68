"""`LongTermMemoryInterceptor`: recall on every request with a user, extraction at close.

Recall puts the user's facts in `ModelRequest.context` (per-turn context, which runtimes place
after the cached prefix), never in the system prompt, so the provider's prompt cache keeps
hitting and one user's facts can never leak into a prefix another user shares. The block is
labelled and bounded. When the user has more facts than fit, the ones that match the message
best (`search`) come first, topped up with the newest.

With a networked store (PostgreSQL, Redis) the user's newest facts are asked for while the
conversation's history loads (`prefetch`, which `ConversationMemory.load` calls), so a turn
waits for one round trip where it would wait for two in a row.

Extraction is not on any request path: the memory primitive calls `extract` from a background
task when a conversation closes.

An agent declares its own interceptor with a class attribute, which suppresses the built-in one:

```python
@agent(name="assistant")
class Assistant:
    interceptors = [LongTermMemoryInterceptor(MyStore(), recall_limit=5)]
```
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING

from .._contracts import Key, UserDailyCap
from .._log import get_logger
from .._runtimes.base import AgentRuntime, Message, ModelRequest
from .extraction import extract_facts, reconcile
from .long_term import LongTermMemory

if TYPE_CHECKING:
    from .._contracts import Run

log = get_logger(__name__)

RECALL_LABEL = "Known facts about this user:"
DEFAULT_RECALL_LIMIT = 20
DEFAULT_RECALL_CHARS = 4000
_STATE_KEY: Key[str] = Key("memory.recall")
_PREFETCH_KEY: Key[asyncio.Future[list[str]]] = Key("memory.recall.newest")


def _consume(task: asyncio.Future[list[str]]) -> None:
    """Retrieve a prefetch's failure, so a run that never used it logs no "never retrieved"."""
    if not task.cancelled():
        task.exception()


def render_facts(facts: Sequence[str], max_chars: int) -> str:
    """`Known facts about this user:` and one `- fact` line each, cut at whole lines."""
    lines = [RECALL_LABEL]
    used = len(RECALL_LABEL)
    for fact in facts:
        line = f"- {fact}"
        if used + 1 + len(line) > max_chars:
            break
        lines.append(line)
        used += 1 + len(line)
    return "\n".join(lines) if len(lines) > 1 else ""


def _last_user_text(messages: Sequence[Message]) -> str:
    for message in reversed(messages):
        if message.role == "user":
            return message.content
    return ""


class LongTermMemoryInterceptor:
    """Recalls a user's facts into each request and extracts new ones when asked to."""

    def __init__(
        self,
        store: LongTermMemory,
        *,
        recall_limit: int = DEFAULT_RECALL_LIMIT,
        recall_chars: int = DEFAULT_RECALL_CHARS,
        runtime: AgentRuntime | None = None,
    ) -> None:
        if recall_limit <= 0 or recall_chars <= 0:
            raise ValueError("recall_limit and recall_chars must be positive")
        self.store = store
        self.recall_limit = recall_limit
        self.recall_chars = recall_chars
        self.runtime = runtime
        """Extraction model; `None` uses the endpoint's runtime."""

    async def before_request(self, run: Run, request: ModelRequest) -> ModelRequest:
        if not run.user_id:
            return request
        block = run.state.get(_STATE_KEY)
        if block is None:
            # Once per run: facts do not change between the model calls of one prompt, and an
            # identical block keeps every round of the run cache-friendly.
            block = await self._recall(run.user_id, request.messages, run.state.get(_PREFETCH_KEY))
            run.state.set(_STATE_KEY, block)
        if not block:
            return request
        return dataclasses.replace(request, context=(*request.context, block))

    async def after_turn(self, run: Run, messages: Sequence[Message]) -> None:
        return None

    def prefetch(self, run: Run) -> None:
        """Start reading the run's user's newest facts now; the run's first request uses them.

        Called as the history load starts: both reads are in flight together (the facts do not
        depend on the history). Nothing happens without a user or once the run has recalled.
        """
        if not run.user_id or run.state.get(_STATE_KEY) is not None:
            return
        if run.state.get(_PREFETCH_KEY) is not None:
            return
        try:
            task = asyncio.ensure_future(self.store.get_facts(run.user_id, self.recall_limit + 1))
        except Exception as exc:  # a store that fails before it awaits: recall reads it later
            log.debug("long-term memory prefetch not started", error=str(exc))
            return
        task.add_done_callback(_consume)
        run.state.set(_PREFETCH_KEY, task)

    async def recall(
        self, user_id: str, message: str, newest: Awaitable[list[str]] | None = None
    ) -> list[str]:
        """The facts to show for `message`: all of them if they fit, else best matches first.

        `newest` is a read of the user's `recall_limit + 1` newest facts already under way
        (`prefetch`); without it they are read here.
        """
        # One more than fits tells whether they all fit, without a separate count.
        if newest is None:
            newest = self.store.get_facts(user_id, self.recall_limit + 1)
        facts = await newest
        if len(facts) <= self.recall_limit:
            return facts
        facts = facts[1:]
        hits = await self.store.search(user_id, message, self.recall_limit)
        return [*hits, *reconcile(hits, reversed(facts))][: self.recall_limit]

    async def _recall(
        self,
        user_id: str,
        messages: Sequence[Message],
        newest: Awaitable[list[str]] | None = None,
    ) -> str:
        try:
            facts = await self.recall(user_id, _last_user_text(messages), newest)
        except Exception as exc:
            log.warning("long-term memory recall failed; continuing without it", error=str(exc))
            return ""
        return render_facts(facts, self.recall_chars)

    async def extract(
        self,
        user_id: str,
        messages: Sequence[Message],
        *,
        runtime: AgentRuntime,
        timeout: float,
        conversation_id: str,
        cap: UserDailyCap | None = None,
    ) -> list[str]:
        """Extract facts from `messages` and store the new ones; returns what was stored.

        With `cap` (the per-user daily token cap) the model call counts toward the user's
        day; a user at the cap raises `UsageLimitExceeded` and nothing is stored."""
        model = self.runtime or runtime
        facts = await extract_facts(
            model,
            messages,
            timeout=timeout,
            conversation_id=conversation_id,
            user_id=user_id,
            cap=cap,
        )
        if not facts:
            return []
        existing = await self.store.get_facts(user_id, await self.store.fact_count(user_id))
        fresh = reconcile(existing, facts)
        if fresh:
            await self.store.save_facts(user_id, fresh)
        return fresh
