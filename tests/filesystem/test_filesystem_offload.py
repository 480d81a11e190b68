"""Tool-output offload: long results go to `tool-output/`, and nothing is ever lost."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from atmosphere_harness import AgentFileSystem, FileSystemLimits, WorkspaceAgentFileSystem, tool
from atmosphere_harness._filesystem.offload import ToolOutputOffload, offload_path
from atmosphere_harness._filesystem.tools import file_tools
from atmosphere_harness._tools.base import build_tool
from tests.fs_support import Harnessed, tree

BIG = "".join(f"row {n:05d}: {'é' * (n % 5)} data\r\n" for n in range(2000)) + "the end"


@tool(name="dump")
async def dump(size: int) -> str:
    """Return a long text."""
    return BIG[:size]


def harnessed(tmp_path: Path, threshold: int = 8000, **limits: int) -> Harnessed:
    fs = WorkspaceAgentFileSystem(tmp_path / "store", FileSystemLimits(**limits))
    return Harnessed(
        fs,
        tmp_path,
        tools=[*file_tools(read_budget=threshold), build_tool(dump)],
        hooks=[ToolOutputOffload(threshold)],
        read_budget=threshold,
    )


def saved_path(preview: str) -> str:
    found = re.search(r"Full output saved to (tool-output/dump-[0-9a-f]{8}\.txt) — ", preview)
    assert found, preview
    return found.group(1)


async def test_a_large_result_is_offloaded_with_a_preview_and_a_pointer(tmp_path: Path) -> None:
    harness = harnessed(tmp_path)
    result = await harness.call("dump", size=len(BIG))
    path = saved_path(result)
    assert result == (
        f"{BIG[:1500]}\n\n[... {len(BIG) - 1500} chars truncated. Full output saved to {path} "
        "— use read_file to read it (offset/limit page through it).]"
    )
    assert (tmp_path / "store" / path).read_bytes() == BIG.encode()
    frames = [f for f in harness.frames if f.event == "tool-result"]
    assert frames[-1].data["result"] == result, "the frame carries what the model got"


async def test_a_small_result_is_unchanged_and_writes_nothing(tmp_path: Path) -> None:
    harness = harnessed(tmp_path)
    assert await harness.call("dump", size=8000) == BIG[:8000]
    assert not (tmp_path / "store").exists(), "not even a directory"


async def test_without_a_filesystem_the_result_stays_inline(tmp_path: Path) -> None:
    harness = Harnessed(None, tmp_path, tools=[build_tool(dump)], hooks=[ToolOutputOffload(100)])
    assert await harness.call("dump", size=5000) == BIG[:5000]


async def test_a_failed_offload_returns_the_full_result(tmp_path: Path) -> None:
    harness = harnessed(tmp_path, max_file_bytes=10_000)
    assert await harness.call("dump", size=len(BIG)) == BIG
    assert tree(tmp_path / "store") == {}


async def test_a_disabled_threshold_never_offloads(tmp_path: Path) -> None:
    harness = harnessed(tmp_path, threshold=0)
    assert await harness.call("dump", size=len(BIG)) == BIG


async def test_the_round_trip_through_read_file_is_byte_exact(tmp_path: Path) -> None:
    harness = harnessed(tmp_path)
    path = saved_path(await harness.call("dump", size=len(BIG)))
    pages: list[str] = []
    offset = 0
    while True:
        page = await harness.call("read_file", path=path, offset=offset)
        assert "tool-output/read_file" not in page, "read_file is never offloaded"
        body, marker, note = page.partition("\n[read_file: lines ")
        pages.append(body)
        if not marker:
            break
        offset = int(re.search(r"offset=(\d+) to read on", note).group(1))  # type: ignore[union-attr]
    assert "".join(pages) == BIG
    assert [p for p in tree(tmp_path / "store") if p.startswith("tool-output/")] == [path]


async def test_reading_a_long_file_pages_instead_of_offloading(tmp_path: Path) -> None:
    harness = harnessed(tmp_path, threshold=500)
    await harness.call("write_file", path="long.txt", content=BIG[:5000])
    page = await harness.call("read_file", path="long.txt")
    assert page.startswith(BIG[:400])
    assert "call read_file with offset=" in page
    assert sorted(tree(tmp_path / "store")) == ["long.txt"]


@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("web.search", "tool-output/web.search-"),
        ("a b/c", "tool-output/a_b_c-"),
        ("  ", "tool-output/tool-"),
    ],
)
def test_offload_file_names_are_safe(name: str, prefix: str) -> None:
    path = offload_path(name)
    assert path.startswith(prefix)
    assert re.fullmatch(re.escape(prefix) + r"[0-9a-f]{8}\.txt", path)


async def test_the_hook_leaves_a_failing_resolution_inline(tmp_path: Path) -> None:
    harness = Harnessed(None, tmp_path, tools=[build_tool(dump)], hooks=[ToolOutputOffload(100)])

    def broken(run: object) -> None:
        raise RuntimeError("no store today")

    harness.endpoint.provide(AgentFileSystem, broken)
    assert await harness.call("dump", size=500) == BIG[:500]
