"""The stored form of one conversation message: compact JSON, zlib-compressed when that pays.

The history keeps every message in full (a `write_file` call holds the whole file it wrote), so
the bytes it adds per byte the model wrote decide how much disk a long session costs. Large
payloads are compressed; small ones stay plain, where compression would only add CPU.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from ..runtimes.base import Message, ToolCall

PLAIN = 0
ZLIB = 1

COMPRESS_FROM = 512
"""Payloads shorter than this (bytes) are stored as they are."""
ZLIB_LEVEL = 6


def dump_message(message: Message) -> dict[str, Any]:
    """A message as a JSON-ready dict with short keys (only the fields it uses)."""
    data: dict[str, Any] = {"r": message.role, "c": message.content}
    if message.tool_calls:
        data["t"] = [[call.id, call.name, dict(call.arguments)] for call in message.tool_calls]
    if message.tool_call_id is not None:
        data["i"] = message.tool_call_id
    if message.name is not None:
        data["n"] = message.name
    return data


def load_message(data: dict[str, Any]) -> Message:
    calls = tuple(ToolCall(name, arguments, id) for id, name, arguments in data.get("t", ()))
    return Message(
        data["r"], data.get("c", ""), calls, tool_call_id=data.get("i"), name=data.get("n")
    )


def encode(message: Message) -> tuple[int, bytes]:
    """`(codec, payload)`: zlib when it saves at least a tenth, plain JSON otherwise."""
    raw = json.dumps(dump_message(message), ensure_ascii=False, separators=(",", ":")).encode()
    if len(raw) >= COMPRESS_FROM:
        packed = zlib.compress(raw, ZLIB_LEVEL)
        if len(packed) * 10 <= len(raw) * 9:
            return ZLIB, packed
    return PLAIN, raw


def decode(codec: int, payload: bytes) -> Message:
    raw = zlib.decompress(payload) if codec == ZLIB else payload
    data: dict[str, Any] = json.loads(raw)
    return load_message(data)
