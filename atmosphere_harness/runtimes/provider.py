"""What the provider adapters share: history repair, per-turn context, and SDK error translation.

Both official SDKs (`openai`, `anthropic`) are generated from the same template, so their error
classes have the same names and attributes; `sdk_error` turns either into a `ModelError` whose
message tells the user what to fix.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol, TypeVar

from .base import Message, ModelError, ModelRequest, TextSink

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

RETRY_WAIT_SECONDS = 120.0
"""The longest wait one retry may add (a server's `Retry-After` included)."""


class EventStream(Protocol[T_co]):
    """An SDK stream: iterable, and closed by leaving its `async with`."""

    def __aiter__(self) -> AsyncIterator[T_co]: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


def start_deadline(timeout: object, retries: int) -> float:
    """How long a call may take to *start* streaming, every try and retry wait included.

    The OpenAI SDK caps one `Retry-After` wait at two minutes, the Anthropic SDK obeys any value
    (a proxy answering `Retry-After: 86400` would hold the run for a day); this bounds both the
    same way: `(retries + 1)` tries of `timeout` each, plus `RETRY_WAIT_SECONDS` per retry.
    """
    seconds = float(timeout) if isinstance(timeout, int | float) else 600.0
    return (retries + 1) * seconds + retries * RETRY_WAIT_SECONDS


async def stream_turn(
    open_stream: Callable[[], Awaitable[EventStream[T]]],
    accumulate: Callable[[T], str],
    on_text: TextSink | None,
    *,
    sdk: ModuleType,
    provider: str,
    base_url: str,
    retries: int,
    timeout: object,
) -> None:
    """Open a provider stream and feed every event to `accumulate`, streaming its text.

    SDK errors become a `ModelError`; the stream is closed on every exit, cancellation
    included, so a client that disconnects stops the provider's generation too.
    """
    deadline = start_deadline(timeout, retries)
    try:
        try:
            async with asyncio.timeout(deadline):
                stream = await open_stream()
        except TimeoutError:
            raise ModelError(
                f"{provider} did not start answering within {deadline:g}s, retries included "
                "(see LLM_TIMEOUT and LLM_MAX_RETRIES)"
            ) from None
        async with stream:
            async for event in stream:
                text = accumulate(event)
                if text and on_text is not None:
                    await on_text(text)
    except sdk.APIError as exc:
        raise sdk_error(sdk, exc, provider=provider, base_url=base_url, retries=retries) from exc


MISSING_RESULT = json.dumps(
    {
        "error": "tool_result_missing",
        "message": "This call has no recorded result (the run was interrupted before it finished).",
    },
    separators=(",", ":"),
)
"""The result sent for a recorded tool call whose result never made it into the history."""


def paired(messages: Sequence[Message]) -> list[Message]:
    """The history with every tool call answered exactly once, right after the call.

    Providers answer 400 to an orphaned tool result or an unanswered call, and the bad history
    would then fail every later prompt of the conversation. So a result that answers no pending
    call (or answers one twice) is dropped, and a call left without a result gets
    `MISSING_RESULT`. A well-formed history comes back unchanged.
    """
    out: list[Message] = []
    pending: dict[str, Any] = {}

    def settle() -> None:
        for call in pending.values():
            out.append(Message.tool(call, MISSING_RESULT))
        pending.clear()

    for message in messages:
        if message.role == "tool":
            if message.tool_call_id in pending:
                del pending[message.tool_call_id]
                out.append(message)
            continue
        settle()
        out.append(message)
        if message.role == "assistant":
            pending = {call.id: call for call in message.tool_calls}
    settle()
    return out


def context_text(request: ModelRequest) -> str:
    """The per-turn context (recalled facts, plan reminder) as one block; empty when none."""
    return "\n\n".join(item.strip() for item in request.context if item and item.strip())


def arguments_json(arguments: object) -> str:
    """Tool-call arguments as the JSON text a provider expects back in the history."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def parse_arguments(text: str) -> Any:
    """The model's arguments as a dict; malformed JSON stays text, for the executor to reject."""
    if not text.strip():
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    return parsed if isinstance(parsed, dict) else text


_STATUS_HINTS = {
    401: "check LLM_API_KEY",
    403: "check LLM_API_KEY and the key's permissions",
    404: "check LLM_MODEL and LLM_BASE_URL",
    413: "the request is too large for the model",
}
_RETRIED = frozenset({408, 409, 429})


def sdk_error(
    sdk: ModuleType, exc: Exception, *, provider: str, base_url: str, retries: int
) -> ModelError:
    """A clear `ModelError` for an `openai`/`anthropic` SDK `APIError`."""
    if isinstance(exc, sdk.APIStatusError):
        status = int(exc.status_code)
        detail = _detail(exc.body) or exc.message
        if status < 400:
            # An `error` event inside a 200 stream (e.g. Anthropic's mid-stream overload).
            return ModelError(f"{provider} stream failed: {detail}")
        if status in _RETRIED or status >= 500:
            tries = f" after {retries} {'retry' if retries == 1 else 'retries'}"
            return ModelError(f"{provider} failed (HTTP {status}){tries}: {detail}")
        hint = _STATUS_HINTS.get(status)
        suffix = f" ({hint})" if hint else ""
        return ModelError(f"{provider} rejected the request (HTTP {status}): {detail}{suffix}")
    if isinstance(exc, sdk.APITimeoutError):
        return ModelError(f"{provider} at {base_url} timed out (raise LLM_TIMEOUT if it is slow)")
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        reason = f": {cause}" if cause else ""
        return ModelError(f"cannot reach {provider} at {base_url}{reason}")
    return ModelError(f"{provider} error: {getattr(exc, 'message', None) or exc}")


def _detail(body: object) -> str:
    """The provider's own error message out of its JSON error body."""
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
        if isinstance(body.get("message"), str):
            return str(body["message"])
        return ""
    if isinstance(body, str):
        return body.strip()[:500]
    return ""
