"""FilePlanStore: layout, keys, containment, bounds, eviction, corruption, crash safety."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from atmosphere_harness import AgentPlan, PlanStatus, PlanStep
from atmosphere_harness._errors import PlanStoreError
from atmosphere_harness._planning import FilePlanStore, PlanStore

PLAN = AgentPlan([PlanStep("Write tests", PlanStatus.IN_PROGRESS, "Writing tests")], "Ship")
OTHER = AgentPlan([PlanStep("Replace the plan", PlanStatus.COMPLETED)])


def files_under(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_file()}


def test_the_file_store_is_a_plan_store(tmp_path: Path) -> None:
    assert isinstance(FilePlanStore(tmp_path), PlanStore)


async def test_round_trip_per_agent_and_conversation(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path)
    await store.put("planner", "c1", PLAN)
    await store.put("planner", "c2", OTHER)
    await store.put("helper", "c1", OTHER)
    assert await store.get("planner", "c1") == PLAN
    assert await store.get("planner", "c2") == OTHER
    assert await store.get("helper", "c1") == OTHER
    assert await store.get("helper", "c2") is None
    assert (tmp_path / "plans" / "planner" / "c1.json").is_file()
    assert store.path_for("helper", "c1") == (tmp_path / "plans/helper/c1.json").resolve()


async def test_put_replaces_the_whole_plan(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path)
    await store.put("a", "c", PLAN)
    await store.put("a", "c", OTHER)
    assert await store.get("a", "c") == OTHER
    assert [p.name for p in (tmp_path / "plans" / "a").iterdir()] == ["c.json"]


async def test_get_never_creates_directories(tmp_path: Path) -> None:
    root = tmp_path / "owner"
    store = FilePlanStore(root)
    assert await store.get("a", "c") is None
    assert not root.exists()


BAD_KEYS = [
    ("", "must not be blank"),
    ("   ", "must not be blank"),
    ("../x", "contains illegal path characters: ../x"),
    ("..", "contains illegal path characters: .."),
    (".", "contains illegal path characters: ."),
    ("a/b", "contains illegal path characters: a/b"),
    ("/etc", "contains illegal path characters: /etc"),
    ("a\\b", "contains illegal path characters"),
    ("..\\..\\x", "contains illegal path characters"),
    ("x..y", "contains illegal path characters"),
    ("a\x00b", "contains control characters"),
    ("a\nb", "contains control characters"),
    ("x" * 201, "is too long (201 bytes, at most 200)"),
    ("é" * 101, "is too long (202 bytes, at most 200)"),
]


@pytest.mark.parametrize(("key", "message"), BAD_KEYS)
@pytest.mark.parametrize("label", ["agentId", "conversationId"])
async def test_traversal_and_malformed_keys_are_rejected_and_nothing_escapes(
    tmp_path: Path, key: str, message: str, label: str
) -> None:
    root = tmp_path / "owner"
    store = FilePlanStore(root)
    keys = {"agentId": "a", "conversationId": "c", label: key}
    with pytest.raises(PlanStoreError, match=f"^{label} ") as raised:
        await store.put(keys["agentId"], keys["conversationId"], PLAN)
    assert message in str(raised.value)
    with pytest.raises(PlanStoreError, match=f"^{label} "):
        await store.get(keys["agentId"], keys["conversationId"])
    assert files_under(tmp_path) == set()


async def test_exact_reference_messages(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path)
    with pytest.raises(PlanStoreError) as blank:
        await store.put(" ", "c", PLAN)
    assert str(blank.value) == "agentId must not be blank"
    with pytest.raises(PlanStoreError) as illegal:
        await store.put("a", "../../etc/passwd", PLAN)
    assert str(illegal.value) == "conversationId contains illegal path characters: ../../etc/passwd"
    with pytest.raises(PlanStoreError) as null:
        await store.put("a", "c", None)  # type: ignore[arg-type]
    assert str(null.value) == "plan must not be None"


async def test_a_symlinked_agent_directory_cannot_redirect_writes_outside(tmp_path: Path) -> None:
    root = tmp_path / "owner"
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "plans").mkdir(parents=True)
    (root / "plans" / "evil").symlink_to(outside, target_is_directory=True)
    store = FilePlanStore(root)
    with pytest.raises(PlanStoreError, match=r"^Path escapes workspace: "):
        await store.put("evil", "c", PLAN)
    with pytest.raises(PlanStoreError, match=r"^Path escapes workspace: "):
        await store.get("evil", "c")
    assert list(outside.iterdir()) == []


async def test_a_symlinked_document_cannot_read_or_replace_a_file_outside(tmp_path: Path) -> None:
    root = tmp_path / "owner"
    secret = tmp_path / "secret.json"
    secret.write_text(PLAN.to_json())
    (root / "plans" / "a").mkdir(parents=True)
    (root / "plans" / "a" / "c.json").symlink_to(secret)
    store = FilePlanStore(root)
    with pytest.raises(PlanStoreError, match="escapes workspace"):
        await store.get("a", "c")
    with pytest.raises(PlanStoreError, match="escapes workspace"):
        await store.put("a", "c", OTHER)
    assert secret.read_text() == PLAN.to_json()


async def test_a_symlinked_workspace_root_is_fine(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    store = FilePlanStore(tmp_path / "link")
    await store.put("a", "c", PLAN)
    assert (real / "plans" / "a" / "c.json").is_file()


async def test_too_many_steps_is_rejected_and_the_stored_plan_is_kept(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path)
    await store.put("a", "c", PLAN)
    assert store.max_steps == 256
    await store.put("a", "c2", AgentPlan([PlanStep(f"s{i}") for i in range(256)]))
    with pytest.raises(PlanStoreError) as raised:
        await store.put("a", "c", AgentPlan([PlanStep(f"s{i}") for i in range(257)]))
    assert str(raised.value) == "plan rejected: 257 steps exceeds the 256-step limit"
    assert await store.get("a", "c") == PLAN


async def test_too_many_bytes_is_rejected_and_the_stored_plan_is_kept(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path)
    await store.put("a", "c", PLAN)
    assert store.max_plan_bytes == 131072
    huge = AgentPlan([PlanStep("x" * 70_000), PlanStep("y" * 70_000)])
    size = len(huge.to_json().encode())
    with pytest.raises(PlanStoreError) as raised:
        await store.put("a", "c", huge)
    assert str(raised.value) == f"plan rejected: {size} bytes exceeds the 131072-byte limit"
    assert await store.get("a", "c") == PLAN
    assert sorted(p.name for p in (tmp_path / "plans" / "a").iterdir()) == ["c.json"]


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"steps": [{"content": ""}]}', b"\xff\xfe", b""],
)
async def test_a_corrupt_document_reads_as_no_plan_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    store = FilePlanStore(tmp_path)
    path = tmp_path / "plans" / "a" / "c.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        assert await store.get("a", "c") is None
    assert "corrupt plan document" in caplog.text
    await store.put("a", "c", PLAN)
    assert await store.get("a", "c") == PLAN


async def test_an_oversized_document_on_disk_is_not_read_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FilePlanStore(tmp_path, max_plan_bytes=1024)
    path = tmp_path / "plans" / "a" / "c.json"
    path.parent.mkdir(parents=True)
    path.write_text(AgentPlan([PlanStep("x" * 2000)]).to_json())
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        assert await store.get("a", "c") is None
    assert "over the size limit" in caplog.text


async def test_a_directory_in_place_of_the_document_reads_as_no_plan(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path)
    (tmp_path / "plans" / "a" / "c.json").mkdir(parents=True)
    assert await store.get("a", "c") is None


async def test_the_file_cap_evicts_the_oldest_and_never_bricks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert FilePlanStore(tmp_path).max_files == 1024
    store = FilePlanStore(tmp_path, max_files=4)
    now = time.time()
    for index in range(4):
        await store.put("a" if index % 2 else "b", f"c{index}", PLAN)
        os.utime(store.path_for("a" if index % 2 else "b", f"c{index}"), (now - 100 + index,) * 2)
    # An update is not a new document: nothing is evicted.
    await store.put("b", "c0", OTHER)
    os.utime(store.path_for("b", "c0"), (now - 100,) * 2)
    assert len(list((tmp_path / "plans").rglob("*.json"))) == 4
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        await store.put("new", "c9", PLAN)
        await store.put("new", "c10", PLAN)
    assert "plan file cap reached" in caplog.text
    remaining = {
        str(p.relative_to(tmp_path / "plans")) for p in (tmp_path / "plans").rglob("*.json")
    }
    assert remaining == {"b/c2.json", "a/c3.json", "new/c9.json", "new/c10.json"}
    assert await store.get("new", "c10") == PLAN


def documents(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "plans").rglob("*.json"))


async def test_at_the_cap_eviction_makes_room_for_an_eighth_of_it(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path, max_files=16)
    now = time.time()
    for index in range(16):
        await store.put("a", f"c{index:02d}", PLAN)
        os.utime(store.path_for("a", f"c{index:02d}"), (now - 100 + index,) * 2)
    await store.put("a", "n1", PLAN)
    kept = [f"c{index:02d}" for index in range(3, 16)]
    assert documents(tmp_path) == [*kept, "n1"], "the 3 oldest went: 13 + the new one"
    await store.put("a", "n2", PLAN)
    await store.put("a", "n3", PLAN)
    assert documents(tmp_path) == [*kept, "n1", "n2", "n3"], "no eviction below the cap"
    await store.put("a", "n4", PLAN)
    assert len(documents(tmp_path)) == 14


async def test_documents_another_process_added_are_counted_at_the_cap(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path, max_files=16)
    for index in range(10):
        await store.put("a", f"mine{index}", PLAN)
    foreign = tmp_path / "plans" / "b"
    foreign.mkdir()
    for index in range(10):
        (foreign / f"theirs{index}.json").write_text(PLAN.to_json())
    for index in range(6):  # this store's count reaches the cap: it lists plans/ again
        await store.put("a", f"more{index}", PLAN)
    await store.put("a", "last", PLAN)
    assert len(documents(tmp_path)) == 14


async def test_eviction_sweeps_stale_temp_files_but_not_fresh_ones(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path)
    agent_dir = tmp_path / "plans" / "a"
    agent_dir.mkdir(parents=True)
    stale = agent_dir / ".plan-dead.tmp"
    fresh = agent_dir / ".plan-live.tmp"
    stale.write_text("{")
    fresh.write_text("{")
    os.utime(stale, (time.time() - 3600,) * 2)
    await store.put("a", "new", PLAN)
    assert not stale.exists()
    assert fresh.exists()


async def test_concurrent_writes_to_one_document_are_serialized(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path)
    plans = [AgentPlan([PlanStep(f"step {i}")], f"goal {i}") for i in range(30)]
    await asyncio.gather(*(store.put("a", "c", plan) for plan in plans))
    assert await store.get("a", "c") == plans[-1]
    assert [p.name for p in (tmp_path / "plans" / "a").iterdir()] == ["c.json"]


async def test_a_cancelled_write_still_finishes_before_the_next_one_starts(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path)
    first = asyncio.create_task(store.put("a", "c", PLAN))
    await asyncio.sleep(0)
    first.cancel()
    await store.put("a", "c", OTHER)
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await store.get("a", "c") == OTHER


async def test_concurrent_new_documents_respect_the_cap(tmp_path: Path) -> None:
    store = FilePlanStore(tmp_path, max_files=5)
    await asyncio.gather(*(store.put("a", f"c{i}", PLAN) for i in range(20)))
    assert len(list((tmp_path / "plans").rglob("*.json"))) == 5


def test_limits_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="positive"):
        FilePlanStore(tmp_path, max_files=0)


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from atmosphere_harness import AgentPlan, PlanStep, PlanStatus
    from atmosphere_harness._planning import FilePlanStore

    SMALL = AgentPlan([PlanStep("small", PlanStatus.IN_PROGRESS)], "small")
    LARGE = AgentPlan([PlanStep("large step %d " % i + "x" * 400) for i in range(250)], "large")

    async def main():
        store = FilePlanStore(sys.argv[1])
        n = 0
        while True:
            await store.put("a", "c", LARGE if n % 2 else SMALL)
            if n == 0:
                print("ready", flush=True)
            n += 1

    asyncio.run(main())
    """
)


def test_a_process_killed_mid_write_never_leaves_an_unparsable_plan(tmp_path: Path) -> None:
    small = AgentPlan([PlanStep("small", PlanStatus.IN_PROGRESS)], "small")
    large = AgentPlan([PlanStep(f"large step {i} " + "x" * 400) for i in range(250)], "large")
    document = tmp_path / "plans" / "a" / "c.json"
    rng = random.Random(1234)
    for _ in range(8):
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready", child.stderr
            time.sleep(rng.uniform(0.0, 0.05))
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
        plan = AgentPlan.from_json(document.read_bytes())
        assert plan in (small, large)
    leftovers = [p.name for p in document.parent.iterdir() if p.name != "c.json"]
    assert all(name.startswith(".plan-") and name.endswith(".tmp") for name in leftovers)
    assert len(leftovers) <= 8, "at most one orphaned temp file per kill"
