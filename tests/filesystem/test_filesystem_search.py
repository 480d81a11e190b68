"""Glob semantics, grep semantics and the grep deadline; the fast grep equals a naive one."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from atmosphere_harness import FileSystemLimits, WorkspaceAgentFileSystem
from atmosphere_harness._errors import FileSystemError
from atmosphere_harness._filesystem import GrepHit
from atmosphere_harness._filesystem import search as search_module
from atmosphere_harness._filesystem.globbing import compile_glob
from atmosphere_harness._filesystem.search import (
    Deadline,
    compile_pattern,
    search_file,
    search_text,
)
from tests.fs_support import rejects

PATHS = [
    "a.md",
    ".hidden.md",
    "b.py",
    "docs/c.md",
    "docs/deep/d.md",
    "docs/e.txt",
    "src/app/main.py",
    "src/test/test_main.py",
    "x1.txt",
    "x2.txt",
    "xa.txt",
]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("*.md", ["a.md", ".hidden.md"]),
        ("**/*.md", ["a.md", ".hidden.md", "docs/c.md", "docs/deep/d.md"]),
        ("**.md", ["a.md", ".hidden.md", "docs/c.md", "docs/deep/d.md"]),
        ("docs/*", ["docs/c.md", "docs/e.txt"]),
        ("docs/**", ["docs/c.md", "docs/deep/d.md", "docs/e.txt"]),
        ("docs/**/*.md", ["docs/c.md", "docs/deep/d.md"]),
        ("src/**/test_*.py", ["src/test/test_main.py"]),
        ("**", PATHS),
        ("x?.txt", ["x1.txt", "x2.txt", "xa.txt"]),
        ("x[0-9].txt", ["x1.txt", "x2.txt"]),
        ("x[!0-9].txt", ["xa.txt"]),
        ("x[^0-9].txt", ["xa.txt"]),
        ("{a,b}.*", ["a.md", "b.py"]),
        ("{docs/{c,e},src/app/main}.*", ["docs/c.md", "docs/e.txt", "src/app/main.py"]),
        ("**/*.{md,py}", [p for p in PATHS if p.endswith((".md", ".py"))]),
        ("a\\.md", ["a.md"]),
        ("docs?c.md", []),
        ("docs[/]c.md", []),
        ("*", ["a.md", ".hidden.md", "b.py", "x1.txt", "x2.txt", "xa.txt"]),
    ],
)
def test_glob_semantics(pattern: str, expected: list[str]) -> None:
    matcher = compile_glob(pattern)
    assert [path for path in PATHS if matcher.fullmatch(path)] == expected


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("[ab", "Invalid glob pattern: [ab"),
        ("{a,b", "Invalid glob pattern: {a,b"),
        ("x[z-a]", "Invalid glob pattern: x[z-a]"),
        ("trailing\\", "Invalid glob pattern: trailing\\"),
        (" ", "pattern must not be blank"),
        ("/abs/*.md", "glob patterns are relative to the workspace root"),
    ],
)
def test_invalid_globs_are_explained(pattern: str, message: str) -> None:
    with pytest.raises(FileSystemError, match=re.escape(message)):
        compile_glob(pattern)


@pytest.fixture
def store(tmp_path: Path) -> WorkspaceAgentFileSystem:
    return WorkspaceAgentFileSystem(tmp_path / "store")


async def test_grep_line_endings_truncation_and_regex_features(
    store: WorkspaceAgentFileSystem,
) -> None:
    await store.write("crlf.txt", "one\r\ntwo hit\r\nthree\rfour hit\nfive")
    await store.write("long.txt", "hit " + "x" * 600)
    assert await store.grep("hit") == [
        GrepHit("crlf.txt", 2, "two hit"),
        GrepHit("crlf.txt", 4, "four hit"),
        GrepHit("long.txt", 1, "hit " + "x" * 496 + "…"),
    ]
    assert await store.grep(r"^f\w+ hit$") == [GrepHit("crlf.txt", 4, "four hit")]
    assert await store.grep("(?i)TWO") == [GrepHit("crlf.txt", 2, "two hit")]
    assert await store.grep(r"(?<=two )hit") == [GrepHit("crlf.txt", 2, "two hit")]
    assert await store.grep(r"\Afive\Z") == [GrepHit("crlf.txt", 5, "five")]
    assert await store.grep(r"three.four") == [], "lines are searched one at a time"


async def test_grep_skips_undecodable_oversized_and_linked_files(tmp_path: Path) -> None:
    store = WorkspaceAgentFileSystem(tmp_path / "s", FileSystemLimits(max_file_bytes=100))
    await store.write("ok.txt", "needle")
    (store.root / "bin.dat").write_bytes(b"needle \xff\xfe")
    (store.root / "big.txt").write_text("needle " * 50)
    (store.root / "link.txt").symlink_to(store.root / "ok.txt")
    assert await store.grep("needle") == [GrepHit("ok.txt", 1, "needle")]


async def test_grep_stops_at_the_hit_cap(tmp_path: Path) -> None:
    store = WorkspaceAgentFileSystem(tmp_path / "s", FileSystemLimits(max_grep_hits=5))
    await store.write("a.txt", "hit\n" * 4)
    await store.write("b.txt", "hit\n" * 4)
    hits = await store.grep("hit")
    assert [(hit.path, hit.line) for hit in hits] == [
        ("a.txt", 1),
        ("a.txt", 2),
        ("a.txt", 3),
        ("a.txt", 4),
        ("b.txt", 1),
    ]


async def test_grep_pattern_errors(store: WorkspaceAgentFileSystem) -> None:
    with rejects("pattern must not be blank"):
        await store.grep("  ")
    with rejects("Pattern too long: 513 chars (limit 512)"):
        await store.grep("a" * 513)
    with rejects("Invalid regex pattern: a{2,1} (", prefix=True):
        await store.grep("a{2,1}")
    with rejects("Invalid regex pattern: \\G", prefix=True):
        await store.grep(r"\G"), "only Python re syntax is accepted"


@pytest.mark.parametrize("pattern", [r"(a|aa)+$", r"(a|a)+$", r"(?<=x)(a|aa)+$"])
async def test_catastrophic_backtracking_is_cut_off(
    store: WorkspaceAgentFileSystem, monkeypatch: pytest.MonkeyPatch, pattern: str
) -> None:
    monkeypatch.setattr(search_module, "GREP_DEADLINE_SECONDS", 0.3)
    await store.write("evil.txt", "x" + "a" * 60 + "!\n")
    with pytest.raises(FileSystemError) as raised:
        await asyncio.wait_for(store.grep(pattern), 60)
    assert str(raised.value) == (
        f"grep timed out on pattern '{pattern}' — simplify the pattern "
        "(catastrophic backtracking is cut off after 300 ms)"
    )


# --- the fast paths change nothing -----------------------------------------------------------

PIECES = [
    "a", "b", "ab", " ", "x", ".", "a*", "b+", "a?", r"\s", r"\S", r"\w", r"\W", r"\d", "^", "$",
    r"\b", r"\B", "[ab]", "[^a]", "(a|b)", "(?:ab)+", r"(?<=a)", r"(?<!b)", "(?=a)", "(?!b)",
    r"\A", r"\Z", r"\n", "[\\s\\S]", "(?s:.)", "(?i:A)", "(?m:^)", "(?-i:a)",
]  # fmt: skip


def naive_grep(pattern: str, text: str, limit: int, engine: object = re) -> list[tuple[int, str]]:
    """Atmosphere's Java harness's semantics: split into lines, search each one."""
    lines = re.split(r"\r\n|\r|\n", text)
    if lines and lines[-1] == "":
        lines.pop()
    compiled = engine.compile(pattern)  # type: ignore[attr-defined]
    return [(i, line) for i, line in enumerate(lines, 1) if compiled.search(line)][:limit]


@settings(max_examples=2000, deadline=None)
@given(
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=5).map("".join),
    st.text(alphabet="ab x\n\r1", max_size=40),
    st.integers(min_value=1, max_value=6),
)
def test_grep_equals_the_naive_line_by_line_search(pattern: str, text: str, limit: int) -> None:
    try:
        re.compile(pattern)
    except re.error:
        return
    if not pattern.strip():
        return
    expected = naive_grep(pattern, text, limit)
    if naive_grep(pattern, text, limit, regex) != expected:
        # The engines themselves differ (only `\B` on an empty line, which `re` matches
        # from Python 3.14 on, as `regex` always did); that is not the search's doing.
        assert r"\B" in pattern
        return
    compiled = compile_pattern(pattern)
    assert search_text(compiled, text, limit, Deadline(pattern)) == expected
    assert search_file(compiled, text.encode(), limit, Deadline(pattern)) == expected


@settings(max_examples=1000, deadline=None)
@given(
    st.text(alphabet="ab_x", min_size=1, max_size=4),
    st.text(alphabet="ab_xé \n\r", max_size=60),
)
def test_literal_grep_equals_the_naive_search(literal: str, text: str) -> None:
    compiled = compile_pattern(literal)
    assert compiled.literal == literal.encode()
    expected = naive_grep(re.escape(literal), text, 100)
    assert search_text(compiled, text, 100, Deadline(literal)) == expected
    assert search_file(compiled, text.encode(), 100, Deadline(literal)) == expected


@settings(max_examples=1000, deadline=None)
@given(
    st.text(alphabet="ab_x", min_size=1, max_size=4),
    st.text(alphabet="ab_xé \n\r", max_size=60),
    st.integers(min_value=1, max_value=6),
    st.booleans(),
)
def test_grep_hits_equals_the_naive_search(
    literal: str, text: str, limit: int, long_lines: bool
) -> None:
    """`grep_hits` (the workspace's path, with its literal fast path) = the naive search, cut."""
    if long_lines:  # lines past MAX_LINE_CHARS are clipped the same way on every path
        text = text.replace("x", "x" * 300)
    compiled = compile_pattern(literal)
    expected = [
        GrepHit("f.md", number, search_module.clip(line))
        for number, line in naive_grep(re.escape(literal), text, limit)
    ]
    assert search_module.grep_hits(compiled, "f.md", text.encode(), limit, Deadline(literal)) == (
        expected
    )


def test_grep_hits_skips_a_file_that_is_not_utf8() -> None:
    for pattern in ("needle", "need.e"):
        found = search_module.grep_hits(
            compile_pattern(pattern), "bin", b"needle \xff\xfe", 10, Deadline(pattern)
        )
        assert found is None


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=160), st.booleans()), min_size=1, max_size=60
    ),
    st.booleans(),
    st.integers(min_value=1, max_value=80),
)
def test_literal_hits_number_lines_of_any_length(
    lines: list[tuple[int, bool]], final_newline: bool, limit: int
) -> None:
    """Short and long lines mixed, so both of `_literal_hits`' ways of counting newlines (a
    `count` while lines average at most `_SPARSE_LINE_BYTES`, deleting them with `replace`
    once they average more) switch back and forth within one file."""
    text = "\n".join(("a" * width + " NEEDLE é") if hit else "é" * width for width, hit in lines)
    text += "\n" if final_newline else ""
    compiled = compile_pattern("NEEDLE")
    expected = [
        GrepHit("f.md", number, search_module.clip(line))
        for number, line in naive_grep("NEEDLE", text, limit)
    ]
    assert search_module.grep_hits(compiled, "f.md", text.encode(), limit, Deadline("NEEDLE")) == (
        expected
    )


def test_literal_hits_are_plain_grep_hits() -> None:
    """The literal path writes `GrepHit`'s slots directly; its hits are the same objects the
    dataclass builds (equal, same hash and repr, still frozen), for the fields it has now."""
    assert [field.name for field in dataclasses.fields(GrepHit)] == ["path", "line", "text"]
    data = ("x" * 100 + "\n") * 3 + "x needle\n"
    found = search_module.grep_hits(
        compile_pattern("needle"), "d/f.md", data.encode(), 10, Deadline("needle")
    )
    assert found is not None
    [hit] = found
    made = GrepHit("d/f.md", 4, "x needle")
    assert type(hit) is GrepHit
    assert (hit, hash(hit), repr(hit)) == (made, hash(made), repr(made))
    with pytest.raises(dataclasses.FrozenInstanceError):
        hit.line = 5  # type: ignore[misc]
