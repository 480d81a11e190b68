"""The eight file tools through the real executor: shapes, outputs, errors, read windows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atmosphere_harness import AgentFileSystem, ToolKind, WorkspaceAgentFileSystem
from atmosphere_harness._filesystem import AgentFileSystemProvider, FileSystemLimits
from atmosphere_harness._filesystem import workspace as workspace_module
from atmosphere_harness._filesystem.tools import (
    FILE_TOOL_NAMES,
    UNAVAILABLE,
    _span,
    _span_by_lines,
    file_tools,
    read_window,
)
from tests.fs_support import Harnessed, tree


@pytest.fixture
def fs(tmp_path: Path) -> WorkspaceAgentFileSystem:
    return WorkspaceAgentFileSystem(tmp_path / "store", FileSystemLimits(max_file_bytes=1000))


@pytest.fixture
def harness(fs: WorkspaceAgentFileSystem, tmp_path: Path) -> Harnessed:
    return Harnessed(fs, tmp_path)


def test_eight_tools_with_their_kinds_and_schemas() -> None:
    tools = file_tools()
    assert [tool.name for tool in tools] == list(FILE_TOOL_NAMES)
    assert {tool.name: tool.kind for tool in tools} == {
        "ls": ToolKind.READ,
        "read_file": ToolKind.READ,
        "write_file": ToolKind.EDIT,
        "edit_file": ToolKind.EDIT,
        "glob": ToolKind.READ,
        "grep": ToolKind.READ,
        "delete": ToolKind.DELETE,
        "rename": ToolKind.EDIT,
    }
    required = {tool.name: tool.parameters["required"] for tool in tools}
    assert required == {
        "ls": [],
        "read_file": ["path"],
        "write_file": ["path", "content"],
        "edit_file": ["path", "old_text", "new_text"],
        "glob": ["pattern"],
        "grep": ["pattern"],
        "delete": ["path"],
        "rename": ["old_path", "new_path"],
    }
    for tool in tools:
        assert tool.origin == "filesystem"
        assert tool.parameters["additionalProperties"] is False
        assert tool.description
    schema = {tool.name: tool.parameters["properties"] for tool in tools}
    assert set(schema["read_file"]) == {"path", "offset", "limit"}
    assert schema["edit_file"]["replace_all"]["type"] == "boolean"
    assert "500 hits" in next(t for t in tools if t.name == "grep").description


async def test_write_read_and_ls_outputs(harness: Harnessed) -> None:
    assert await harness.call("write_file", path="notes/a.md", content="hello") == (
        "Wrote notes/a.md"
    )
    assert await harness.call("read_file", path="notes/a.md") == "hello"
    assert await harness.call("ls") == "notes/"
    assert await harness.call("ls", dir="notes") == "notes/a.md (5 bytes)"
    assert await harness.call("ls", dir="empty") == "(empty)"
    assert await harness.call("write_file", path=" spaced.md ", content="") == (
        "Wrote  spaced.md "
    ), "the path is echoed as given"


async def test_delete_and_rename_outputs(harness: Harnessed) -> None:
    await harness.call("write_file", path="a.md", content="x")
    assert await harness.call("rename", old_path="a.md", new_path="b/c.md") == (
        "Renamed a.md to b/c.md"
    )
    assert await harness.call("delete", path="b") == "Deleted b"
    assert await harness.call("ls") == "(empty)"


async def test_edit_outputs_and_uniqueness_errors(harness: Harnessed) -> None:
    await harness.call("write_file", path="a.md", content="one two two")
    assert await harness.call("edit_file", path="a.md", old_text="one", new_text="1") == (
        "Edited a.md"
    )
    twice = await harness.call("edit_file", path="a.md", old_text="two", new_text="2")
    assert twice.startswith("Error: old_text matches 2 times in a.md")
    missing = await harness.call("edit_file", path="a.md", old_text="nine", new_text="9")
    assert missing == "Error: old_text not found in a.md — nothing was changed"
    assert await harness.call(
        "edit_file", path="a.md", old_text="two", new_text="2", replace_all=True
    ) == ("Edited a.md (2 replacements)")
    assert await harness.call("edit_file", path="a.md", old_text="2 2", new_text="") == (
        "Edited a.md"
    )
    assert await harness.call("read_file", path="a.md") == "1 "


async def test_glob_and_grep_outputs(harness: Harnessed) -> None:
    await harness.call("write_file", path="a.md", content="alpha\nbeta")
    await harness.call("write_file", path="d/b.md", content="beta")
    assert await harness.call("glob", pattern="**/*.md") == "a.md\nd/b.md"
    assert await harness.call("glob", pattern="*.py") == "(no matches)"
    assert await harness.call("grep", pattern="beta") == "a.md:2: beta\nd/b.md:1: beta"
    assert await harness.call("grep", pattern="beta", dir="d") == "d/b.md:1: beta"
    assert await harness.call("grep", pattern="gamma") == "(no matches)"


async def test_grep_says_when_it_hit_the_cap(tmp_path: Path) -> None:
    fs = WorkspaceAgentFileSystem(tmp_path / "s", FileSystemLimits(max_grep_hits=2))
    harness = Harnessed(fs, tmp_path)
    await harness.call("write_file", path="a.md", content="x\nx\nx\n")
    assert await harness.call("grep", pattern="x") == (
        "a.md:1: x\na.md:2: x\n[grep: showing the first 2 hits; there may be more — narrow "
        "the pattern or pass dir]"
    )


async def test_rejections_are_error_strings_and_change_nothing(
    harness: Harnessed, fs: WorkspaceAgentFileSystem
) -> None:
    await harness.call("write_file", path="keep.md", content="kept")
    before = tree(fs.root)
    assert await harness.call("read_file", path="../secret.txt") == (
        "Error: path contains an illegal segment ('..'): ../secret.txt"
    )
    assert await harness.call("write_file", path="/etc/passwd", content="x") == (
        "Error: path must be relative: /etc/passwd"
    )
    assert await harness.call("write_file", path="big.md", content="x" * 1001) == (
        "Error: Write rejected: big.md would be 1001 bytes, over the 1000-byte per-file limit"
    )
    assert await harness.call("read_file", path="  ") == "Error: 'path' is required"
    assert await harness.call("glob", pattern="") == "Error: 'pattern' is required"
    assert await harness.call("edit_file", path="keep.md", old_text=" ", new_text="") == (
        "Error: 'old_text' is required"
    )
    invalid = await harness.call("grep", pattern="(")
    assert invalid.startswith("Error: Invalid regex pattern: (")
    assert tree(fs.root) == before


async def test_a_missing_argument_is_the_executors_invalid_arguments(harness: Harnessed) -> None:
    result = json.loads(await harness.call("write_file", path="a.md"))
    assert result == {
        "error": "invalid_arguments",
        "tool": "write_file",
        "details": ["missing required parameter 'content'"],
    }
    bad = json.loads(await harness.call("read_file", path="a.md", offset="x"))
    assert bad["details"] == ["parameter 'offset' must be integer, got string"]


async def test_an_io_failure_is_an_error_string_not_a_crash(
    harness: Harnessed, fs: WorkspaceAgentFileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    await harness.call("write_file", path="a.md", content="old")

    def broken(src: str, dst: str) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(workspace_module.os, "replace", broken)
    assert await harness.call("write_file", path="a.md", content="new") == (
        "Error: Failed to write a.md: Input/output error"
    )
    monkeypatch.undo()
    assert await harness.call("read_file", path="a.md") == "old"


async def test_without_a_filesystem_the_tools_say_so(tmp_path: Path) -> None:
    harness = Harnessed(None, tmp_path)
    for name, arguments in [("ls", {}), ("read_file", {"path": "a"}), ("glob", {"pattern": "*"})]:
        assert await harness.call(name, **arguments) == UNAVAILABLE


async def test_the_provider_scopes_and_caches_per_conversation(tmp_path: Path) -> None:
    provider = AgentFileSystemProvider(tmp_path / "agent")
    first = provider.for_conversation("c1")
    assert provider.for_conversation("c1") is first
    assert provider.for_conversation("c2") is not first
    harness = Harnessed(None, tmp_path)
    harness.endpoint.provide(
        AgentFileSystem, lambda run: provider.for_conversation(run.conversation_id)
    )
    assert await harness.call("write_file", path="a.md", content="c1 data") == "Wrote a.md"
    assert (tmp_path / "agent" / "files" / "c1" / "a.md").read_text() == "c1 data"
    assert not (tmp_path / "agent" / "files" / "c2").exists()


# --- read_file windows ----------------------------------------------------------------------


async def test_read_file_windows(harness: Harnessed) -> None:
    lines = "".join(f"line {n}\n" for n in range(1, 11))
    await harness.call("write_file", path="ten.txt", content=lines)
    assert await harness.call("read_file", path="ten.txt") == lines
    assert await harness.call("read_file", path="ten.txt", offset=8) == "line 9\nline 10\n"
    assert await harness.call("read_file", path="ten.txt", offset=2, limit=2) == (
        "line 3\nline 4\n\n[read_file: lines 3-4 of 10 shown; call read_file with offset=4 "
        "to read on]"
    )
    assert await harness.call("read_file", path="ten.txt", offset=10) == (
        "Error: offset 10 is past the end of ten.txt (10 lines)"
    )
    assert await harness.call("read_file", path="ten.txt", limit=0) == (
        "Error: 'limit' must be an integer >= 1"
    )
    assert await harness.call("read_file", path="ten.txt", offset=-1) == (
        "Error: 'offset' must be an integer >= 0"
    )


async def test_a_long_file_is_paged_and_the_pages_rebuild_it_exactly(tmp_path: Path) -> None:
    fs = WorkspaceAgentFileSystem(tmp_path / "s")
    harness = Harnessed(fs, tmp_path, read_budget=100)
    content = "".join(f"row {n:03d} é\r\n" if n % 7 else f"row {n:03d}\r" for n in range(60))
    content += "no newline at the end"
    await fs.write("big.txt", content)
    first = await harness.call("read_file", path="big.txt")
    assert first.endswith("lines 1-9 of 61 shown; call read_file with offset=9 to read on]")
    pages: list[str] = []
    offset = 0
    while True:
        page = await harness.call("read_file", path="big.txt", offset=offset)
        body, marker, note = page.partition("\n[read_file: lines ")
        pages.append(body)
        if not marker:
            break
        offset = int(note.split("offset=")[1].split()[0])
    assert "".join(pages) == content
    assert len(pages) > 5


async def test_a_line_longer_than_the_budget_is_still_returned_whole(tmp_path: Path) -> None:
    fs = WorkspaceAgentFileSystem(tmp_path / "s")
    harness = Harnessed(fs, tmp_path, read_budget=10)
    await fs.write("wide.txt", "x" * 50 + "\nshort\n")
    assert await harness.call("read_file", path="wide.txt") == (
        "x" * 50 + "\n\n[read_file: lines 1-1 of 2 shown; call read_file with offset=1 to read on]"
    )


@settings(max_examples=1500, deadline=None)
@given(
    st.text(alphabet="ab\r\né", max_size=80),
    st.integers(min_value=1, max_value=20),
    st.one_of(st.none(), st.integers(min_value=1, max_value=5)),
)
def test_paging_with_any_window_rebuilds_the_text(
    text: str, budget: int, limit: int | None
) -> None:
    pages: list[str] = []
    offset = 0
    while True:
        page = read_window(text, "f.txt", offset, limit, budget)
        body, marker, note = page.partition("\n[read_file: lines ")
        pages.append(body)
        if not marker:
            break
        offset = int(note.split("offset=")[1].split()[0])
    assert "".join(pages) == text
    total = len(re.findall(r"\r\n|\r|\n", text)) + (1 if text and text[-1] not in "\r\n" else 0)
    assert len(pages) <= max(total, 1)


@settings(max_examples=3000, deadline=None)
@given(
    st.text(alphabet="ab\né", max_size=60),
    st.integers(min_value=0, max_value=12),
    st.one_of(st.none(), st.integers(min_value=1, max_value=6)),
    st.integers(min_value=-1, max_value=15),
)
def test_the_fast_window_equals_the_line_by_line_one(
    text: str, start: int, limit: int | None, budget: int
) -> None:
    assert _span(text, start, limit, budget) == _span_by_lines(text, start, limit, budget)
