"""Glob patterns over store-relative paths, with one documented meaning.

- A pattern matches the whole relative path (`*.py` matches `a.py`, not `src/a.py`).
- `*` matches any run of characters except `/`; `?` one character except `/`.
- `**` as a whole segment matches zero or more directories, so `**/*.md` matches `a.md` *and*
  `docs/b.md`; `src/**` matches everything below `src`.
- `**` inside a segment crosses `/`: `**.md` matches every `.md` file at any depth.
- `[abc]`, `[a-z]`, `[!abc]` (or `[^abc]`) match one character, never `/`.
- `{a,b}` matches either alternative (alternatives may nest and contain `/`).
- `\\` makes the next character literal. Dot-files get no special treatment.

Python's `fnmatch` lets `*` cross `/`, and `glob`'s `**` rules differ between versions, so the
pattern is translated to a regular expression here.
"""

from __future__ import annotations

import functools
import re

from .._errors import FileSystemError

_MAGIC = frozenset("*?[{\\")


class _Translator:
    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.index = 0

    def fail(self) -> FileSystemError:
        return FileSystemError(f"Invalid glob pattern: {self.pattern}")

    def at_segment_start(self, start: int) -> bool:
        return start == 0 or self.pattern[start - 1] in "/{,"

    def translate(self, depth: int = 0) -> str:
        """Translate up to the end, or (inside braces) up to the `,` or `}` that ends it."""
        pattern = self.pattern
        out: list[str] = []
        while self.index < len(pattern):
            char = pattern[self.index]
            if depth and char in ",}":
                return "".join(out)
            start = self.index
            self.index += 1
            if char == "*":
                if self.index < len(pattern) and pattern[self.index] == "*":
                    while self.index < len(pattern) and pattern[self.index] == "*":
                        self.index += 1
                    after = pattern[self.index] if self.index < len(pattern) else ""
                    whole = self.at_segment_start(start) and after in ("", "/", ",", "}")
                    if whole and after == "/":
                        self.index += 1
                        out.append("(?:[^/]+/)*")
                    else:
                        out.append(".*")
                else:
                    out.append("[^/]*")
            elif char == "?":
                out.append("[^/]")
            elif char == "[":
                out.append(self.char_class())
            elif char == "{":
                out.append(self.alternatives(depth))
            elif char == "\\":
                if self.index >= len(pattern):
                    raise self.fail()
                out.append(re.escape(pattern[self.index]))
                self.index += 1
            else:
                out.append(re.escape(char))
        if depth:
            raise self.fail()
        return "".join(out)

    def char_class(self) -> str:
        pattern = self.pattern
        index = self.index
        negate = index < len(pattern) and pattern[index] in "!^"
        if negate:
            index += 1
        members: list[str] = []
        first = True
        while True:
            if index >= len(pattern):
                raise self.fail()
            char = pattern[index]
            if char == "]" and not first:
                break
            if char == "\\" and index + 1 < len(pattern):
                index += 1
                members.append(re.escape(pattern[index]))
            elif (
                char == "-" and not first and index + 1 < len(pattern) and pattern[index + 1] != "]"
            ):
                members.append("-")
            else:
                members.append(re.escape(char))
            first = False
            index += 1
        self.index = index + 1
        body = "".join(members)
        return f"(?!/)[{'^' if negate else ''}{body}]"

    def alternatives(self, depth: int) -> str:
        options: list[str] = []
        while True:
            options.append(self.translate(depth + 1))
            if self.index >= len(self.pattern):
                raise self.fail()
            closing = self.pattern[self.index]
            self.index += 1
            if closing == "}":
                return "(?:" + "|".join(options) + ")"


@functools.lru_cache(maxsize=256)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """The compiled matcher of `pattern` (use `fullmatch` on a relative path)."""
    if not pattern.strip():
        raise FileSystemError("pattern must not be blank")
    if pattern.startswith("/"):
        raise FileSystemError(
            f"glob patterns are relative to the workspace root (drop the leading '/'): {pattern}"
        )
    translator = _Translator(pattern)
    source = translator.translate()
    try:
        return re.compile(source, re.DOTALL)
    except re.error:
        raise translator.fail() from None


def literal_prefix(pattern: str) -> str:
    """The leading directories of `pattern` that contain no glob syntax (where a walk starts)."""
    segments = pattern.split("/")[:-1]
    kept: list[str] = []
    for segment in segments:
        if not segment or segment in (".", "..") or _MAGIC & set(segment):
            break
        kept.append(segment)
    return "/".join(kept)
