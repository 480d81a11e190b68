"""`WorkspaceAgentFileSystem`: operations, bounds, atomic writes, the usage tally, concurrency."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atmosphere_harness import FileSystemLimits, WorkspaceAgentFileSystem
from atmosphere_harness._errors import FileSystemError
from atmosphere_harness._filesystem import FileInfo, GrepHit
from atmosphere_harness._filesystem import tally as tally_module
from atmosphere_harness._filesystem import workspace as workspace_module
from atmosphere_harness._filesystem.atomic import read_bytes, read_open
from atmosphere_harness._filesystem.paths import TEMP_SUFFIX
from atmosphere_harness._filesystem.workspace import is_live
from tests.fs_support import rejects, tree

pytestmark = pytest.mark.usefixtures("on_loop_and_worker")


@pytest.fixture
def store(tmp_path: Path) -> WorkspaceAgentFileSystem:
    return WorkspaceAgentFileSystem(tmp_path / "store")


def small(tmp_path: Path, **limits: int) -> WorkspaceAgentFileSystem:
    return WorkspaceAgentFileSystem(tmp_path / "small", FileSystemLimits(**limits))


async def test_round_trip_and_listing(store: WorkspaceAgentFileSystem) -> None:
    await store.write("notes/a.md", "hello")
    await store.write("b.txt", "bee")
    await store.write("notes/sub/c.md", "sea")
    assert await store.read("notes/a.md") == "hello"
    assert await store.ls() == [FileInfo("notes", 0, True), FileInfo("b.txt", 3, False)]
    assert await store.ls("notes") == [
        FileInfo("notes/sub", 0, True),
        FileInfo("notes/a.md", 5, False),
    ]
    assert await store.ls(".") == await store.ls("  ") == await store.ls(None)


async def test_ls_of_a_missing_dir_is_empty_and_of_a_file_is_an_error(
    store: WorkspaceAgentFileSystem,
) -> None:
    await store.write("a.md", "x")
    assert await store.ls("nowhere") == []
    with rejects("Not a directory: a.md"):
        await store.ls("a.md")


async def test_reads_and_probes_never_create_the_store(store: WorkspaceAgentFileSystem) -> None:
    assert await store.ls() == []
    assert await store.glob("**") == []
    assert await store.grep("x") == []
    with rejects("File not found: a.md"):
        await store.read("a.md")
    with rejects("Not found: a.md"):
        await store.delete("a.md")
    assert not store.root.exists()
    assert not store.exists()
    await store.write("a.md", "x")
    assert store.exists()


async def test_read_rejects_directories_oversize_and_binary(tmp_path: Path) -> None:
    store = small(tmp_path, max_file_bytes=10)
    await store.write("dir/a.md", "x")
    with rejects("File not found: dir"):
        await store.read("dir")
    (store.root / "big.txt").write_text("x" * 11)
    with rejects("File too large to read: big.txt is 11 bytes (limit 10)"):
        await store.read("big.txt")
    (store.root / "bin.dat").write_bytes(b"\xff\xfe\x00")
    with rejects("Cannot read bin.dat: it is not UTF-8 text"):
        await store.read("bin.dat")


async def test_write_overwrites_and_rejects_a_directory_target(
    store: WorkspaceAgentFileSystem,
) -> None:
    await store.write("a.md", "one")
    await store.write("a.md", "two")
    assert await store.read("a.md") == "two"
    await store.write("d/x.md", "x")
    with rejects("Cannot write d: it is a directory"):
        await store.write("d", "x")
    with rejects("Cannot write a.md/x: a parent of it is a file"):
        await store.write("a.md/x", "x")
    with rejects("content must not be null"):
        await store.write("n.md", None)  # type: ignore[arg-type]


async def test_glob_relative_paths(store: WorkspaceAgentFileSystem) -> None:
    for path in ("a.md", "docs/b.md", "docs/deep/c.md", "x.py", "src/y.py"):
        await store.write(path, "x")
    assert await store.glob("**.md") == ["a.md", "docs/b.md", "docs/deep/c.md"]
    assert await store.glob("**/*.md") == ["a.md", "docs/b.md", "docs/deep/c.md"]
    assert await store.glob("docs/*.md") == ["docs/b.md"]
    assert await store.glob("*.py") == ["x.py"]
    assert await store.glob("docs/**") == ["docs/b.md", "docs/deep/c.md"]
    assert await store.glob("nothing/*.md") == []
    with rejects("pattern must not be blank"):
        await store.glob("  ")
    with rejects("Invalid glob pattern: [ab"):
        await store.glob("[ab")


async def test_grep_reports_line_numbers_in_path_order(store: WorkspaceAgentFileSystem) -> None:
    await store.write("b.md", "zero\nneedle one\nthree\nneedle two\n")
    await store.write("a/c.md", "needle first\n")
    assert await store.grep("needle") == [
        GrepHit("a/c.md", 1, "needle first"),
        GrepHit("b.md", 2, "needle one"),
        GrepHit("b.md", 4, "needle two"),
    ]
    assert await store.grep("needle", "a") == [GrepHit("a/c.md", 1, "needle first")]
    assert await store.grep("needle", "missing") == []
    with rejects("Invalid regex pattern: (unclosed", prefix=True):
        await store.grep("(unclosed")


async def test_edit_exactly_once(store: WorkspaceAgentFileSystem) -> None:
    await store.write("a.md", "one two two three")
    assert await store.edit("a.md", "one", "1") == 1
    assert await store.read("a.md") == "1 two two three"
    with rejects("old_text matches 2 times in a.md — it must match exactly once", prefix=True):
        await store.edit("a.md", "two", "2")
    with rejects("old_text not found in a.md — nothing was changed"):
        await store.edit("a.md", "four", "4")
    with rejects("File not found: b.md"):
        await store.edit("b.md", "x", "y")
    with rejects("old_text must not be empty"):
        await store.edit("a.md", "", "y")
    assert await store.read("a.md") == "1 two two three", "failed edits changed nothing"
    assert await store.edit("a.md", "two", "2", replace_all=True) == 2
    assert await store.read("a.md") == "1 2 2 three"


async def test_delete_file_tree_and_missing(store: WorkspaceAgentFileSystem) -> None:
    await store.write("a.md", "x")
    await store.write("d/e/f.md", "y")
    await store.write("d/g.md", "z")
    await store.delete("a.md")
    await store.delete("d")
    assert tree(store.root) == {}
    with rejects("Not found: d"):
        await store.delete("d")


async def test_delete_frees_budget(tmp_path: Path) -> None:
    store = small(tmp_path, max_files=2, max_total_bytes=10)
    await store.write("a", "12345")
    await store.write("b", "12345")
    with pytest.raises(FileSystemError, match="already holds 2 files"):
        await store.write("c", "1")
    await store.delete("a")
    await store.write("c", "12345")
    assert (await store.usage()).files == 2


async def test_rename(store: WorkspaceAgentFileSystem) -> None:
    await store.write("a.md", "x")
    await store.rename("a.md", "deep/new/b.md")
    assert await store.read("deep/new/b.md") == "x"
    await store.write("dir/one.md", "1")
    await store.rename("dir", "moved/dir")
    assert await store.glob("**") == ["deep/new/b.md", "moved/dir/one.md"]
    with rejects("Not found: gone.md"):
        await store.rename("gone.md", "x.md")
    with rejects("Destination already exists: moved/dir/one.md — delete it first", prefix=True):
        await store.rename("deep/new/b.md", "moved/dir/one.md")
    with rejects("Cannot move moved into itself (moved/dir/x)"):
        await store.rename("moved", "moved/dir/x")
    assert (await store.usage()).files == 2


def test_conversation_root_and_id_validation(tmp_path: Path) -> None:
    store = WorkspaceAgentFileSystem.for_conversation(tmp_path / "agent", "conv-1")
    assert store.root == tmp_path / "agent" / "files" / "conv-1"
    for bad, message in [
        ("", "conversationId must not be blank"),
        ("  ", "conversationId must not be blank"),
        ("../x", "conversationId must be 1-128"),
        ("a/b", "conversationId must be 1-128"),
        ("a\\b", "conversationId must be 1-128"),
        ("a..b", "conversationId must be 1-128"),
    ]:
        with pytest.raises(FileSystemError, match=message):
            WorkspaceAgentFileSystem.for_conversation(tmp_path, bad)


async def test_bounds_are_enforced_before_any_byte_is_written(tmp_path: Path) -> None:
    store = small(tmp_path, max_file_bytes=10, max_files=2, max_total_bytes=15)
    with rejects("Write rejected: a would be 11 bytes, over the 10-byte per-file limit"):
        await store.write("a", "x" * 11)
    assert not store.root.exists()
    await store.write("a", "x" * 10)
    with rejects(
        "Write rejected: b would bring the store to 16 bytes, over the 15-byte total limit"
    ):
        await store.write("b", "x" * 6)
    await store.write("b", "x" * 5)
    with rejects("Write rejected: the store already holds 2 files, at the 2-file", prefix=True):
        await store.write("c", "x")
    await store.write("a", "y" * 10)  # replacing an existing file is not a new file
    assert tree(store.root) == {"a": b"y" * 10, "b": b"x" * 5}


async def test_utf8_bytes_not_characters_are_counted(tmp_path: Path) -> None:
    store = small(tmp_path, max_file_bytes=4)
    await store.write("a", "éé")
    with pytest.raises(FileSystemError, match="would be 6 bytes"):
        await store.write("b", "ééé")


async def test_edit_enforces_the_bounds(tmp_path: Path) -> None:
    store = small(tmp_path, max_file_bytes=10, max_total_bytes=12)
    await store.write("a", "abc")
    with pytest.raises(FileSystemError, match="would be 12 bytes"):
        await store.edit("a", "b", "b" * 10)
    await store.write("b", "12345")
    with pytest.raises(FileSystemError, match="would bring the store to 13 bytes"):
        await store.edit("a", "b", "bbbbbb")
    assert await store.read("a") == "abc"


def test_non_positive_limits_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"^limits must be positive: 524288/0/16777216/500/256$"):
        FileSystemLimits(max_files=0)


# --- atomic writes ------------------------------------------------------------------------


async def test_a_failed_replace_keeps_the_old_file_and_leaves_no_temp_file(
    store: WorkspaceAgentFileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.write("a.md", "old")

    def no_space(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(workspace_module.os, "replace", no_space)
    with rejects("Failed to write a.md: No space left on device"):
        await store.write("a.md", "new")
    monkeypatch.undo()
    assert tree(store.root) == {"a.md": b"old"}
    await store.write("b.md", "fine")  # the tally recovers from the failure
    assert (await store.usage()).files == 2


async def test_crash_leftovers_are_hidden_and_swept(store: WorkspaceAgentFileSystem) -> None:
    await store.write("a.md", "x")
    orphan = store.root / f".a.md.deadbeef{TEMP_SUFFIX}"
    orphan.write_text("half a fi")
    old = time.time() - 3600
    os.utime(orphan, (old, old))
    fresh = store.root / f".b.md.cafebabe{TEMP_SUFFIX}"
    fresh.write_text("in flight")
    assert [entry.path for entry in await store.ls()] == ["a.md"]
    assert await store.glob("**") == ["a.md"]
    assert await store.grep("fi") == []
    assert await store.usage() == workspace_module.StoreUsage(1, 1)
    assert not orphan.exists(), "an old temp file is swept by the next walk"
    assert fresh.exists(), "a recent one may belong to a write in flight"


async def test_fsync_flushes_the_file_and_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        workspace_module.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd)
    )
    await WorkspaceAgentFileSystem(tmp_path / "plain").write("a.md", "x")
    assert synced == []
    durable = WorkspaceAgentFileSystem(tmp_path / "durable", fsync=True)
    await durable.write("a.md", "x")
    assert len(synced) == 2
    assert await durable.read("a.md") == "x"


# --- the usage tally stays true when the disk changes behind the store's back ---------------


async def test_files_deleted_behind_the_store_never_cause_a_wrong_rejection(
    tmp_path: Path,
) -> None:
    store = small(tmp_path, max_files=2)
    await store.write("a", "x")
    await store.write("b", "x")
    (store.root / "a").unlink()
    await store.write("c", "x")
    assert sorted(tree(store.root)) == ["b", "c"]


async def test_files_added_behind_the_store_are_counted_at_the_next_write(
    tmp_path: Path,
) -> None:
    store = small(tmp_path, max_files=2)
    await store.write("a", "x")
    await asyncio.sleep(0.05)  # past the kernel's coarse timestamp tick
    (store.root / "outside-write").write_text("x")
    with rejects("Write rejected: the store already holds 2 files, at the 2-file limit"):
        await store.write("b", "x")


async def test_a_change_in_a_directory_on_the_path_is_seen_from_the_paths_own_lstats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = small(tmp_path, max_files=3)
    await store.write("d/e/a", "x")
    stamped: list[str] = []
    real = tally_module.mtime
    monkeypatch.setattr(tally_module, "mtime", lambda path: stamped.append(path) or real(path))
    await store.write("d/e/b", "x")
    real_root = os.path.realpath(store.root)
    assert f"{real_root}/d" not in stamped, "its mtime came with the lstat that resolved d/e/b"
    await asyncio.sleep(0.05)  # past the kernel's coarse timestamp tick
    (store.root / "d" / "e" / "outside-write").write_text("x")
    with rejects("Write rejected: the store already holds 3 files, at the 3-file limit"):
        await store.write("d/e/c", "x")


async def test_files_added_in_another_directory_are_seen_by_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = small(tmp_path, max_files=3)
    await store.write("one/a", "x")
    await store.write("two/b", "x")
    await asyncio.sleep(0.05)
    (store.root / "two" / "outside-write").write_text("x")
    monkeypatch.setattr(tally_module, "DIR_CHECK_SECONDS", 0.0)
    with rejects("Write rejected: the store already holds 3 files, at the 3-file limit"):
        await store.write("one/c", "x")


async def test_the_tally_is_not_rebuilt_by_every_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = WorkspaceAgentFileSystem(tmp_path / "s")
    walks: list[int] = []
    real_sync = WorkspaceAgentFileSystem._sync
    monkeypatch.setattr(
        WorkspaceAgentFileSystem, "_sync", lambda self: walks.append(1) or real_sync(self)
    )
    for n in range(60):
        await store.write(f"d{n % 6}/f{n}.txt", "x" * n)
    await store.edit("d1/f1.txt", "x", "y")
    await store.delete("d2/f2.txt")
    await store.rename("d3/f3.txt", "d4/moved.txt")
    assert len(walks) == 1, "one walk for the first write, then the running tally"
    assert await store.usage() == workspace_module.StoreUsage(59, sum(range(60)) - 2)


async def test_a_target_changed_on_disk_triggers_a_resync(tmp_path: Path) -> None:
    store = small(tmp_path, max_total_bytes=10)
    await store.write("a", "x")
    await store.write("b", "xxxx")
    (store.root / "a").write_text("x" * 9)  # the store believed 1 byte: its total is 8 short
    with pytest.raises(FileSystemError, match="would bring the store to 12 bytes"):
        await store.write("a", "x" * 8)


# --- one lock and one tally per directory, shared and raced -----------------------------------


def test_instances_on_one_directory_share_their_state(tmp_path: Path) -> None:
    first = WorkspaceAgentFileSystem(tmp_path / "s")
    second = WorkspaceAgentFileSystem(str(tmp_path / "s"))
    assert first._ledger is second._ledger
    assert is_live(tmp_path / "s")
    del first, second
    gc.collect()
    assert not is_live(tmp_path / "s")


async def test_32_concurrent_writers_cannot_pass_the_count_bound(tmp_path: Path) -> None:
    limits = FileSystemLimits(max_files=8)
    stores = [WorkspaceAgentFileSystem(tmp_path / "race", limits) for _ in range(2)]
    results = await asyncio.gather(
        *(stores[i % 2].write(f"f{i:02d}.txt", f"payload {i}" * 50) for i in range(32)),
        return_exceptions=True,
    )
    written = [r for r in results if r is None]
    rejected = [r for r in results if isinstance(r, FileSystemError)]
    assert len(written) == 8
    assert len(rejected) == 24
    assert all("at the 8-file limit" in str(r) for r in rejected)
    files = tree(stores[0].root)
    assert len(files) == 8
    for name, data in files.items():
        assert data == f"payload {int(name[1:3])}".encode() * 50, "a partial file"


async def test_32_concurrent_writers_cannot_pass_the_total_bound(tmp_path: Path) -> None:
    limits = FileSystemLimits(max_total_bytes=5 * 4000 + 100)
    stores = [WorkspaceAgentFileSystem(tmp_path / "race", limits) for _ in range(2)]
    results = await asyncio.gather(
        *(stores[i % 2].write(f"f{i:02d}.txt", chr(65 + i) * 4000) for i in range(32)),
        return_exceptions=True,
    )
    assert sum(r is None for r in results) == 5
    files = tree(stores[0].root)
    assert sum(len(data) for data in files.values()) <= limits.max_total_bytes
    assert all(len(set(data)) == 1 and len(data) == 4000 for data in files.values())


async def test_readers_racing_writers_see_whole_versions_only(
    store: WorkspaceAgentFileSystem,
) -> None:
    versions = [chr(97 + i) * 200_000 for i in range(8)]
    await store.write("shared.txt", versions[0])
    seen: list[str] = []

    async def read_many() -> None:
        for _ in range(40):
            seen.append(await store.read("shared.txt"))

    await asyncio.gather(
        read_many(),
        read_many(),
        *(store.write("shared.txt", version) for version in versions * 3),
    )
    assert set(seen) <= set(versions)
    assert await store.read("shared.txt") in versions
    assert tree(store.root).keys() == {"shared.txt"}


def test_a_read_given_the_size_it_just_saw_still_reads_a_file_that_changed(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    seen = os.stat(path).st_size
    path.write_bytes(b"y" * 5000)  # grown since the size was taken
    assert read_bytes(str(path), 10_000, size=seen) == b"y" * 5000
    assert read_bytes(str(path), 4_000, size=seen) is None, "past the limit once read"
    path.write_bytes(b"z" * 10)  # shrunk
    assert read_bytes(str(path), 10_000, size=seen) == b"z" * 10
    assert read_bytes(str(path), 50, size=seen) is None, "the size given is past the limit"
    data, fd = read_open(str(path), 10_000, size=10)
    try:
        assert data == b"z" * 10
        assert os.fstat(fd).st_ino == os.stat(path).st_ino, "left open on the file it read"
    finally:
        os.close(fd)


EDIT_ALPHABET = "aé€😀\n"


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.text(alphabet=EDIT_ALPHABET, max_size=30),
    old=st.text(alphabet=EDIT_ALPHABET, min_size=1, max_size=3),
    new=st.text(alphabet=EDIT_ALPHABET + "b", max_size=3),
    replace_all=st.booleans(),
)
def test_an_edit_counts_and_replaces_exactly_as_the_text_would(
    tmp_path_factory: pytest.TempPathFactory, text: str, old: str, new: str, replace_all: bool
) -> None:
    """The edit works on the file's UTF-8 bytes; its answers are the text's."""
    root = tmp_path_factory.mktemp("edit")

    async def edit() -> tuple[int | str, str]:
        fs = WorkspaceAgentFileSystem(root / "s")
        await fs.write("f.md", text)
        try:
            answer: int | str = await fs.edit("f.md", old, new, replace_all=replace_all)
        except FileSystemError as exc:
            answer = str(exc)
        return answer, await fs.read("f.md")

    count = text.count(old)
    if count == 0:
        expected: tuple[int | str, str] = (
            "old_text not found in f.md — nothing was changed",
            text,
        )
    elif count > 1 and not replace_all:
        expected = (
            f"old_text matches {count} times in f.md — it must match exactly once; include more "
            "surrounding context, or pass replace_all to replace every match",
            text,
        )
    else:
        expected = (count if replace_all else 1, text.replace(old, new, -1 if replace_all else 1))
    assert asyncio.run(edit()) == expected


async def test_an_edit_of_text_no_utf8_file_can_hold_finds_nothing(tmp_path: Path) -> None:
    store = small(tmp_path)
    await store.write("f.md", "a\ud7ff b")
    with rejects("old_text not found in f.md — nothing was changed"):
        await store.edit("f.md", "\ud800", "x")  # a lone surrogate: not text UTF-8 can encode
    (store.root / "bin.dat").write_bytes(b"\xff\xfe a")
    with rejects("Cannot read bin.dat: it is not UTF-8 text"):
        await store.edit("bin.dat", "a", "b")
