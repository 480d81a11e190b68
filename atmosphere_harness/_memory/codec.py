"""The stored form of one conversation message: compact JSON, packed with bz2 when that pays.

The history keeps every message it is given (tool results, small files the model wrote; a large
`write_file` content is kept as a note, see `filesystem.tools.written_note`), so the bytes it adds
per byte the model wrote decide how much disk a long session costs. A turn is
stored as plain JSON first (fast, on the request path); large payloads are packed afterwards, off
the request path (see `SqliteHistory`). bz2 is the codec because, on model-written text and
code, it stores the fewest bytes of the standard library's codecs (about a fifth of the input,
where zlib keeps about a quarter); its slower reads are rare, since recent messages are served
from memory.
"""

from __future__ import annotations

import bz2
import functools
import json
from collections.abc import Mapping
from typing import Any

from .._jsontext import compact_json
from .._runtimes.base import Message, ToolCall

PLAIN = 0
BZ2 = 2

PACK_FROM = 1024
"""Payloads shorter than this (bytes) stay plain: packing them would save next to nothing."""


def dump_message(message: Message) -> dict[str, Any]:
    """A message as a JSON-ready dict with short keys (only the fields it uses).

    A call's arguments are stored as the model sent them: usually an object, but a model that
    emits malformed JSON leaves them as text (or another JSON value), which the executor answered
    with `invalid_arguments`; the turn must still be stored, pairs intact.
    """
    data: dict[str, Any] = {"r": message.role, "c": message.content}
    if message.tool_calls:
        data["t"] = [
            [call.id, call.name, _arguments(call.arguments)] for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        data["i"] = message.tool_call_id
    if message.name is not None:
        data["n"] = message.name
    return data


def _arguments(arguments: object) -> object:
    return dict(arguments) if isinstance(arguments, Mapping) else arguments


def load_message(data: dict[str, Any]) -> Message:
    calls = tuple(ToolCall(name, arguments, id) for id, name, arguments in data.get("t", ()))
    return Message(
        data["r"], data.get("c", ""), calls, tool_call_id=data.get("i"), name=data.get("n")
    )


def encode(message: Message) -> bytes:
    """The plain stored form (UTF-8 JSON)."""
    data = dump_message(message)
    try:
        return _json(data, ascii_only=False).encode()
    except UnicodeEncodeError:
        # A lone surrogate from the model (valid JSON, not UTF-8): ASCII escapes keep it exactly.
        return _json(data, ascii_only=True).encode()


def encode_text(message: Message) -> str:
    """`encode` before its UTF-8 step, for a driver that sends text: JSON that always encodes
    (control characters are escaped, so it holds no NUL either)."""
    data = dump_message(message)
    text = _json(data, ascii_only=False)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            return _json(data, ascii_only=True)
    return text


def encode_ascii(message: Message) -> str:
    """`encode`'s JSON with every non-ASCII character escaped: text any server encoding holds
    as it is (PostgreSQL turns it into the stored UTF-8 bytes with `convert_to`, whatever the
    database's encoding), and a lone surrogate survives as its escape."""
    return _json(dump_message(message), ascii_only=True)


def _json(data: dict[str, Any], *, ascii_only: bool) -> str:
    return _ASCII(data) if ascii_only else _TEXT(data)


_TEXT = compact_json(ascii_only=False, default=str)
_ASCII = compact_json(ascii_only=True, default=str)


def pack(payload: bytes) -> bytes | None:
    """The bz2 form of a plain payload, or `None` when it would not save a tenth."""
    if len(payload) < PACK_FROM:
        return None
    packed = bz2.compress(payload, 9)
    return packed if len(packed) * 10 <= len(payload) * 9 else None


def decode(codec: int, payload: bytes) -> Message:
    raw = bz2.decompress(payload) if codec == BZ2 else payload
    data: dict[str, Any] = json.loads(raw)
    return load_message(data)


DECODED = 2048
"""Plain payloads `decode_plain` keeps decoded, the latest used."""
DECODED_MAX_BYTES = 4096
"""Larger payloads are decoded each time, so the kept ones take at most `DECODED` times this."""


def decode_plain(payload: bytes) -> Message:
    """`decode(PLAIN, payload)`, kept for the next read of the same bytes. On PostgreSQL and
    Redis a run's first history read returns its conversation's newest messages, most of which
    the previous turn's read decoded already: decoding them again was a quarter of the
    instructions PostgreSQL added to a turn. The same bytes are always the same message and a
    `Message` is immutable, so every read may share it; rows are still read every time, so
    another replica's turn is seen."""
    if len(payload) > DECODED_MAX_BYTES:
        return decode(PLAIN, payload)
    return _decoded(payload)


@functools.lru_cache(maxsize=DECODED)
def _decoded(payload: bytes) -> Message:
    return decode(PLAIN, payload)
