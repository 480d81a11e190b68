"""Retention: conversations idle longer than `conversation_ttl` are deleted
(`ATMOSPHERE_AI_CONVERSATION_TTL`, seconds; unset keeps them).

Every replica runs one sweep every `sweep_interval(ttl)` (half the ttl, at least half a second,
at most a minute). A sweep asks the ownership record for the conversations whose last prompt is
older than the ttl, oldest first, `BATCH` at a time (an indexed read: `updated_at`), each one
claimed for `LEASE_SECONDS` so that replicas sweeping at once split them. Each is deleted as
`DELETE P/conversations/{id}` deletes it (`kernel.forget`), after its facts were extracted (the
endpoint's `expire_hooks`), unless it has a run in flight or a prompt used it since it was
found: the deletion of its ownership record is conditional on its last prompt, one atomic step
in the store, so a conversation is deleted once, by one replica, and never from under a run.
A conversation in use is released at once (the next sweep looks at it again); one whose
deletion failed (an extraction or a store) is looked at again once its claim ran out. A derived
conversation (a fleet member's) is never picked on its own: it is deleted with its parent,
whatever its own idle time. The stores are scrubbed once per sweep that deleted something.
"""

from __future__ import annotations

import asyncio
import time

from .._cancel import reraise_cancellation
from .._errors import RunConflict
from .._log import fault, get_logger
from .forget import DeletingHost, forget_conversation, scrub_stores

log = get_logger(__name__)

BATCH = 64
"""Conversations one sweep claims and deletes per round trip."""
LEASE_SECONDS = 300.0
"""How long a claimed conversation is one sweep's (an extraction may call the model)."""
MAX_ROUNDS = 16
"""Batches one sweep takes at most (the next sweep goes on)."""


def sweep_interval(ttl: float) -> float:
    """Seconds between two sweeps: half the ttl, within [0.5, 60]."""
    return min(max(ttl / 2, 0.5), 60.0)


async def sweep(host: DeletingHost, ttl: float, *, now: float | None = None) -> int:
    """Delete the conversations idle longer than `ttl` seconds; returns how many it deleted."""
    cutoff = (time.time() if now is None else now) - ttl
    deleted = 0
    in_use: list[tuple[str, str]] = []
    for _ in range(MAX_ROUNDS):
        expired = await host.access.owners.expired(cutoff, BATCH, LEASE_SECONDS)
        for found in expired:
            try:
                if await forget_conversation(
                    host, found.path, found.conversation_id, idle_before=cutoff, scrub=False
                ):
                    deleted += 1
                    continue
            except RunConflict:
                pass  # in use: never touched
            except Exception as exc:
                log.warning(
                    "could not delete an expired conversation; it is tried again later",
                    endpoint=found.path,
                    conversation=found.conversation_id,
                    error=str(exc),
                )
                continue  # (its claim runs out: a failing store is not asked at once again)
            in_use.append((found.path, found.conversation_id))
        if len(expired) < BATCH:
            break
    for path, conversation_id in in_use:  # (after the rounds: a round never meets one twice)
        await _release(host, path, conversation_id)
    if deleted:
        await scrub_stores(host)
        log.info("expired conversations deleted", count=deleted)
    return deleted


async def _release(host: DeletingHost, path: str, conversation_id: str) -> None:
    """A conversation in use: the next sweep looks at it again (best effort)."""
    try:
        await host.access.owners.release(path, conversation_id)
    except Exception as exc:
        log.warning("could not release an idle conversation's claim", error=str(exc))


async def sweep_forever(host: DeletingHost, ttl: float) -> None:
    """Sweep every `sweep_interval(ttl)` seconds until cancelled (the host's shutdown)."""
    interval = sweep_interval(ttl)
    while True:
        await asyncio.sleep(interval)
        try:
            await sweep(host, ttl)
        except Exception as exc:
            fault(log, "conversation retention sweep failed; retrying", exc, every=False)
        reraise_cancellation()
