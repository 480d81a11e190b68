"""Exactness across processes: real interpreters sharing one workspace root (`processes.py`).

Two processes with 16 concurrent writers each fill one conversation's store: never past a bound,
no partial file, no acknowledged write lost, nothing on disk that was not acknowledged. Two
processes append with `edit_file` to one file: every acknowledged marker is there, once; two
processes renaming onto the same names never rename one file over another. The
conversation cap never evicts a conversation another process has in use, and holds exactly with
creators in two processes; so does the plan cap. Outcomes only: no timing is asserted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness._filesystem import AgentFileSystemProvider, FileSystemLimits
from atmosphere_harness._filesystem.paths import TEMP_SUFFIX
from tests.filesystem.processes import BARRIER_SECONDS
from tests.fs_support import tree

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 240.0


def start(scenario: str, spec: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.filesystem.processes", scenario, json.dumps(spec)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"worker timed out: {err[-2000:]}")
    assert process.returncode == 0, err[-4000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + BARRIER_SECONDS
    while not path.exists():
        assert time.monotonic() < deadline, f"a worker never got ready ({path.name})"
        time.sleep(0.005)


def run_together(scenario: str, specs: list[dict[str, Any]], sync: Path) -> list[dict[str, Any]]:
    """Start one worker per spec, release them together, and collect what each was told."""
    sync.mkdir(parents=True, exist_ok=True)
    processes = [start(scenario, spec) for spec in specs]
    try:
        for spec in specs:
            wait_for(sync / f"{spec['tag']}.ready")
        (sync / "go").touch()
        return [finish(process) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()


def test_two_processes_of_sixteen_writers_never_pass_a_bound_nor_lose_a_write(
    tmp_path: Path,
) -> None:
    agent_root = tmp_path / "agent"
    bounds = {"max_files": 100, "max_total_bytes": 60_000, "max_file_bytes": 1_500}
    spec = {
        "agent_root": str(agent_root),
        "conversation": "c1",
        "limits": bounds,
        "sync": str(tmp_path / "sync"),
        "writers": 16,
        "attempts": 40,
        "give_up": 3,
        # mostly small files (the count bound), some large (the byte bound), one too big
        "sizes": [300, 200, 1_400, 250, 1_600, 350, 900],
    }
    results = run_together(
        "writers", [{**spec, "tag": "a"}, {**spec, "tag": "b"}], tmp_path / "sync"
    )

    store = agent_root / "files" / "c1"
    on_disk = {path: data.decode() for path, data in tree(store).items()}
    acknowledged: dict[str, str] = {}
    for result in results:
        acknowledged.update(result["acknowledged"])
    assert not [path for path in on_disk if path.endswith(TEMP_SUFFIX)], "no partial file"
    assert on_disk == acknowledged, "exactly the acknowledged writes, each whole"
    assert len(on_disk) <= bounds["max_files"]
    assert sum(len(body.encode()) for body in on_disk.values()) <= bounds["max_total_bytes"]

    rejections = [message for result in results for message in result["rejected"]]
    per_file = [m for m in rejections if "per-file limit" in m]
    count = [m for m in rejections if "-file limit" in m and "per-file" not in m]
    total = [m for m in rejections if "total limit" in m]
    assert per_file, "the per-file bound was reached"
    assert count or total, "a store bound was reached"
    assert len(per_file) + len(count) + len(total) == len(rejections), rejections[:3]
    for message in count:  # a count rejection names the true count: the bound itself
        assert f"already holds {bounds['max_files']} files" in message, message
    for message in total:  # a total rejection names a total past the bound
        over = int(re.search(r"to (\d+) bytes", message).group(1))  # type: ignore[union-attr]
        assert over > bounds["max_total_bytes"], message

    # A fresh store on the same directory counts what is there, and agrees.
    fresh = AgentFileSystemProvider(agent_root, FileSystemLimits(**bounds)).workspace("c1")
    counted = __import__("asyncio").run(fresh.usage())
    assert (counted.files, counted.bytes) == (
        len(on_disk),
        sum(len(body.encode()) for body in on_disk.values()),
    )


def test_concurrent_edits_of_one_file_from_two_processes_lose_nothing(tmp_path: Path) -> None:
    agent_root = tmp_path / "agent"
    store = agent_root / "files" / "c1"
    store.mkdir(parents=True)
    (store / "log.md").write_text("BEGIN\nEND")
    spec = {
        "agent_root": str(agent_root),
        "conversation": "c1",
        "limits": {},
        "sync": str(tmp_path / "sync"),
        "path": "log.md",
        "appends": 300,
        "tasks": 8,
    }
    results = run_together("edits", [{**spec, "tag": "a"}, {**spec, "tag": "b"}], tmp_path / "sync")

    acknowledged = [marker for result in results for marker in result["acknowledged"]]
    assert [result["failed"] for result in results] == [[], []]
    assert len(acknowledged) == 600
    text = (store / "log.md").read_text()
    lines = text.split("\n")
    assert lines[0] == "BEGIN"
    assert lines[-1] == "END"
    assert sorted(lines[1:-1]) == sorted(acknowledged), "every acknowledged edit, exactly once"


def test_concurrent_renames_onto_one_name_from_two_processes_keep_both_files(
    tmp_path: Path,
) -> None:
    agent_root = tmp_path / "agent"
    store = agent_root / "files" / "c1"
    store.mkdir(parents=True)
    count = 150
    for number in range(count):
        (store / f"a{number}.txt").write_text(f"from a {number}")
        (store / f"b{number}.txt").write_text(f"from b {number}")
    spec = {
        "agent_root": str(agent_root),
        "conversation": "c1",
        "limits": {"max_files": 1000},
        "sync": str(tmp_path / "sync"),
        "count": count,
        "tasks": 8,
    }
    a, b = run_together("renames", [{**spec, "tag": "a"}, {**spec, "tag": "b"}], tmp_path / "sync")

    assert sorted(a["won"] + b["won"]) == list(range(count)), "one rename wins per name"
    assert len(a["refused"]) + len(b["refused"]) == count
    for message in a["refused"] + b["refused"]:
        assert "Destination already exists" in message, message
    on_disk = {path: data.decode() for path, data in tree(store).items()}
    assert len(on_disk) == 2 * count, "no file was renamed over another"
    for number in a["won"]:
        assert on_disk[f"d{number}.txt"] == f"from a {number}"
        assert on_disk[f"b{number}.txt"] == f"from b {number}"
    for number in b["won"]:
        assert on_disk[f"d{number}.txt"] == f"from b {number}"
        assert on_disk[f"a{number}.txt"] == f"from a {number}"


def test_the_cap_never_evicts_a_conversation_another_process_has_in_use(tmp_path: Path) -> None:
    agent_root = tmp_path / "agent"
    sync = tmp_path / "sync"
    sync.mkdir()
    limits = FileSystemLimits(max_conversations=8)
    spec = {"agent_root": str(agent_root), "limits": {"max_conversations": 8}, "sync": str(sync)}
    holder = start("holder", spec)
    try:
        wait_for(sync / "holder.ready")
        files_root = agent_root / "files"
        assert {p.name for p in files_root.iterdir() if p.is_dir()} == {"dropped", "held"}

        async def create_many() -> None:
            provider = AgentFileSystemProvider(agent_root, limits)
            for number in range(20):  # each past the cap evicts the least recently written
                await provider.workspace(f"new-{number}").write("a.md", "x")

        __import__("asyncio").run(create_many())
        names = {p.name for p in files_root.iterdir() if p.is_dir()}
        (sync / "done").touch()
        result = finish(holder)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()
    assert "held" in names, "in use by the other process: never evicted"
    assert "dropped" not in names, "let go by the other process: evicted like any other"
    assert len(names) <= 8
    assert result == {"read_back": "must stay"}


def test_the_conversation_cap_holds_with_creators_in_two_processes(tmp_path: Path) -> None:
    agent_root = tmp_path / "agent"
    spec = {
        "agent_root": str(agent_root),
        "limits": {"max_conversations": 64},
        "sync": str(tmp_path / "sync"),
        "count": 200,
    }
    results = run_together(
        "conversations", [{**spec, "tag": "a"}, {**spec, "tag": "b"}], tmp_path / "sync"
    )
    assert [result["created"] for result in results] == [200, 200]
    assert [result["most"] <= 64 for result in results] == [True, True], results
    names = [p.name for p in (agent_root / "files").iterdir() if p.is_dir()]
    assert 0 < len(names) <= 64
    leftovers = {p.name for p in (agent_root / "files").iterdir() if not p.is_dir()}
    kept = {f".{name}.{kind}" for name in names for kind in ("lock", "live")}
    assert leftovers - kept <= {".conversations.lock"}, "evicted stores take their lock files"


def test_the_plan_cap_holds_with_creators_in_two_processes(tmp_path: Path) -> None:
    spec = {
        "root": str(tmp_path / "owner"),
        "max_files": 32,
        "sync": str(tmp_path / "sync"),
        "count": 120,
        "tasks": 4,
    }
    results = run_together("plans", [{**spec, "tag": "a"}, {**spec, "tag": "b"}], tmp_path / "sync")
    assert [result["created"] for result in results] == [120, 120]
    assert [result["most"] <= 32 for result in results] == [True, True], results
    documents = list((tmp_path / "owner" / "plans" / "agent").glob("*.json"))
    assert 0 < len(documents) <= 32
