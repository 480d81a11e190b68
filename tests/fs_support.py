"""Helpers for the filesystem tests: a run bound to a filesystem, and tool calls through the
real executor (validation, hooks, frames) without HTTP."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import AgentFileSystem, ScriptedRuntime, ToolCall
from atmosphere_harness._contracts import ResultHook
from atmosphere_harness._errors import FileSystemError
from atmosphere_harness._events import Frame
from atmosphere_harness._filesystem import workers
from atmosphere_harness._filesystem.spares import SPARES_DIR
from atmosphere_harness._filesystem.tools import file_tools
from atmosphere_harness._kernel.endpoint import HostedEndpoint
from atmosphere_harness._kernel.executor import execute_call
from atmosphere_harness._kernel.run import RunContext
from atmosphere_harness._registry import EndpointKind
from atmosphere_harness._tools.base import Tool


class Harnessed:
    """One endpoint with the file tools, bound to `fs`, and one run of conversation `c1`."""

    def __init__(
        self,
        fs: AgentFileSystem | None,
        root: Path,
        *,
        tools: Sequence[Tool] | None = None,
        hooks: Sequence[ResultHook] = (),
        read_budget: int = 8000,
    ) -> None:
        self.frames: list[Frame] = []
        self.endpoint = HostedEndpoint(
            path="/atmosphere/agent/tester",
            kind=EndpointKind.AGENT,
            owner="tester",
            features=frozenset(),
            runtime=ScriptedRuntime(),
            system_prompt="test",
            root=root,
            tool_timeout=30,
            max_rounds=5,
            tools=tools if tools is not None else file_tools(read_budget=read_budget),
        )
        if fs is not None:
            self.endpoint.provide(AgentFileSystem, lambda run: fs)
        self.endpoint.result_hooks.extend(hooks)

        async def sink(frame: Frame) -> None:
            self.frames.append(frame)

        self.run = RunContext(
            host=None,
            endpoint=self.endpoint,
            conversation_id="c1",
            user_id=None,
            sink=sink,
        )

    async def call(self, name: str, **arguments: Any) -> str:
        return await execute_call(ToolCall(name, arguments), self.run)


def tree(root: Path) -> dict[str, bytes]:
    """Every regular file below `root` (relative path -> bytes), links not followed."""
    found: dict[str, bytes] = {}
    for directory, dirs, files in os.walk(root):
        if SPARES_DIR in dirs:  # a store's named spares: empty files made ahead (`spares`)
            dirs.remove(SPARES_DIR)
        for name in files:
            full = Path(directory) / name
            if not full.is_symlink():
                found[str(full.relative_to(root))] = full.read_bytes()
    return found


def rejects(message: str, *, prefix: bool = False) -> Any:
    """`pytest.raises` for a `FileSystemError` with exactly this message (or this start)."""
    return pytest.raises(FileSystemError, match="^" + re.escape(message) + ("" if prefix else "$"))


@pytest.fixture(params=["on-loop", "worker"])
def on_loop_and_worker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs twice: small operations on the event loop (the default, never cooling
    down here), and every operation in a worker thread. The outcomes must be the same. A test
    module makes it apply to all its tests with `pytestmark = pytest.mark.usefixtures(...)`."""
    if request.param == "worker":
        monkeypatch.setattr(workers, "ON_LOOP_BYTES", -1)
    else:
        monkeypatch.setattr(workers, "ON_LOOP", workers.LoopBudget(slow=float("inf")))
    return str(request.param)


class Hops:
    """Counts the worker-thread hops the workspace makes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = workers.run

        async def counted(fn: Any, /, *args: Any) -> Any:
            self.count += 1
            return await real(fn, *args)

        monkeypatch.setattr(workers, "run", counted)


def makes_tmpfiles(directory: Path) -> bool:
    """Whether `directory`'s filesystem makes nameless files (`O_TMPFILE`: the workspace's
    spare files; overlayfs and NFS may not)."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag:
        return False
    try:
        os.close(os.open(directory, flag | os.O_RDWR, 0o600))
    except OSError:
        return False
    return True
