"""`OpenAIRuntime`: Chat Completions through the official `openai` SDK.

It speaks to OpenAI and to any OpenAI-compatible server (Ollama, vLLM, LM Studio, Azure OpenAI's
v1 API): streaming, tools, parallel tool calls, usage with cached tokens. Retries on 408/409/429/
5xx and connection errors are the SDK's own (exponential backoff with jitter, `Retry-After`
honoured), bounded by `max_retries`.

Wire decisions:
- the system prompt is the first message and never changes, so provider prefix caches hit; a
  leading system message of the history (a compaction summary) is appended to it;
- per-turn context (`ModelRequest.context`) goes at the very end of the request: appended to the
  final user message, or as a trailing user message after tool results. Nothing already sent is
  rewritten, so the prefix stays byte-identical from round to round, and the role order stays one
  every chat template accepts (no system message mid-conversation, no two user messages in a row);
- `prompt_cache_key` (the hint's key, else the conversation id) is sent only when the
  `prompt_cache_key` mode allows the host: OpenAI, Azure OpenAI and loopback under `auto`.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

import httpx2
import openai

from .._settings import (
    DEFAULT_LLM_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    HarnessSettings,
    PromptCacheKeyMode,
)
from .base import (
    NO_USAGE,
    AiCapability,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
    new_call_id,
)
from .provider import (
    RawResponse,
    SdkRuntime,
    TextPieces,
    arguments_json,
    context_text,
    paired,
    parse_arguments,
    pooled_client,
)

OPENAI_BASE_URL = "https://api.openai.com/v1"
LOCAL_API_KEY = "unused"
"""Sent to servers that need no key (Ollama, vLLM): the SDK insists on having one."""


class OpenAIRuntime(SdkRuntime):
    """A model behind an OpenAI-compatible Chat Completions endpoint.

    Example:
        ```python
        runtime = OpenAIRuntime("llama3.1", base_url="http://localhost:11434/v1")
        app.include_router(create_harness_router(runtime=runtime))
        ```

    Args:
        model: The model name the server knows (`gpt-4.1-mini`, `llama3.1`, ...).
        base_url: The server's `/v1` URL; `None` means OpenAI (or `OPENAI_BASE_URL`).
        api_key: The key; `None` reads `OPENAI_API_KEY`. A server other than OpenAI may need none.
        max_retries: Retries of one call on 408/409/429/5xx and connection errors.
        timeout: Seconds to connect, or to wait between two streamed chunks.
        max_tokens: Output cap per turn (`max_completion_tokens`); `None` leaves the server's.
        prompt_cache_key: When requests carry `prompt_cache_key` (`auto`, `true`, `false`).
        parallel_tool_calls: Sent as is when not `None` (OpenAI's default is on).
        max_connections: Connections kept to the server (the HTTP client's pool, all of them
            kept alive between calls): the model calls this runtime streams at once; a call
            beyond it waits for a free one (the SDKs' own pool keeps only 100 alive). Ignored
            with `http_client` or `client`.
        http_client: An `httpx2.AsyncClient` for proxies, custom TLS or tests.
        client: A ready `openai.AsyncOpenAI`; the other connection arguments are then ignored
            and the caller closes it.
    """

    name = "openai"
    provider = "OpenAI"
    sdk = openai

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 2,
        timeout: float = DEFAULT_LLM_TIMEOUT,
        max_tokens: int | None = None,
        prompt_cache_key: PromptCacheKeyMode | str | bool = PromptCacheKeyMode.AUTO,
        parallel_tool_calls: bool | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        http_client: httpx2.AsyncClient | None = None,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        if not model or not model.strip():
            raise ValueError(
                "OpenAIRuntime needs a model name: set LLM_MODEL (e.g. gpt-4.1-mini, llama3.1)"
            )
        owns_client = client is None
        if client is None:
            target = base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_BASE_URL
            key = api_key or os.environ.get("OPENAI_API_KEY")
            if not key:
                if urlsplit(target).hostname == "api.openai.com":
                    raise ValueError(
                        "OpenAIRuntime needs an API key for OpenAI: set LLM_API_KEY "
                        "(or OPENAI_API_KEY), or point LLM_BASE_URL at your own server"
                    )
                key = LOCAL_API_KEY
            if http_client is None:
                http_client = pooled_client(openai, max_connections)
            client = openai.AsyncOpenAI(
                api_key=key,
                base_url=target,
                max_retries=max_retries,
                timeout=timeout,
                http_client=http_client,
            )
        super().__init__(client, model, owns_client=owns_client)
        self.client: openai.AsyncOpenAI = client
        self.max_tokens = max_tokens
        self.parallel_tool_calls = parallel_tool_calls
        self.cache_key_mode = PromptCacheKeyMode.parse(prompt_cache_key)
        self.sends_cache_key = self.cache_key_mode.allows(self.base_url)
        capabilities = {
            AiCapability.TOOL_CALLING,
            AiCapability.PARALLEL_TOOL_CALLS,
            AiCapability.STREAMING,
            AiCapability.SYSTEM_PROMPT,
            AiCapability.USAGE,
        }
        if self.sends_cache_key:
            capabilities.add(AiCapability.PROMPT_CACHING)
        self.capabilities = frozenset(capabilities)

    @classmethod
    def from_settings(cls, settings: HarnessSettings) -> OpenAIRuntime:
        """The runtime `LLM_RUNTIME=openai` (or `auto` with a configured model) resolves to."""
        return cls(
            settings.groups.runtime.model or "",
            base_url=settings.groups.runtime.base_url,
            api_key=settings.groups.runtime.api_key,
            max_retries=settings.groups.runtime.max_retries,
            timeout=settings.groups.runtime.timeout,
            max_tokens=settings.groups.runtime.max_tokens,
            prompt_cache_key=settings.groups.runtime.prompt_cache_key,
            max_connections=settings.groups.runtime.max_connections,
        )

    def wire_request(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of `chat.completions.create`, i.e. the JSON body sent."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": wire_messages(request),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": dict(tool.parameters),
                    },
                }
                for tool in request.tools
            ]
            if self.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = self.parallel_tool_calls
        if self.max_tokens is not None:
            body["max_completion_tokens"] = self.max_tokens
        hint = request.cache_hint
        if hint is not None and self.sends_cache_key:
            key = hint.resolved_key(request.conversation_id)
            if key:
                body["prompt_cache_key"] = key
        return body

    def send(self, body: dict[str, Any]) -> Awaitable[RawResponse]:
        return self.client.chat.completions.with_raw_response.create(**body)

    def new_turn(self) -> _Turn:
        return _Turn()


def wire_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """Our history as Chat Completions messages, context last (see the module docstring)."""
    out: list[dict[str, Any]] = []
    system = [request.system_prompt] if request.system_prompt else []
    history = paired(request.messages)
    # Leading system messages (a compaction summary) join the system prompt, after it: many
    # chat templates accept one system message, first, and the stable prefix stays in front.
    while history and history[0].role == "system":
        system.append(history.pop(0).content)
    if system:
        out.append({"role": "system", "content": "\n\n".join(system)})
    out.extend(_wire_message(message) for message in history)
    context = context_text(request)
    if context:
        last = out[-1] if out else None
        if last is not None and last["role"] == "user" and isinstance(last["content"], str):
            out[-1] = {**last, "content": f"{last['content']}\n\n{context}"}
        else:
            out.append({"role": "user", "content": context})
    return out


def _wire_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments_json(call.arguments)},
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


@dataclass(slots=True)
class _PartialCall:
    id: str | None = None
    name: str = ""
    arguments: TextPieces = field(default_factory=TextPieces)


class _Turn:
    """Accumulates one streamed completion from its JSON chunks.

    Hand-rolled rather than the SDK's `ChatCompletionStreamState`, which re-serializes its whole
    snapshot on every chunk (quadratic in the answer's length) and assumes OpenAI's exact chunk
    shapes; compatible servers omit a tool call's `index` or `id`, or repeat usage on each chunk.
    """

    def __init__(self) -> None:
        self.text = TextPieces()
        self.calls: dict[int, _PartialCall] = {}
        self.usage = NO_USAGE
        self.finish_reason: str | None = None

    def add(self, chunk: Mapping[str, Any]) -> str:
        """Take one chunk; returns its text delta."""
        usage = chunk.get("usage")
        if usage is not None and isinstance(usage, Mapping):  # (no ABC check a token)
            self.usage = _usage(usage)
        delta_text = ""
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content:
                self.text.append(content)
                delta_text += content
            for part in delta.get("tool_calls") or ():
                self._add_call(part)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return delta_text

    def _add_call(self, part: Mapping[str, Any]) -> None:
        index = part.get("index")
        call_id = part.get("id")
        if not isinstance(index, int):
            # No index: a new id opens a new call, no id continues the last one.
            index = len(self.calls) if call_id or not self.calls else max(self.calls)
        slot = self.calls.setdefault(index, _PartialCall())
        if call_id and not slot.id:
            slot.id = call_id
        function = part.get("function") or {}
        name = function.get("name")
        if name and not slot.name:
            slot.name = name
        fragment = function.get("arguments")
        if fragment:
            slot.arguments.append(fragment)

    def response(self) -> ModelResponse:
        calls = tuple(
            ToolCall(
                slot.name,
                cast(Mapping[str, Any], parse_arguments("".join(slot.arguments))),
                slot.id or new_call_id(),
            )
            for _, slot in sorted(self.calls.items())
        )
        return ModelResponse(
            text="".join(self.text),
            tool_calls=calls,
            usage=self.usage,
            stop_reason=self.finish_reason,
        )


def _usage(usage: Mapping[str, Any]) -> Usage:
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        input_tokens=usage.get("prompt_tokens") or 0,
        output_tokens=usage.get("completion_tokens") or 0,
        cache_read_tokens=details.get("cached_tokens") or 0,
        cache_write_tokens=details.get("cache_write_tokens") or 0,
    )
