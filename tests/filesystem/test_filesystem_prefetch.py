"""A message's consecutive `read_file` calls share one worker-thread hop (`Tool.prefetch`), and
every call still answers exactly what a read of its own would have."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import ToolCall, WorkspaceAgentFileSystem
from atmosphere_harness._contracts import Run
from atmosphere_harness._errors import FileNotFoundInWorkspace
from atmosphere_harness._filesystem import FileSystemLimits
from atmosphere_harness._filesystem import workspace as workspace_module
from atmosphere_harness._filesystem.tools import file_tools
from atmosphere_harness._kernel.executor import execute_calls
from atmosphere_harness._tools.base import Tool, ToolContext
from tests.fs_support import Harnessed, Hops

pytestmark = pytest.mark.usefixtures("on_loop_and_worker")


@pytest.fixture
def fs(tmp_path: Path) -> WorkspaceAgentFileSystem:
    return WorkspaceAgentFileSystem(tmp_path / "store", FileSystemLimits(max_file_bytes=1000))


def reads(*paths: str) -> list[ToolCall]:
    return [ToolCall("read_file", {"path": path}) for path in paths]


async def test_consecutive_reads_take_one_hop_and_answer_as_single_reads(
    fs: WorkspaceAgentFileSystem,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    on_loop_and_worker: str,
) -> None:
    harness = Harnessed(fs, tmp_path)
    await fs.write("a.md", "alpha")
    await fs.write("b.md", "beta")
    await fs.write("big.md", "x" * 1000)
    (tmp_path / "store" / "bad.md").write_bytes(b"\xff\xfe")
    calls = reads("a.md", "missing.md", "b.md", "../escape", "bad.md", "a.md", "b.md")
    alone = [await harness.call("read_file", **call.arguments) for call in calls]
    hops = Hops(monkeypatch)
    together = await execute_calls(calls, harness.run)
    assert together == alone
    assert alone[0] == "alpha"
    assert alone[1] == "Error: File not found: missing.md"
    assert alone[4].startswith("Error: Cannot read bad.md")
    # One hop for the prefetch; the second read of a.md and b.md reads the disk again (on the
    # event loop, when small operations run there).
    assert hops.count == (1 if on_loop_and_worker == "on-loop" else 3)
    assert fs._prefetched == {}, "what was left is freed after the run of calls"


async def test_a_write_between_reads_is_seen_and_a_run_of_one_is_not_prefetched(
    fs: WorkspaceAgentFileSystem,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    on_loop_and_worker: str,
) -> None:
    harness = Harnessed(fs, tmp_path)
    await fs.write("a.md", "old")
    hops = Hops(monkeypatch)
    calls = [
        *reads("a.md", "a.md"),
        ToolCall("write_file", {"path": "a.md", "content": "new"}),
        *reads("a.md"),
    ]
    assert await execute_calls(calls, harness.run) == ["old", "old", "Wrote a.md", "new"]
    # The prefetch (one hop for both), then the second a.md, the write and the read (each on
    # the event loop, when small operations run there).
    assert hops.count == (1 if on_loop_and_worker == "on-loop" else 4)


async def test_a_change_through_the_store_drops_what_was_prefetched(
    fs: WorkspaceAgentFileSystem,
) -> None:
    await fs.write("a.md", "old")
    await fs.write("b.md", "b")
    assert await fs.prefetch(["a.md", "b.md"]) == 2
    await fs.edit("b.md", "b", "c")
    assert await fs.read("a.md") == "old"  # from the disk: nothing prefetched is left
    assert fs._prefetched == {}
    assert await fs.prefetch(["a.md"]) == 1
    await fs.delete("a.md")
    with pytest.raises(FileNotFoundInWorkspace):
        await fs.read("a.md")


async def test_a_prefetch_spanning_a_change_is_void(fs: WorkspaceAgentFileSystem) -> None:
    await fs.write("a.md", "old")
    prefetch = asyncio.create_task(fs.prefetch(["a.md"]))
    await asyncio.sleep(0)  # the prefetch is in its hop
    write = asyncio.create_task(fs.write("a.md", "new"))
    assert await prefetch == 0
    await write
    assert await fs.read("a.md") == "new"


async def test_prefetched_texts_expire(
    fs: WorkspaceAgentFileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    await fs.write("a.md", "old")
    await fs.prefetch(["a.md"])
    (fs.root / "a.md").write_text("changed behind the store's back")
    monkeypatch.setattr(workspace_module, "PREFETCH_SECONDS", 0.0)
    assert await fs.read("a.md") == "changed behind the store's back"


async def test_the_prefetch_keeps_a_bounded_number_of_bytes(
    fs: WorkspaceAgentFileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workspace_module, "PREFETCH_BYTES", 250)
    for name in "abcd":
        await fs.write(f"{name}.md", name * 100)
    assert await fs.prefetch([f"{name}.md" for name in "abcd"]) == 2
    for name in "abcd":
        assert await fs.read(f"{name}.md") == name * 100


async def test_the_executor_prefetches_once_per_run_of_calls_and_survives_a_failing_one(
    tmp_path: Path,
) -> None:
    seen: list[list[Any]] = []
    released: list[int] = []
    fail = {"now": False}

    async def prefetch(arguments: Sequence[Any], run: Run) -> Any:
        if fail["now"]:
            raise RuntimeError("prefetch broke")
        seen.append(list(arguments))
        return lambda: released.append(len(arguments))

    async def echo(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return str(arguments["n"])

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    tools = [
        Tool("echo", "echo n", schema, echo, prefetch=prefetch),
        Tool("other", "echo n", schema, echo),
    ]
    harness = Harnessed(None, tmp_path, tools=tools)
    calls = [
        ToolCall("echo", {"n": 1}),
        ToolCall("echo", {"n": 2}),
        ToolCall("other", {"n": 3}),
        ToolCall("echo", {"n": 4}),
        ToolCall("echo", {"n": "bad"}),
        ToolCall("echo", {"n": 6}),
        ToolCall("other", {"n": 7}),
        ToolCall("echo", {"n": 8}),
    ]
    results = await execute_calls(calls, harness.run)
    assert results[:4] == ["1", "2", "3", "4"]
    assert "invalid_arguments" in results[4]
    assert results[5:] == ["6", "7", "8"]
    # Runs of two or more: [1, 2] and [4, "bad", 6]; the lone 8 is not prefetched.
    assert seen == [[{"n": 1}, {"n": 2}], [{"n": 4}, {"n": "bad"}, {"n": 6}]]
    assert released == [2, 3]
    fail["now"] = True
    assert await execute_calls(calls[:2], harness.run) == ["1", "2"]


def test_read_file_is_the_tool_with_a_prefetch() -> None:
    assert [tool.name for tool in file_tools() if tool.prefetch is not None] == ["read_file"]
