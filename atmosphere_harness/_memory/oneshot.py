"""One bounded model call off the conversation (summaries, fact extraction), failing open."""

from __future__ import annotations

import asyncio

from .._log import get_logger
from .._runtimes.base import AgentRuntime, Message, ModelRequest

log = get_logger(__name__)


async def ask(
    runtime: AgentRuntime,
    *,
    system_prompt: str,
    prompt: str,
    purpose: str,
    conversation_id: str,
    timeout: float,
) -> str | None:
    """The model's answer to one prompt (no tools, no history), or `None` when the call failed.

    `purpose` rides in the request metadata, so runtimes and tests can tell these calls from
    the conversation's own. A failure (an error, the timeout) is logged, never raised: memory
    must not break the run it serves.
    """
    request = ModelRequest(
        system_prompt=system_prompt,
        messages=(Message.user(prompt),),
        conversation_id=conversation_id,
        metadata={"purpose": purpose},
    )
    try:
        async with asyncio.timeout(timeout):
            response = await runtime.complete(request)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        reason = f"timed out after {timeout}s" if isinstance(exc, TimeoutError) else str(exc)
        log.warning("memory model call failed", purpose=purpose, reason=reason)
        return None
    return response.text
