"""A message's consecutive `write_file` calls run in one worker-thread hop (`Tool.batch`), and
every call still passes its own gates and answers exactly what a write of its own would have,
in order, leaving the store as the writes one by one would."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import ToolCall, WorkspaceAgentFileSystem
from atmosphere_harness._contracts import Run
from atmosphere_harness._errors import ToolArgumentError
from atmosphere_harness._filesystem import FileSystemLimits, atomic
from atmosphere_harness._filesystem import workspace as workspace_module
from atmosphere_harness._filesystem.composite import CompositeAgentFileSystem
from atmosphere_harness._filesystem.tools import file_tools
from atmosphere_harness._kernel.executor import execute_calls
from atmosphere_harness._tools.base import Tool, ToolContext
from tests.fs_support import Harnessed, Hops, tree

pytestmark = pytest.mark.usefixtures("on_loop_and_worker")

LIMITS = FileSystemLimits(max_file_bytes=100, max_files=4, max_total_bytes=1000)


def writes(*items: tuple[str, str]) -> list[ToolCall]:
    return [ToolCall("write_file", {"path": path, "content": content}) for path, content in items]


# Every way a write can fail, between writes that succeed: a path outside the store, a file
# over the per-file limit, a parent that is a file, the file-count limit (the fourth new file),
# and a rewrite of an existing file (which adds no file, so it passes the count).
MIXED = writes(
    ("a.md", "alpha"),
    ("../escape.md", "x"),
    ("big.md", "x" * 101),
    ("a.md/child.md", "under a file"),
    ("dir/b.md", "beta"),
    ("c.md", "gamma"),
    ("d.md", "delta"),
    ("e.md", "one too many"),
    ("a.md", "alpha again"),
)


async def test_consecutive_writes_take_one_hop_and_answer_as_single_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone_fs = WorkspaceAgentFileSystem(tmp_path / "alone", LIMITS)
    alone = [await Harnessed(alone_fs, tmp_path).call("write_file", **c.arguments) for c in MIXED]
    together_fs = WorkspaceAgentFileSystem(tmp_path / "together", LIMITS)
    harness = Harnessed(together_fs, tmp_path)
    hops = Hops(monkeypatch)
    together = await execute_calls(MIXED, harness.run)
    assert together == alone
    assert together[0] == "Wrote a.md"
    assert together[1].startswith("Error: ")
    assert together[2].startswith("Error: Write rejected: big.md would be 101 bytes")
    assert together[3] == "Error: Cannot write a.md/child.md: a parent of it is a file"
    assert together[7].startswith("Error: Write rejected: the store already holds 4 files")
    assert together[8] == "Wrote a.md"
    assert hops.count == 1, "one hop for the whole run of writes"
    assert tree(tmp_path / "together") == tree(tmp_path / "alone")
    assert tree(tmp_path / "together")["a.md"] == b"alpha again"
    usage = await together_fs.usage()
    assert (usage.files, usage.bytes) == (4, len("alpha againbetagammadelta"))


async def test_each_call_passes_its_gates_and_the_frames_keep_the_calls_order(
    tmp_path: Path,
) -> None:
    fs = WorkspaceAgentFileSystem(tmp_path / "store", LIMITS)
    harness = Harnessed(fs, tmp_path)

    async def deny_secrets(call: ToolCall, tool: Tool, arguments: Any, run: Run) -> str | None:
        return "denied: secrets" if "secret" in str(arguments.get("path")) else None

    harness.endpoint.admission_hooks.append(deny_secrets)
    calls = [
        *writes(("one.md", "1"), ("secret.md", "s")),
        ToolCall("write_file", {"path": "no-content.md"}),
        *writes(("two.md", "2")),
    ]
    results = await execute_calls(calls, harness.run)
    assert results[0] == "Wrote one.md"
    assert results[1] == "denied: secrets"
    assert "invalid_arguments" in results[2]
    assert results[3] == "Wrote two.md"
    assert sorted(tree(tmp_path / "store")) == ["one.md", "two.md"]
    events = [
        (frame.event, frame.data["toolCallId"])
        for frame in harness.frames
        if frame.event in ("tool-start", "tool-result")
    ]
    ids = [call.id for call in calls]
    # Calls that never reach the tool get their start and result at their gate; the others
    # start in order, then get their results in order, after the batch.
    assert events == [
        ("tool-start", ids[0]),
        ("tool-start", ids[1]),
        ("tool-result", ids[1]),
        ("tool-start", ids[2]),
        ("tool-result", ids[2]),
        ("tool-start", ids[3]),
        ("tool-result", ids[0]),
        ("tool-result", ids[3]),
    ]


async def test_a_failing_disk_write_in_a_batch_leaves_the_others_and_the_count_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = WorkspaceAgentFileSystem(tmp_path / "store", LIMITS)
    harness = Harnessed(fs, tmp_path)
    real = atomic.write_atomic

    def flaky(target: str, data: bytes, **options: Any) -> None:
        if target.endswith("/broken.md"):
            raise OSError(28, "No space left on device")
        real(target, data, **options)

    monkeypatch.setattr(workspace_module, "write_atomic", flaky)
    calls = writes(("a.md", "alpha"), ("broken.md", "never"), ("b.md", "beta"))
    results = await execute_calls(calls, harness.run)
    assert results == [
        "Wrote a.md",
        "Error: Failed to write broken.md: No space left on device",
        "Wrote b.md",
    ]
    assert tree(tmp_path / "store") == {"a.md": b"alpha", "b.md": b"beta"}
    usage = await fs.usage()
    assert (usage.files, usage.bytes) == (2, 9)


async def test_a_store_without_write_many_gets_the_writes_one_by_one(tmp_path: Path) -> None:
    base = WorkspaceAgentFileSystem(tmp_path / "base", LIMITS)
    notes = WorkspaceAgentFileSystem(tmp_path / "notes", LIMITS)
    fs = CompositeAgentFileSystem(base, {"notes/": notes})
    assert not hasattr(fs, "write_many")
    harness = Harnessed(fs, tmp_path)
    calls = writes(("a.md", "alpha"), ("notes/n.md", "note"), ("big.md", "x" * 101))
    results = await execute_calls(calls, harness.run)
    assert results[:2] == ["Wrote a.md", "Wrote notes/n.md"]
    assert results[2].startswith("Error: Write rejected: big.md")
    assert tree(tmp_path / "base") == {"a.md": b"alpha"}
    assert tree(tmp_path / "notes") == {"notes/n.md": b"note"}  # the full path, routed


async def test_without_a_bound_store_every_write_answers_unavailable(tmp_path: Path) -> None:
    harness = Harnessed(None, tmp_path)
    results = await execute_calls(writes(("a.md", "1"), ("b.md", "2")), harness.run)
    assert results == ["File tools unavailable: no agent filesystem is bound to this session."] * 2


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def echo_tools(batch: Any, timeout: float | None = None) -> list[Tool]:
    async def echo(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return f"alone {arguments['n']}"

    return [
        Tool("echo", "echo n", SCHEMA, echo, batch=batch, timeout=timeout),
        Tool("other", "echo n", SCHEMA, echo),
    ]


async def test_the_executor_batches_runs_of_two_or_more_and_renders_each_outcome(
    tmp_path: Path,
) -> None:
    seen: list[list[Any]] = []

    async def batch(arguments: Sequence[Mapping[str, Any]], run: Run) -> list[Any]:
        seen.append([item["n"] for item in arguments])
        out: list[Any] = []
        for item in arguments:
            n = item["n"]
            if n == 5:
                out.append(RuntimeError("five broke"))
            elif n == 6:
                out.append(ToolArgumentError(["n must not be six"]))
            elif n == 7:
                out.append({"n": n})
            else:
                out.append(f"batched {n}")
        return out

    harness = Harnessed(None, tmp_path, tools=echo_tools(batch))
    calls = [
        ToolCall("echo", {"n": 1}),
        ToolCall("echo", {"n": 2}),
        ToolCall("other", {"n": 3}),
        ToolCall("echo", {"n": 4}),
        ToolCall("echo", {"n": "bad"}),
        ToolCall("echo", {"n": 5}),
        ToolCall("echo", {"n": 6}),
        ToolCall("echo", {"n": 7}),
        ToolCall("other", {"n": 8}),
        ToolCall("echo", {"n": 9}),
    ]
    results = await execute_calls(calls, harness.run)
    assert results[:4] == ["batched 1", "batched 2", "alone 3", "batched 4"]
    assert "invalid_arguments" in results[4]
    assert '"tool_error"' in results[5]
    assert "five broke" in results[5]
    assert "invalid_arguments" in results[6]
    assert "n must not be six" in results[6]
    assert results[7:] == ['{"n": 7}', "alone 8", "alone 9"]
    # Only calls that passed their gates reach the batch; a lone call runs its handler.
    assert seen == [[1, 2], [4, 5, 6, 7]]


async def test_a_batch_that_breaks_fails_its_calls_and_nothing_escapes(tmp_path: Path) -> None:
    async def broken(arguments: Sequence[Mapping[str, Any]], run: Run) -> list[Any]:
        raise RuntimeError("the batch broke")

    async def short(arguments: Sequence[Mapping[str, Any]], run: Run) -> list[Any]:
        return ["only one"]

    calls = [ToolCall("echo", {"n": 1}), ToolCall("echo", {"n": 2})]
    for batch, reason in ((broken, "the batch broke"), (short, "batch returned 1 results")):
        harness = Harnessed(None, tmp_path, tools=echo_tools(batch))
        results = await execute_calls(calls, harness.run)
        assert all('"tool_error"' in result and reason in result for result in results)


async def test_a_batch_past_its_deadline_times_its_calls_out(tmp_path: Path) -> None:
    async def slow(arguments: Sequence[Mapping[str, Any]], run: Run) -> list[Any]:
        await asyncio.sleep(5)
        return ["late"] * len(arguments)

    harness = Harnessed(None, tmp_path, tools=echo_tools(slow, timeout=0.05))
    results = await execute_calls(
        [ToolCall("echo", {"n": 1}), ToolCall("echo", {"n": 2})], harness.run
    )
    assert all('"tool_timeout"' in result for result in results)


def test_write_file_is_the_tool_with_a_batch() -> None:
    assert [tool.name for tool in file_tools() if tool.batch is not None] == ["write_file"]
