"""One bounded model call off the conversation (summaries, fact extraction), failing open.

With the per-user daily token cap set, the call is made only while its user is under the cap
and its tokens count toward the user's day (and toward no run's `UsageLimits`).
"""

from __future__ import annotations

import asyncio
import contextlib

from .._contracts import TokenGrant, UserDailyCap
from .._errors import UsageLimitExceeded
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
    user_id: str | None = None,
    cap: UserDailyCap | None = None,
) -> str | None:
    """The model's answer to one prompt (no tools, no history), or `None` when the call failed.

    `purpose` rides in the request metadata, so runtimes and tests can tell these calls from
    the conversation's own. A failure (an error, the timeout) is logged, never raised: memory
    must not break the run it serves. With `cap` and `user_id`, the call's tokens count toward
    that user's day; a user at the cap raises `UsageLimitExceeded` before any call is made.
    """
    request = ModelRequest(
        system_prompt=system_prompt,
        messages=(Message.user(prompt),),
        conversation_id=conversation_id,
        metadata={"purpose": purpose},
    )
    reserving: contextlib.AbstractAsyncContextManager[TokenGrant] = (
        cap.reserve(user_id, (len(system_prompt) + len(prompt)) // 4)
        if cap is not None and user_id
        else contextlib.nullcontext(TokenGrant())
    )
    try:
        async with reserving as grant, asyncio.timeout(timeout):
            response = await runtime.complete(request)
            grant.used = response.usage.input_tokens + response.usage.output_tokens
    except asyncio.CancelledError:
        raise
    except UsageLimitExceeded:
        raise
    except Exception as exc:
        reason = f"timed out after {timeout}s" if isinstance(exc, TimeoutError) else str(exc)
        log.warning("memory model call failed", purpose=purpose, reason=reason)
        return None
    return response.text
