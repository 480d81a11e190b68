"""The grep engine: Python regular expressions, line by line, with a real deadline.

Semantics are fixed and do not depend on the machine: the pattern is a Python `re` pattern
(validated by `re.compile`, so exactly `re`'s syntax is accepted), searched in each line the way
`re.search(pattern, line)` would; lines end at `\\n`, `\\r\\n` or `\\r`. No external program is
ever run, so installing ripgrep changes nothing.

Speed without changing the meaning:

- A pattern with no regex syntax is a literal, found with `bytes.find` in the file's raw bytes;
  only a file that contains it is checked for valid UTF-8 (ASCII needs no decoding) and split
  into lines. UTF-8 is self-synchronizing, so a byte match is exactly a character match.
- Any other pattern is searched over the whole file (multiline mode) to find candidate lines,
  and each candidate is confirmed with a per-line search. For patterns without `\\A`, `\\Z`,
  lookaround or negated inline flags, every line that matches on its own also yields a
  whole-file match at or before it, so the candidates miss nothing, and the confirmation drops
  the cross-line false positives. Patterns with those constructs are searched line by line.

Plain `re` cannot be interrupted, so matching runs on the `regex` package (in its `re`-compatible
`VERSION0` mode) whose `timeout=` really stops catastrophic backtracking mid-match. One grep call
has `GREP_DEADLINE_SECONDS` in total.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import AnyStr

import regex

from .._errors import FileSystemError, GrepTimeout
from .base import GrepHit

MAX_PATTERN_CHARS = 512
MAX_LINE_CHARS = 500
GREP_DEADLINE_SECONDS = 2.0

_REGEX_SYNTAX = frozenset(".^$*+?{}[]\\|()")
_LINE_UNSAFE = re.compile(r"\\[AZz]|\(\?<?[=!]|\(\?[a-zA-Z]*-")
"""Constructs whose meaning differs between a line on its own and the line inside its file."""


@dataclass(frozen=True, slots=True)
class LinePattern:
    """A compiled grep pattern."""

    source: str
    literal: bytes | None
    candidates: regex.Pattern[str] | None
    line: regex.Pattern[str] | None


def compile_pattern(pattern: str) -> LinePattern:
    """Validate and compile `pattern`, or raise `FileSystemError` with the model-facing reason."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise FileSystemError("pattern must not be blank")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise FileSystemError(f"Pattern too long: {len(pattern)} chars (limit {MAX_PATTERN_CHARS})")
    if not _REGEX_SYNTAX & set(pattern):
        return LinePattern(pattern, pattern.encode("utf-8", "surrogatepass"), None, None)
    try:
        re.compile(pattern)
        line = regex.compile(pattern, regex.VERSION0)
        candidates = (
            None
            if _LINE_UNSAFE.search(pattern)
            else regex.compile(pattern, regex.VERSION0 | regex.MULTILINE)
        )
    except (re.error, regex.error) as exc:
        reason = getattr(exc, "msg", None) or str(exc)
        raise FileSystemError(f"Invalid regex pattern: {pattern} ({reason})") from None
    return LinePattern(pattern, None, candidates, line)


def normalize_newlines(text: str) -> str:
    """`\\r\\n` and lone `\\r` become `\\n`, so line numbers agree with every line reader."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def search_file(
    pattern: LinePattern, data: bytes, limit: int, deadline: Deadline
) -> list[tuple[int, str]] | None:
    """Matching lines of a file's bytes, or `None` when the file is not UTF-8 text."""
    literal = pattern.literal
    if literal is None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return search_text(pattern, text, limit, deadline)
    if b"\n" in literal or b"\r" in literal or data.find(literal) < 0:
        return []
    if not _is_utf8(data):
        return None
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    found = _scan(data, b"\n", limit, lambda pos: data.find(literal, pos), None, None)
    return [(number, line.decode("utf-8")) for number, line in found]


def grep_hits(
    pattern: LinePattern, path: str, data: bytes, limit: int, deadline: Deadline
) -> list[GrepHit] | None:
    """`search_file`'s hits as `GrepHit`s of `path`, lines clipped (`None`: not UTF-8 text).

    A literal in a file without `\r` (the common case) takes one loop that goes from hit to
    hit with C-level `bytes` calls and builds each hit at once: a grep with thousands of hits
    spends most of its Python time per hit, and this path spends the least there.
    """
    literal = pattern.literal
    if literal is not None and b"\n" not in literal and b"\r" not in literal:
        pos = data.find(literal)
        if pos < 0:
            return []
        if not _is_utf8(data):
            return None
        if b"\r" not in data:
            return _literal_hits(path, data, literal, pos, limit)
    found = search_file(pattern, data, limit, deadline)
    return None if found is None else [GrepHit(path, n, clip(line)) for n, line in found]


def _literal_hits(path: str, data: bytes, literal: bytes, pos: int, limit: int) -> list[GrepHit]:
    """`grep_hits` for a literal first found at `pos` in UTF-8 `data` with `\n` lines only.

    Per hit: the line's ends (`rfind`/`find` of `\n`, both `memchr`), the newlines since the
    previous hit's line, the line decoded, the hit built. A line of at most `MAX_LINE_CHARS` bytes
    has at most as many characters, so only longer ones are measured.

    The newlines are counted one of two ways, whichever is cheaper for the lines seen so far.
    `bytes.count` of one byte is a plain loop over every byte (about 2.4 GB/s); deleting the
    newlines from the span with `bytes.replace` and comparing lengths finds each newline with
    `memchr` instead, which costs per newline, not per byte: twice as fast for 64-byte lines,
    four times for 1 KiB ones, slower below about 40 bytes a line. So `count` is used while the
    file's lines up to here average at most `_SPARSE_LINE_BYTES`, `replace` once they average
    more; judging by the whole prefix rather than the last span keeps a file that alternates
    short and long runs from paying the slow way for long.
    """
    hits: list[GrepHit] = []
    append = hits.append
    find, rfind, count = data.find, data.rfind, data.count
    new, set_path, set_line, set_text = _new_hit, _set_path, _set_line, _set_text
    number = 1
    counted = 0
    for _ in range(limit):
        start = rfind(b"\n", 0, pos) + 1
        end = find(b"\n", pos)
        if end < 0:
            end = len(data)
        if (number - 1) * _SPARSE_LINE_BYTES < counted:
            span = data[counted:start]
            number += len(span) - len(span.replace(b"\n", b""))
        else:
            number += count(b"\n", counted, start)
        counted = start
        line = data[start:end].decode()
        if end - start > MAX_LINE_CHARS and len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + "…"
        hit = new(GrepHit)
        set_path(hit, path)
        set_line(hit, number)
        set_text(hit, line)
        append(hit)
        pos = find(literal, end + 1)
        if pos < 0:
            break
    return hits


_SPARSE_LINE_BYTES = 48
"""Above this many bytes per line on average, `_literal_hits` counts newlines with `replace`."""

_new_hit = GrepHit.__new__
_set_path: Callable[[GrepHit, str], None] = GrepHit.__dict__["path"].__set__
_set_line: Callable[[GrepHit, int], None] = GrepHit.__dict__["line"].__set__
_set_text: Callable[[GrepHit, str], None] = GrepHit.__dict__["text"].__set__
"""`GrepHit(path, line, text)` without its generated `__init__`: a frozen dataclass sets each
field through `object.__setattr__`, twice the cost of writing the three slots directly, which
shows at thousands of hits. `test_literal_hits_are_plain_grep_hits` keeps this in step with the
class's fields."""


def _is_utf8(data: bytes) -> bool:
    """Whether `data` is UTF-8 text (ASCII is checked without decoding)."""
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def clip(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + "…"


class Deadline:
    """Wall-clock budget of one grep call."""

    def __init__(self, pattern: str, seconds: float | None = None) -> None:
        self.pattern = pattern
        self.seconds = GREP_DEADLINE_SECONDS if seconds is None else seconds
        self.expires = time.monotonic() + self.seconds

    def remaining(self) -> float:
        left = self.expires - time.monotonic()
        if left <= 0:
            raise self.expired()
        return left

    def expired(self) -> GrepTimeout:
        millis = round(self.seconds * 1000)
        return GrepTimeout(
            f"grep timed out on pattern '{self.pattern}' — simplify the pattern "
            f"(catastrophic backtracking is cut off after {millis} ms)"
        )


def search_text(
    pattern: LinePattern, text: str, limit: int, deadline: Deadline
) -> list[tuple[int, str]]:
    """Up to `limit` `(line number, line)` pairs of `text` matching `pattern`, in order."""
    text = normalize_newlines(text)
    if pattern.literal is not None:
        literal = pattern.literal.decode("utf-8", "surrogatepass")
        if "\n" in literal or "\r" in literal:
            return []
        return _scan(text, "\n", limit, lambda pos: text.find(literal, pos), None, None)
    assert pattern.line is not None
    try:
        if pattern.candidates is None:
            return _per_line(pattern.line, text, limit, deadline)
        candidates = pattern.candidates

        def find(pos: int) -> int:
            match = candidates.search(text, pos, timeout=deadline.remaining())
            return -1 if match is None else match.start()

        return _scan(text, "\n", limit, find, pattern.line, deadline)
    except TimeoutError:
        raise deadline.expired() from None


def _scan(
    text: AnyStr,
    newline: AnyStr,
    limit: int,
    find: Callable[[int], int],
    confirm: regex.Pattern[str] | None,
    deadline: Deadline | None,
) -> list[tuple[int, AnyStr]]:
    """Jump from candidate to candidate; each hit line is reported once, in order."""
    hits: list[tuple[int, AnyStr]] = []
    size = len(text)
    rfind, lfind, count = text.rfind, text.find, text.count
    pos = 0
    line_number = 1
    counted = 0
    while pos < size and len(hits) < limit:
        found = find(pos)
        if found < 0:
            break
        start = rfind(newline, 0, found) + 1
        if start >= size:
            break  # a zero-width match after the final newline: there is no line there
        end = lfind(newline, found)
        if end < 0:
            end = size
        line_number += count(newline, counted, start)
        counted = start
        line = text[start:end]
        if confirm is None or (
            deadline is not None
            and isinstance(line, str)
            and confirm.search(line, timeout=deadline.remaining())
        ):
            hits.append((line_number, line))
        pos = end + 1
    return hits


def _per_line(
    pattern: regex.Pattern[str], text: str, limit: int, deadline: Deadline
) -> list[tuple[int, str]]:
    hits: list[tuple[int, str]] = []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        if pattern.search(line, timeout=deadline.remaining()):
            hits.append((number, line))
            if len(hits) >= limit:
                break
    return hits
