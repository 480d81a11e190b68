"""What the provider adapters share: streaming, history repair, per-turn context, SDK errors.

Both official SDKs (`openai`, `anthropic`) are generated from the same template, so their error
classes have the same names and attributes; `sdk_error` turns either into a `ModelError` whose
message tells the user what to fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol

import httpx2

from .._errors import ModelError
from .._jsontext import compact_json
from .base import Message, ModelRequest, ModelResponse, TextSink
from .loop_transport import ChunkedBody, LoopTransport
from .windows import model_context_window

RETRY_WAIT_SECONDS = 120.0
"""The longest wait one retry may add (a server's `Retry-After` included)."""

DEFAULT_SDK_TIMEOUT = 600.0
"""Both SDKs' default, assumed for a client whose timeout says nothing."""

DRAIN_SECONDS = 1.0
"""How long to read past the end of a finished stream, so its connection can be reused."""

Event = dict[str, Any]

CR, LF = 13, 10
"""The bytes that end an SSE line (alone, or CR LF)."""


PIECES_JOINED = 32
"""Streamed pieces `TextPieces` keeps apart before it joins them into one string."""


class TextPieces:
    """A streamed text's pieces (an answer's tokens, a tool call's argument fragments), joined
    `PIECES_JOINED` at a time as they come: a long answer in flight holds its characters and a
    few strings rather than one string object (about 50 bytes besides its text) a token.
    `"".join(pieces)` is the whole text."""

    __slots__ = ("_joined", "_loose")

    def __init__(self) -> None:
        self._joined: list[str] = []
        self._loose: list[str] = []

    def append(self, piece: str) -> None:
        loose = self._loose
        loose.append(piece)
        if len(loose) >= PIECES_JOINED:
            self._joined.append("".join(loose))
            loose.clear()

    def __iter__(self) -> Iterator[str]:
        yield from self._joined
        yield from self._loose

    def __bool__(self) -> bool:
        return bool(self._joined or self._loose)


class RawResponse(Protocol):
    """What the SDKs' `with_raw_response` calls return: the unread HTTP response."""

    @property
    def http_response(self) -> httpx2.Response: ...


class Turn(Protocol):
    """Accumulates the events of one streamed model turn."""

    def add(self, event: Event) -> str:
        """Take one event; returns its text delta."""
        ...

    def response(self) -> ModelResponse: ...


class SdkRuntime:
    """What the SDK-backed runtimes share: the client, one streamed call, shutdown.

    A subclass says how to build the request body (`wire_request`), how to send it
    (`send`, returning the SDK's raw response) and how to read the events (`new_turn`).
    """

    provider = ""
    """The provider's name in error messages (`OpenAI`, `Anthropic`)."""

    sdk: ModuleType
    """The SDK module, whose error classes `sdk_error` translates."""

    def __init__(self, client: Any, model: str, *, owns_client: bool) -> None:
        self.client = client
        self.model = model.strip()
        self.base_url = str(client.base_url)
        self.max_retries: int = client.max_retries
        self.context_window: int | None = model_context_window(self.model)
        """The model's context window (tokens) when it is a well-known model, else `None`."""
        self._owns_client = owns_client

    def wire_request(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body of one model call."""
        raise NotImplementedError

    def send(self, body: dict[str, Any]) -> Awaitable[RawResponse]:
        raise NotImplementedError

    def new_turn(self) -> Turn:
        raise NotImplementedError

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        """One streamed model call.

        The SDK sends the request (auth, headers, retries with backoff, status errors); the
        events are then read as plain JSON rather than through the SDK's models, which cost most
        of the client's CPU per chunk (about three quarters on Chat Completions, see
        `benchmarks/bench_runtimes.py`). SDK and transport errors become a `ModelError`; the
        response is closed on every exit, cancellation included, so a client that disconnects
        stops the provider's generation too.
        """
        turn = self.new_turn()
        body = self.wire_request(request)
        deadline = start_deadline(self.client.timeout, self.max_retries)
        try:
            async with asyncio.timeout(deadline):
                raw = await self.send(body)
        except TimeoutError:
            raise ModelError(
                f"{self.provider} did not start answering within {deadline:g}s, retries "
                "included (see LLM_TIMEOUT and LLM_MAX_RETRIES)",
                transient=True,
            ) from None
        except self.sdk.APIError as exc:
            raise sdk_error(self, exc) from exc
        response = raw.http_response
        # The request's copies (our body, the SDK's transformed one in `raw`, the encoded bytes
        # the HTTP client keeps) need not live as long as the answer streams.
        del raw, body
        forget_body(response.request)
        try:
            async for event in sse_events(response):
                failure = event.get("error")
                if failure is not None:
                    raise ModelError(
                        f"{self.provider} stream failed: {_detail(event) or failure}",
                        transient=_transient_event(failure),
                    )
                text = turn.add(event)
                if text and on_text is not None:
                    await on_text(text)
            await _drain(response)
        except httpx2.TimeoutException:
            raise ModelError(
                f"{self.provider} at {self.base_url} went silent mid-answer "
                "(raise LLM_TIMEOUT if it is slow)",
                transient=True,
            ) from None
        except httpx2.TransportError as exc:
            raise ModelError(
                f"{self.provider} at {self.base_url} broke off mid-answer: {exc}", transient=True
            ) from exc
        finally:
            await response.aclose()
        return turn.response()

    async def aclose(self) -> None:
        """Close the SDK client, unless the caller passed it in (then it is theirs)."""
        if self._owns_client:
            await self.client.close()


def forget_body(request: httpx2.Request) -> None:
    """Drop the encoded body of a request whose answer has started: the HTTP client keeps it
    with the request (its `content` and the stream it was sent from) for as long as the answer
    streams, about 5 KiB a run in flight with the default tools and more with a long history.
    Nothing sends it again: a retry or a redirect builds a new request before any answer."""
    stream = request.stream
    # (Private attributes of httpx2: read with getattr, so a release that renames them costs
    # the memory saving, never the call.)
    body = getattr(stream, "_stream", None)
    if isinstance(stream, httpx2.ByteStream) and isinstance(body, bytes):
        stream._stream = b""
    if isinstance(getattr(request, "_content", None), bytes):
        request._content = b""


def pooled_client(sdk: Any, max_connections: int) -> httpx2.AsyncClient:
    """The SDK's own HTTP client (its timeouts, redirects) with a pool of `max_connections`,
    every one kept alive: a replica streaming thousands of runs reuses its connections instead
    of opening one per model call past the SDKs' 100 kept alive. Its connections read on the
    loop directly (`loop_transport`), unless a proxy is configured in the environment (the
    client's default transport then takes the proxy, as it always did)."""
    limits = httpx2.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=sdk.DEFAULT_CONNECTION_LIMITS.keepalive_expiry,
    )
    transport = None if urllib.request.getproxies() else LoopTransport(limits)
    client: httpx2.AsyncClient = sdk.DefaultAsyncHttpxClient(limits=limits, transport=transport)
    return client


def start_deadline(timeout: object, retries: int) -> float:
    """How long a call may take to *start* streaming, every try and retry wait included.

    The OpenAI SDK caps one `Retry-After` wait at two minutes, the Anthropic SDK obeys any value
    (a proxy answering `Retry-After: 86400` would hold the run for a day); this bounds both the
    same way: `(retries + 1)` tries of `timeout` each, plus `RETRY_WAIT_SECONDS` per retry.
    """
    if isinstance(timeout, httpx2.Timeout):
        phases = (timeout.connect, timeout.read, timeout.write, timeout.pool)
        timeout = max((phase for phase in phases if phase is not None), default=None)
    seconds = float(timeout) if isinstance(timeout, int | float) else DEFAULT_SDK_TIMEOUT
    return (retries + 1) * seconds + retries * RETRY_WAIT_SECONDS


async def sse_events(response: httpx2.Response) -> AsyncIterator[Event]:
    """The JSON payload of every server-sent event, until the stream ends or `[DONE]`.

    Read as bytes and cut into lines only at CR, LF and CRLF, as the SSE format and the SDKs'
    own decoders do: a model's text may hold U+2028 or U+0085 raw inside a JSON string, where
    a text line reader (`str.splitlines`, so `httpx`'s `aiter_lines`) would break the event in
    two. A chunk of the body usually holds one whole event: one that holds only its `data: {`
    line and the blank line after it is not cut at all; any other is split with one
    `bytes.splitlines`. A payload is parsed as `json.loads` parses bytes (`_decode`).
    """
    data: list[bytes] = []
    partial: list[bytes] = []
    """The start of a line whose end has not arrived yet."""
    skip_lf = False
    """The last chunk ended with CR: an LF starting the next one ends no second line."""
    read = _reader(response)
    while chunk := await read():
        if skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
            if not chunk:
                continue
        if (
            chunk.startswith(b"data: {")
            and chunk.endswith(b"\n\n")
            and not data
            and not partial
            and chunk.count(b"\n") == 2
            and b"\r" not in chunk
        ):
            # A token: one whole event, its one data line alone in this chunk (what the
            # lines below make of it, without cutting them).
            skip_lf = False
            yield _decode(chunk[6:-2])
            continue
        last = chunk[-1]
        skip_lf = last == CR
        lines = chunk.splitlines()
        tail = lines.pop() if last != LF and last != CR else None
        if lines and partial:
            partial.append(lines[0])
            lines[0] = b"".join(partial)
            partial.clear()
        for line in lines:
            if line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif not line and data:
                payload = b"\n".join(data) if len(data) > 1 else data[0]
                data.clear()
                if payload.strip() == b"[DONE]":
                    return
                yield _decode(payload)
            # (`event:`/`id:` fields and comments: the payload carries its own type)
        if tail is not None:
            partial.append(tail)
    if partial:
        line = b"".join(partial)
        if line.startswith(b"data:"):
            data.append(line[6:] if line[5:6] == b" " else line[5:])
    if data:
        payload = b"\n".join(data)
        if payload.strip() != b"[DONE]":
            yield _decode(payload)


def _reader(response: httpx2.Response) -> Callable[[], Awaitable[bytes]]:
    """What reads the response's body, a piece a call, `b""` at its end: a `ChunkedBody`'s
    `next_data`, called directly (not through an async generator, one layer less a token), or
    the client's `aiter_bytes`. (Not the client's generator for a `ChunkedBody`: it closes the
    whole response when it is finalized, which, once `sse_events` returned at `[DONE]`, may
    come while `_drain` still waits for the body's last chunk, and the connection is then
    dropped instead of reused.)"""
    body = getattr(response.stream, "_stream", None)  # (inside `httpx2`'s timing wrapper)
    if isinstance(body, ChunkedBody):
        return body.next_data
    return functools.partial(anext, response.aiter_bytes(), b"")


async def _drain(response: httpx2.Response) -> None:
    """Read what follows `[DONE]` (the end of the chunked body), bounded in time.

    An HTTP/1.1 connection closed with unread body bytes cannot go back to the pool, and a new
    TLS connection per model call costs a round trip or two.
    """
    if response.is_closed:
        return  # the body was read to its end: nothing left to drain
    with contextlib.suppress(httpx2.HTTPError, httpx2.StreamError, TimeoutError):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in response.stream:  # type: ignore[union-attr]
                pass


def _decode(payload: bytes) -> Event:
    try:
        if payload.startswith(b'{"'):
            # What `json.loads(payload)` does, without its layers (one event a token): a
            # payload that opens with `{"` is UTF-8 to it (no BOM, no UTF-16 or -32), decoded
            # the same way, and may end in JSON whitespace only.
            text = payload.decode("utf-8", "surrogatepass")
            event, end = _SCAN(text, 0)
            if end != len(text) and text[end:].strip(JSON_SPACE):
                raise ValueError("extra data after the JSON value")
        else:
            event = json.loads(payload)
    except (ValueError, StopIteration):  # (the scanner's StopIteration: no value at all)
        raise ModelError(f"the model server sent malformed JSON: {_shown(payload)}") from None
    if not isinstance(event, dict):
        raise ModelError(f"the model server sent an unexpected event: {_shown(payload)}")
    return event


_SCAN: Callable[[str, int], tuple[Any, int]]
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
"""What `JSONDecoder.raw_decode` calls, called directly: the value at an index and where it ends
(`StopIteration` when no value starts there)."""
JSON_SPACE = " \t\n\r"
"""The whitespace JSON allows around a value."""


def _shown(payload: bytes) -> str:
    return repr(payload[:200].decode(errors="replace"))


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
    return _TEXT(arguments)


_TEXT = compact_json(ascii_only=False)


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


def sdk_error(runtime: SdkRuntime, exc: Exception) -> ModelError:
    """A clear `ModelError` for an `openai`/`anthropic` SDK `APIError`."""
    sdk, provider, retries = runtime.sdk, runtime.provider, runtime.max_retries
    if isinstance(exc, sdk.APIStatusError):
        status = int(exc.status_code)
        detail = _detail(exc.body) or exc.message
        if status in _RETRIED or status >= 500:
            tries = f" after {retries} {'retry' if retries == 1 else 'retries'}"
            return ModelError(
                f"{provider} failed (HTTP {status}){tries}: {detail}", status=status, transient=True
            )
        hint = _STATUS_HINTS.get(status)
        suffix = f" ({hint})" if hint else ""
        return ModelError(
            f"{provider} rejected the request (HTTP {status}): {detail}{suffix}", status=status
        )
    if isinstance(exc, sdk.APITimeoutError):
        return ModelError(
            f"{provider} at {runtime.base_url} timed out (raise LLM_TIMEOUT if it is slow)",
            transient=True,
        )
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        reason = f": {cause}" if cause else ""
        return ModelError(f"cannot reach {provider} at {runtime.base_url}{reason}", transient=True)
    return ModelError(f"{provider} error: {getattr(exc, 'message', None) or exc}")


_TRANSIENT_EVENTS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "server_error"})


def _transient_event(failure: object) -> bool:
    """Whether an `error` event inside a stream reports a passing condition (an overloaded or
    failing server) rather than a rejected request."""
    kind = failure.get("type") or failure.get("code") if isinstance(failure, Mapping) else None
    return kind in _TRANSIENT_EVENTS


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
