"""`AnthropicRuntime`: the Messages API through the official `anthropic` SDK.

Streaming, tool use, usage with cache reads and writes, and a native file surface: Anthropic's
memory tool (`memory_20250818`) served by the conversation's `AgentFileSystem`
(`atmosphere_harness._runtimes.memory_tool`). Retries on 408/409/429/5xx/529 and connection
errors are the SDK's own, bounded by `max_retries`.

Wire decisions:
- the system prompt is one text block, sent unchanged every turn;
- consecutive tool results become one user message of `tool_result` blocks, right after the
  assistant's `tool_use` blocks (the API requires both);
- per-turn context (`ModelRequest.context`) is a text block appended to the final user message,
  after every cache breakpoint, so it never invalidates the cached prefix;
- an enabled `CacheHint` puts `cache_control` on the last tool definition and on the system
  block (`"ttl": "1h"` when the hint is AGGRESSIVE or asks for an hour or more). AGGRESSIVE also
  marks the end of the conversation history (5-minute ttl, after the 1-hour ones as the API
  requires), so a long tool loop re-reads its history from the cache instead of paying for it
  each round. That is three of the four breakpoints the API allows.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

import anthropic
import httpx2

from .._cache import CacheHint, PromptCache
from .._settings import DEFAULT_LLM_TIMEOUT, DEFAULT_MAX_CONNECTIONS, HarnessSettings
from .._tools.base import Tool
from .base import (
    AiCapability,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
    new_call_id,
)
from .memory_tool import memory_tool
from .provider import (
    RawResponse,
    SdkRuntime,
    TextPieces,
    context_text,
    paired,
    parse_arguments,
    pooled_client,
)

DEFAULT_MAX_TOKENS = 8192
ANTHROPIC_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_HOST = "api.anthropic.com"
LOCAL_API_KEY = "unused"
"""Sent to a non-Anthropic base URL (a proxy or a test server) when no key is configured."""


class AnthropicRuntime(SdkRuntime):
    """Claude through the Anthropic Messages API.

    Example:
        ```python
        runtime = AnthropicRuntime("claude-sonnet-4-5")  # key from ANTHROPIC_API_KEY
        app.include_router(create_harness_router(runtime=runtime))
        ```

    Args:
        model: The model name (`claude-sonnet-4-5`, ...).
        base_url: The API root without `/v1` (a trailing `/v1` is dropped); `None` means
            Anthropic (or `ANTHROPIC_BASE_URL`).
        api_key: The key; `None` lets the SDK find one (`ANTHROPIC_API_KEY`,
            `ANTHROPIC_AUTH_TOKEN`, an SDK profile). Anthropic's own API without any credential
            raises `ValueError` here, not on the first call; a server of your own (a proxy, a
            gateway) needs none and gets a placeholder.
        max_retries: Retries of one call on 408/409/429/5xx and connection errors.
        timeout: Seconds to connect, or to wait between two streamed events.
        max_tokens: Output cap per turn (the API requires one).
        max_connections: Connections kept to the server (the HTTP client's pool, all of them
            kept alive between calls): the model calls this runtime streams at once; a call
            beyond it waits for a free one (the SDKs' own pool keeps only 100 alive). Ignored
            with `http_client` or `client`.
        http_client: An `httpx2.AsyncClient` for proxies, custom TLS or tests.
        client: A ready `anthropic.AsyncAnthropic`; the other connection arguments are then
            ignored and the caller closes it.
    """

    name = "anthropic"
    provider = "Anthropic"
    sdk = anthropic
    capabilities = frozenset(
        {
            AiCapability.TOOL_CALLING,
            AiCapability.PARALLEL_TOOL_CALLS,
            AiCapability.STREAMING,
            AiCapability.SYSTEM_PROMPT,
            AiCapability.PROMPT_CACHING,
            AiCapability.USAGE,
            AiCapability.VIRTUAL_FILESYSTEM,
        }
    )

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 2,
        timeout: float = DEFAULT_LLM_TIMEOUT,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        http_client: httpx2.AsyncClient | None = None,
        client: anthropic.AsyncAnthropic | None = None,
    ) -> None:
        if not model or not model.strip():
            raise ValueError(
                "AnthropicRuntime needs a model name: set LLM_MODEL (e.g. claude-sonnet-4-5)"
            )
        owns_client = client is None
        if client is None:
            root = _api_root(base_url)
            target = root or os.environ.get("ANTHROPIC_BASE_URL") or ANTHROPIC_BASE_URL
            has_env_key = os.environ.get("ANTHROPIC_API_KEY") or os.environ.get(
                "ANTHROPIC_AUTH_TOKEN"
            )
            api_key = api_key or None
            if api_key is None and not has_env_key and not _is_anthropic(target):
                api_key = LOCAL_API_KEY
            if http_client is None:
                http_client = pooled_client(anthropic, max_connections)
            client = anthropic.AsyncAnthropic(
                api_key=api_key,
                base_url=root,
                max_retries=max_retries,
                timeout=timeout,
                http_client=http_client,
            )
            if not _has_credentials(client):
                # Without this the SDK builds the client anyway and fails every call with a
                # TypeError ("Could not resolve authentication method"), not a ModelError.
                raise ValueError(
                    "AnthropicRuntime needs an API key for Anthropic: set LLM_API_KEY "
                    "(or ANTHROPIC_API_KEY), or point LLM_BASE_URL at your own server"
                )
        super().__init__(client, model, owns_client=owns_client)
        self.client: anthropic.AsyncAnthropic = client
        self.max_tokens = max_tokens

    @classmethod
    def from_settings(cls, settings: HarnessSettings) -> AnthropicRuntime:
        """The runtime `LLM_RUNTIME=anthropic` (or `auto` with a Claude model) resolves to."""
        return cls(
            settings.groups.runtime.model or "",
            base_url=settings.groups.runtime.base_url,
            api_key=settings.groups.runtime.api_key,
            max_retries=settings.groups.runtime.max_retries,
            timeout=settings.groups.runtime.timeout,
            max_tokens=settings.groups.runtime.max_tokens or DEFAULT_MAX_TOKENS,
            max_connections=settings.groups.runtime.max_connections,
        )

    def native_tools(self, capability: AiCapability) -> Sequence[Tool]:
        """The native file surface: the memory tool over the conversation's `AgentFileSystem`."""
        if capability is AiCapability.VIRTUAL_FILESYSTEM:
            return [memory_tool()]
        return []

    def wire_request(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of `messages.create`, i.e. the JSON body sent."""
        hint = request.cache_hint if request.cache_hint and request.cache_hint.enabled else None
        prefix_control = _cache_control(hint)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        if request.tools:
            tools = [_wire_tool(tool) for tool in request.tools]
            if prefix_control is not None:
                tools[-1] = {**tools[-1], "cache_control": prefix_control}
            body["tools"] = tools
        if request.system_prompt:
            block: dict[str, Any] = {"type": "text", "text": request.system_prompt}
            if prefix_control is not None:
                block["cache_control"] = prefix_control
            body["system"] = [block]
        messages = wire_messages(request.messages)
        if hint is not None and hint.policy is PromptCache.AGGRESSIVE and messages:
            last = messages[-1]["content"][-1]
            messages[-1]["content"][-1] = {**last, "cache_control": {"type": "ephemeral"}}
        context = context_text(request)
        if context:
            if messages and messages[-1]["role"] == "user":
                messages[-1]["content"].append({"type": "text", "text": context})
            else:
                messages.append({"role": "user", "content": [{"type": "text", "text": context}]})
        body["messages"] = messages
        return body

    def send(self, body: dict[str, Any]) -> Awaitable[RawResponse]:
        return self.client.messages.with_raw_response.create(**body)

    def new_turn(self) -> _Turn:
        return _Turn()


def _is_anthropic(url: str) -> bool:
    return urlsplit(url.strip()).hostname == ANTHROPIC_HOST


def _has_credentials(client: anthropic.AsyncAnthropic) -> bool:
    """Whether the SDK found a way to authenticate: a key, a token, or a credentials provider.

    The same sources the SDK's own request-time check accepts (`X-Api-Key` or `Authorization`
    among its default headers, e.g. from `ANTHROPIC_CUSTOM_HEADERS`, or a profile / workload
    identity federation credentials provider).
    """
    if getattr(client, "credentials", None) is not None:
        return True
    return any(
        isinstance(value, str) and value.strip() and name.lower() in ("x-api-key", "authorization")
        for name, value in client.default_headers.items()
    )


def _api_root(base_url: str | None) -> str | None:
    """`LLM_BASE_URL` without a trailing `/v1`: the SDK adds `/v1/messages` itself."""
    if not base_url or not base_url.strip():
        return None
    root = base_url.strip().rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _cache_control(hint: CacheHint | None) -> dict[str, str] | None:
    if hint is None:
        return None
    if hint.long_lived:
        return {"type": "ephemeral", "ttl": "1h"}
    return {"type": "ephemeral"}


def _wire_tool(tool: ToolSpec) -> dict[str, Any]:
    if tool.native is not None:
        return dict(tool.native)
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": dict(tool.parameters),
    }


def wire_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Our history as Messages API turns: strictly alternating, tool results grouped."""
    out: list[dict[str, Any]] = []

    def push(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for message in paired(messages):
        if message.role == "assistant":
            blocks: list[dict[str, Any]] = []
            if message.content:
                blocks.append({"type": "text", "text": message.content})
            blocks.extend(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": dict(call.arguments) if isinstance(call.arguments, Mapping) else {},
                }
                for call in message.tool_calls
            )
            push("assistant", blocks)
        elif message.role == "tool":
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
            if message.content:
                result["content"] = message.content
            push("user", [result])
        elif message.content:
            # The API has no system role inside the conversation: a history summary is user text.
            push("user", [{"type": "text", "text": message.content}])
    return out


@dataclass(slots=True)
class _Block:
    kind: str
    id: str = ""
    name: str = ""
    initial: Any = None
    parts: TextPieces = field(default_factory=TextPieces)


class _Turn:
    """Accumulates one streamed message from its JSON events.

    Hand-rolled rather than the SDK's `MessageStream`, which re-parses a tool call's whole
    partial JSON on every delta (quadratic for a large `create` of a file).
    """

    def __init__(self) -> None:
        self.blocks: dict[int, _Block] = {}
        self.counts: dict[str, int] = {}
        self.stop_reason: str | None = None

    def add(self, event: Mapping[str, Any]) -> str:
        """Take one stream event; returns its text delta."""
        kind = event.get("type")
        if kind == "message_start":
            self._count((event.get("message") or {}).get("usage"))
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            index = event.get("index", len(self.blocks))
            if block.get("type") == "tool_use":
                self.blocks[index] = _Block(
                    "tool_use", block.get("id", ""), block.get("name", ""), block.get("input")
                )
            elif block.get("type") == "text":
                self.blocks[index] = _Block("text")
                text = block.get("text") or ""
                if text:
                    self.blocks[index].parts.append(text)
                return str(text)
        elif kind == "content_block_delta":
            target = self.blocks.get(event.get("index", -1))
            delta = event.get("delta") or {}
            if target is None:
                return ""
            if delta.get("type") == "text_delta" and target.kind == "text":
                text = delta.get("text") or ""
                target.parts.append(text)
                return str(text)
            if delta.get("type") == "input_json_delta":
                target.parts.append(delta.get("partial_json") or "")
        elif kind == "message_delta":
            self.stop_reason = (event.get("delta") or {}).get("stop_reason") or self.stop_reason
            self._count(event.get("usage"))
        return ""

    def _count(self, usage: Any) -> None:
        """Usage fields are cumulative: the latest value of each wins."""
        if not isinstance(usage, Mapping):
            return
        for name in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ):
            value = usage.get(name)
            if isinstance(value, int):
                self.counts[name] = value

    def response(self) -> ModelResponse:
        text: list[str] = []
        calls: list[ToolCall] = []
        for _, block in sorted(self.blocks.items()):
            if block.kind == "text":
                text.append("".join(block.parts))
                continue
            if block.parts:
                arguments = parse_arguments("".join(block.parts))
            else:
                arguments = block.initial if isinstance(block.initial, dict) else {}
            calls.append(
                ToolCall(block.name, cast(Mapping[str, Any], arguments), block.id or new_call_id())
            )
        read = self.counts.get("cache_read_input_tokens", 0)
        written = self.counts.get("cache_creation_input_tokens", 0)
        usage = Usage(
            # Anthropic's input_tokens excludes the cached part; ours counts every input token,
            # as OpenAI's prompt_tokens does, so runs on either provider add up the same way.
            input_tokens=self.counts.get("input_tokens", 0) + read + written,
            output_tokens=self.counts.get("output_tokens", 0),
            cache_read_tokens=read,
            cache_write_tokens=written,
        )
        return ModelResponse(
            text="".join(text),
            tool_calls=tuple(calls),
            usage=usage,
            stop_reason=self.stop_reason,
        )
