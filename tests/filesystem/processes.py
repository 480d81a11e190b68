"""Worker processes for the cross-process workspace tests (`test_filesystem_processes.py`).

Each scenario runs in its own interpreter (`python -m tests.filesystem.processes <scenario>
<json>`), drives the real file tools through the executor (or the real plan store), waits at a
file barrier so every worker starts together, and prints one JSON line with what it was told
(acknowledged writes, rejections). The test process compares that with the disk.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from atmosphere_harness._filesystem import AgentFileSystemProvider, FileSystemLimits
from atmosphere_harness._filesystem.provider import CAP_LOCK
from atmosphere_harness._planning.model import AgentPlan
from atmosphere_harness._planning.store import CAP_LOCK as PLAN_LOCK
from atmosphere_harness._planning.store import FilePlanStore
from tests.fs_support import Harnessed

BARRIER_SECONDS = 60.0


def barrier(sync: Path, tag: str) -> None:
    """Say ready, then wait for the test to say go (a file), so all workers start together."""
    (sync / f"{tag}.ready").touch()
    deadline = time.monotonic() + BARRIER_SECONDS
    while not (sync / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.002)


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + BARRIER_SECONDS
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"never appeared: {path.name}")
        time.sleep(0.002)


def content(tag: str, writer: int, number: int, size: int) -> str:
    """A self-checking body: its own name on the first line, padding, and an end marker."""
    head = f"{tag}-{writer}-{number}\n"
    return head + "x" * max(0, size - len(head) - 4) + "\nEND"


def limits(spec: dict[str, Any]) -> FileSystemLimits:
    return FileSystemLimits(**spec["limits"])


async def writers(spec: dict[str, Any]) -> dict[str, Any]:
    """`writers` tasks write new files until the store refuses them `give_up` times in a row."""
    provider = AgentFileSystemProvider(spec["agent_root"], limits(spec))
    harness = Harnessed(provider.workspace(spec["conversation"]), Path(spec["agent_root"]))
    tag = spec["tag"]
    acknowledged: dict[str, str] = {}
    rejected: list[str] = []

    async def writer(number: int) -> None:
        refusals = 0
        for attempt in range(spec["attempts"]):
            size = spec["sizes"][(number * 7 + attempt) % len(spec["sizes"])]
            path = f"w{number % 4}/{tag}-{number}-{attempt}.txt"
            body = content(tag, number, attempt, size)
            answer = await harness.call("write_file", path=path, content=body)
            if answer.startswith("Error:"):
                rejected.append(answer)
                refusals += 1
                if refusals >= spec["give_up"]:
                    return
            else:
                acknowledged[path] = body

    barrier(Path(spec["sync"]), tag)
    await asyncio.gather(*(writer(number) for number in range(spec["writers"])))
    return {"acknowledged": acknowledged, "rejected": rejected}


async def edits(spec: dict[str, Any]) -> dict[str, Any]:
    """`tasks` tasks append `appends` unique markers in all to one file with `edit_file`."""
    provider = AgentFileSystemProvider(spec["agent_root"], limits(spec))
    harness = Harnessed(provider.workspace(spec["conversation"]), Path(spec["agent_root"]))
    tag = spec["tag"]
    acknowledged: list[str] = []
    failed: list[str] = []
    queue = list(range(spec["appends"]))

    async def editor() -> None:
        while queue:
            marker = f"<{tag}:{queue.pop()}>"
            answer = await harness.call(
                "edit_file", path=spec["path"], old_text="END", new_text=f"{marker}\nEND"
            )
            (failed if answer.startswith("Error:") else acknowledged).append(
                marker if not answer.startswith("Error:") else answer
            )

    barrier(Path(spec["sync"]), tag)
    await asyncio.gather(*(editor() for _ in range(spec["tasks"])))
    return {"acknowledged": acknowledged, "failed": failed}


async def renames(spec: dict[str, Any]) -> dict[str, Any]:
    """`tasks` tasks rename `{tag}{i}.txt` to `d{i}.txt` for every i: the other process renames
    its own file to the same destination, so exactly one of each pair may win."""
    provider = AgentFileSystemProvider(spec["agent_root"], limits(spec))
    harness = Harnessed(provider.workspace(spec["conversation"]), Path(spec["agent_root"]))
    tag = spec["tag"]
    won: list[int] = []
    refused: list[str] = []
    queue = list(range(spec["count"]))

    async def renamer() -> None:
        while queue:
            number = queue.pop()
            answer = await harness.call(
                "rename", old_path=f"{tag}{number}.txt", new_path=f"d{number}.txt"
            )
            if answer.startswith("Error:"):
                refused.append(answer)
            else:
                won.append(number)

    barrier(Path(spec["sync"]), tag)
    await asyncio.gather(*(renamer() for _ in range(spec["tasks"])))
    return {"won": won, "refused": refused}


async def holder(spec: dict[str, Any]) -> dict[str, Any]:
    """Keep conversation `held` in use (its store alive) while the test creates many others;
    write conversation `dropped` and let its store go, so the cap may take that one."""
    provider = AgentFileSystemProvider(spec["agent_root"], limits(spec))
    dropped = provider.workspace("dropped")
    await dropped.write("note.md", "may go")
    del dropped
    gc.collect()
    held = provider.workspace("held")
    await held.write("note.md", "must stay")
    sync = Path(spec["sync"])
    (sync / "holder.ready").touch()
    wait_for(sync / "done")
    return {"read_back": await held.read("note.md")}


def count_under(lock: Path, directory: Path, *, suffix: str = "") -> int:
    """Count `directory`'s entries (directories, or files ending in `suffix`) while holding the
    flock the stores count and create under, so the count is a true snapshot. A bare `flock`:
    it leaves no holder's mark, so the stores' own bookkeeping is not disturbed."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with os.scandir(directory) as listing:
            if suffix:
                return sum(1 for entry in listing if entry.name.endswith(suffix))
            return sum(1 for entry in listing if entry.is_dir(follow_symlinks=False))
    finally:
        os.close(fd)


async def conversations(spec: dict[str, Any]) -> dict[str, Any]:
    """Create `count` conversations one after another (one write each, then let go), counting
    the conversation directories after each."""
    provider = AgentFileSystemProvider(spec["agent_root"], limits(spec))
    files = Path(spec["agent_root"]) / "files"
    created = most = 0
    barrier(Path(spec["sync"]), spec["tag"])
    for number in range(spec["count"]):
        fs = provider.workspace(f"{spec['tag']}-{number}")
        await fs.write("a.md", "x")
        created += 1
        del fs
        most = max(most, count_under(files / CAP_LOCK, files))
    return {"created": created, "most": most}


async def plans(spec: dict[str, Any]) -> dict[str, Any]:
    """Create `count` plans in one store, one after another, `tasks` at a time."""
    store = FilePlanStore(spec["root"], max_files=spec["max_files"])
    plan = AgentPlan.from_json(json.dumps({"steps": [{"content": "one", "status": "pending"}]}))
    tag = spec["tag"]
    barrier(Path(spec["sync"]), tag)
    numbers = list(range(spec["count"]))

    directory = Path(spec["root"]) / "plans"
    most = 0

    async def creator() -> None:
        nonlocal most
        while numbers:
            await store.put("agent", f"{tag}-{numbers.pop()}", plan)
            most = max(
                most, count_under(directory / PLAN_LOCK, directory / "agent", suffix=".json")
            )

    await asyncio.gather(*(creator() for _ in range(spec["tasks"])))
    return {"created": spec["count"], "most": most}


SCENARIOS = {
    "writers": writers,
    "edits": edits,
    "renames": renames,
    "holder": holder,
    "conversations": conversations,
    "plans": plans,
}


def main() -> None:
    scenario, spec = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(asyncio.run(SCENARIOS[scenario](spec))), flush=True)


if __name__ == "__main__":
    main()
