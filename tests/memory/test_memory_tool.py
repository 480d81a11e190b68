"""The Anthropic memory tool over the `AgentFileSystem` protocol, command by command."""

from __future__ import annotations

from typing import Any

import pytest

from atmosphere_harness import AgentFileSystem, ToolCall
from atmosphere_harness._runtimes.memory_tool import NATIVE, UNAVAILABLE, memory_tool
from atmosphere_harness._tools.base import ToolContext
from tests.memory_fs import DictFileSystem


class _Run:
    """Just enough of a RunContext for `ToolContext.get`."""

    def __init__(self, fs: object | None) -> None:
        self.fs = fs

    def resolve(self, kind: type) -> object | None:
        return self.fs if kind is AgentFileSystem else None


async def call(fs: object | None, **arguments: Any) -> str:
    tool = memory_tool()
    context = ToolContext(ToolCall("memory", arguments), _Run(fs))  # type: ignore[arg-type]
    return str(await tool.handler(arguments, context))


@pytest.fixture
def fs() -> DictFileSystem:
    return DictFileSystem()


def test_the_tool_declares_itself_natively() -> None:
    tool = memory_tool()
    assert tool.name == "memory"
    assert tool.spec().native == NATIVE == {"type": "memory_20250818", "name": "memory"}
    assert tool.parameters["properties"]["command"]["enum"] == [
        "view",
        "create",
        "str_replace",
        "insert",
        "delete",
        "rename",
    ]


async def test_create_then_view_the_file_with_line_numbers(fs: DictFileSystem) -> None:
    created = await call(fs, command="create", path="/memories/notes/a.md", file_text="x\ny\n")
    assert created == "File created successfully at: /memories/notes/a.md"
    assert fs.files == {"notes/a.md": "x\ny\n"}
    assert await call(fs, command="view", path="/memories/notes/a.md") == (
        "Here's the content of /memories/notes/a.md with line numbers:\n     1\tx\n     2\ty"
    )
    ranged = await call(fs, command="view", path="/memories/notes/a.md", view_range=[2, -1])
    assert ranged.splitlines()[1:] == ["     2\ty"]


async def test_view_lists_two_levels_and_skips_hidden(fs: DictFileSystem) -> None:
    fs.files.update(
        {"top.md": "12345", "a/b.md": "b", "a/deep/c.md": "c", "a/deep/x/d.md": "d", ".h": "."}
    )
    listing = await call(fs, command="view", path="/memories")
    assert listing.splitlines() == [
        "Here're the files and directories up to 2 levels deep in /memories, excluding hidden "
        "items:",
        "-\t/memories/",
        "-\t/memories/a/",
        "-\t/memories/a/deep/",
        "1B\t/memories/a/b.md",
        "5B\t/memories/top.md",
    ]
    sub = await call(fs, command="view", path="/memories/a/")
    assert sub.splitlines()[1:3] == ["-\t/memories/a/", "-\t/memories/a/deep/"]


async def test_create_refuses_to_overwrite(fs: DictFileSystem) -> None:
    fs.files["a.md"] = "keep"
    result = await call(fs, command="create", path="/memories/a.md", file_text="lost")
    assert result == "Error: File /memories/a.md already exists"
    assert fs.files["a.md"] == "keep"


async def test_str_replace_unique_missing_and_ambiguous(fs: DictFileSystem) -> None:
    fs.files["a.md"] = "one\ntwo\nthree\ntwo\n"
    missing = await call(fs, command="str_replace", path="/memories/a.md", old_str="zz", new_str="")
    assert missing == (
        "Error: No replacement was performed, old_str `zz` did not appear verbatim in "
        "/memories/a.md."
    )
    twice = await call(fs, command="str_replace", path="/memories/a.md", old_str="two", new_str="2")
    assert twice == (
        "Error: No replacement was performed. Multiple occurrences of old_str `two` in lines: "
        "2, 4. Please ensure it is unique"
    )
    assert fs.files["a.md"] == "one\ntwo\nthree\ntwo\n", "a rejected edit changes nothing"
    done = await call(
        fs, command="str_replace", path="/memories/a.md", old_str="three", new_str="3"
    )
    assert fs.files["a.md"] == "one\ntwo\n3\ntwo\n"
    assert done.splitlines()[0].startswith("The memory file has been edited.")
    assert "     3\t3" in done.splitlines()


async def test_insert_at_top_middle_end_and_out_of_range(fs: DictFileSystem) -> None:
    fs.files["a.md"] = "a\nb\n"
    assert await call(fs, command="insert", path="/memories/a.md", insert_line=0, insert_text="0")
    await call(fs, command="insert", path="/memories/a.md", insert_line=3, insert_text="z\n")
    await call(fs, command="insert", path="/memories/a.md", insert_line=2, insert_text="mid")
    assert fs.files["a.md"] == "0\na\nmid\nb\nz\n"
    bad = await call(fs, command="insert", path="/memories/a.md", insert_line=9, insert_text="x")
    assert bad == "Error: Invalid `insert_line` parameter: 9. It should be within the range [0, 5]."


async def test_delete_and_rename(fs: DictFileSystem) -> None:
    fs.files.update({"a.md": "a", "dir/b.md": "b"})
    assert await call(fs, command="rename", old_path="/memories/a.md", new_path="/memories/n/a.md")
    assert fs.files == {"n/a.md": "a", "dir/b.md": "b"}
    taken = await call(fs, command="rename", old_path="/memories/n/a.md", new_path="/memories/dir")
    assert taken == "Error: The destination /memories/dir already exists"
    assert await call(fs, command="delete", path="/memories/dir") == (
        "Successfully deleted /memories/dir"
    )
    assert fs.files == {"n/a.md": "a"}
    assert await call(fs, command="delete", path="/memories/gone.md") == (
        "Error: The path /memories/gone.md does not exist"
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"command": "view", "path": "/etc/passwd"}, "Path must start with /memories"),
        ({"command": "view", "path": "/memoriesX/a"}, "Path must start with /memories"),
        ({"command": "create", "path": "/memories/../x", "file_text": "x"}, "illegal segment"),
        ({"command": "create", "path": "/memories/a//b", "file_text": "x"}, "illegal segment"),
        ({"command": "delete", "path": "/memories"}, "Cannot modify the /memories directory"),
        ({"command": "create", "path": "/memories/a.md"}, "'file_text' is required"),
        ({"command": "view"}, "'path' is required"),
        ({"command": "view", "path": "/memories/none.md"}, "does not exist"),
        ({"command": "insert", "path": "/memories/a.md", "insert_text": "x"}, "'insert_line'"),
        ({"command": "format", "path": "/memories"}, "unknown memory command 'format'"),
    ],
)
async def test_rejections_are_error_messages(
    fs: DictFileSystem, arguments: dict[str, Any], message: str
) -> None:
    fs.files["a.md"] = "a"
    result = await call(fs, **arguments)
    assert result.startswith("Error: ")
    assert message in result
    assert fs.files == {"a.md": "a"}, "nothing was written"


async def test_store_bounds_surface_as_errors_and_leave_nothing(fs: DictFileSystem) -> None:
    result = await call(fs, command="create", path="/memories/big.md", file_text="x" * 2000)
    assert result.startswith("Error: Write rejected: big.md would be 2000 bytes")
    assert fs.files == {}


async def test_no_filesystem_bound() -> None:
    assert await call(None, command="view", path="/memories") == UNAVAILABLE
