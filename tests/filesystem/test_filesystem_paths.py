"""Path validation and containment: Atmosphere's attack list, generated paths, planted links."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atmosphere_harness import FileSystemLimits, WorkspaceAgentFileSystem
from atmosphere_harness._errors import FileSystemError
from atmosphere_harness._filesystem.paths import (
    MAX_PATH_CHARS,
    MAX_SEGMENT_BYTES,
    TEMP_SUFFIX,
    check_path,
)
from atmosphere_harness._filesystem.paths import shown as shown_path
from tests.fs_support import tree

# Atmosphere's Java harness's pinned attack strings and the message each must give.
ATTACKS = [
    ("../secret.txt", "path contains an illegal segment ('..'): ../secret.txt"),
    ("..", "path contains an illegal segment ('..'): .."),
    ("a/../../secret.txt", "path contains an illegal segment ('..'): a/../../secret.txt"),
    ("/etc/passwd", "path must be relative: /etc/passwd"),
    ("a\\..\\b", "path must use forward slashes: a\\..\\b"),
    ("a//b", "path contains an illegal segment (''): a//b"),
    ("", "path must not be blank"),
    ("  ", "path must not be blank"),
    ("./a", "path contains an illegal segment ('.'): ./a"),
    ("a/./b", "path contains an illegal segment ('.'): a/./b"),
    ("a/", "path contains an illegal segment (''): a/"),
    # Beyond Atmosphere's Java harness: what a POSIX port must reject explicitly.
    ("a\x00b", "path must not contain NUL characters: a\\x00b"),
    ("a\nb", "path must not contain control characters: a\\x0ab"),
    ("x" * 1025, "path is too long: 1025 chars (limit 1024)"),
    ("d/" + "n" * 201, "path has a name of 201 bytes, over the 200-byte limit: d/" + "n" * 201),
    ("a\ud800b", "path is not valid Unicode text: a\ud800b"),
    (f"a{TEMP_SUFFIX}", f"names ending in {TEMP_SUFFIX} are reserved: a{TEMP_SUFFIX}"),
]

ALLOWED = [
    "report..final.md",
    "app/[...slug]/page.tsx",
    "..hidden",
    "a..",
    "...",
    "résumé/日本語.md",
    "spaces in name.txt",
    "  padded.md  ",
]


@pytest.fixture
def store(tmp_path: Path) -> WorkspaceAgentFileSystem:
    return WorkspaceAgentFileSystem(tmp_path / "store")


@pytest.mark.parametrize(("path", "message"), ATTACKS)
async def test_every_operation_rejects_the_attack_list(
    store: WorkspaceAgentFileSystem, tmp_path: Path, path: str, message: str
) -> None:
    await store.write("keep.md", "kept")
    before = tree(tmp_path)
    operations = [
        lambda: store.read(path),
        lambda: store.write(path, "pwned"),
        lambda: store.edit(path, "a", "b"),
        lambda: store.delete(path),
        lambda: store.rename(path, "x.md"),
        lambda: store.rename("keep.md", path),
    ]
    if path.strip():
        operations += [lambda: store.ls(path), lambda: store.grep("a", path)]
    for operation in operations:
        with pytest.raises(FileSystemError) as raised:
            await operation()
        assert str(raised.value) == message
    assert tree(tmp_path) == before, "a rejected operation changed the disk"


@pytest.mark.parametrize("path", ALLOWED)
async def test_names_with_dots_and_unicode_are_allowed(
    store: WorkspaceAgentFileSystem, path: str
) -> None:
    await store.write(path, f"content of {path}")
    assert await store.read(path) == f"content of {path}"
    assert (store.root / path.strip()).read_text() == f"content of {path}"
    assert path.strip() in await store.glob("**")


segment = st.text(alphabet="ab.é日-_~[]", min_size=1, max_size=12)
relative_paths = st.lists(segment, min_size=1, max_size=5).map("/".join)


@settings(max_examples=3000, deadline=None)
@given(st.one_of(st.text(max_size=60), relative_paths))
def test_no_accepted_path_resolves_outside_the_root(path: str) -> None:
    root = "/srv/store"
    try:
        checked = check_path(path)
    except FileSystemError:
        return
    resolved = os.path.normpath(os.path.join(root, checked))
    assert resolved.startswith(root + "/"), (path, resolved)
    assert os.path.relpath(resolved, root) == checked, "the path was not already normal"


@settings(max_examples=3000, deadline=None)
@given(relative_paths)
def test_dot_segments_are_rejected_and_dotted_names_accepted(path: str) -> None:
    segments = path.split("/")
    if any(part in (".", "..") for part in segments):
        with pytest.raises(FileSystemError, match="illegal segment"):
            check_path(path)
    else:
        assert check_path(path) == path


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(st.one_of(st.text(max_size=30), relative_paths), min_size=1, max_size=8))
def test_generated_writes_land_inside_the_store_or_are_rejected(
    tmp_path_factory: pytest.TempPathFactory, paths: list[str]
) -> None:
    base = tmp_path_factory.mktemp("prop")
    outside = base / "outside"
    outside.mkdir()
    (outside / "sentinel").write_text("untouched")
    store = WorkspaceAgentFileSystem(base / "store", FileSystemLimits(max_files=10_000))

    async def scenario() -> None:
        for path in paths:
            try:
                await store.write(path, "x")
            except FileSystemError:
                continue
            written = store.root / path.strip()
            assert written.read_text() == "x"
            assert written.resolve().is_relative_to(store.root.resolve())

    asyncio.run(scenario())
    assert tree(outside) == {"sentinel": b"untouched"}
    assert {p.name for p in base.iterdir()} <= {"outside", "store", ".store.lock", ".store.live"}


# --- planted symlinks ----------------------------------------------------------------------


@pytest.fixture
def planted(tmp_path: Path) -> tuple[WorkspaceAgentFileSystem, Path]:
    """A store with links planted by an outside process: a directory and a file outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret")
    root = tmp_path / "store"
    root.mkdir()
    (root / "real").mkdir()
    (root / "real" / "note.md").write_text("inside")
    os.symlink(outside, root / "evil")
    os.symlink(outside / "secret.txt", root / "pw.txt")
    os.symlink(root / "real", root / "alias")
    return WorkspaceAgentFileSystem(root), outside


async def test_a_planted_directory_link_redirects_neither_reads_nor_writes(
    planted: tuple[WorkspaceAgentFileSystem, Path],
) -> None:
    store, outside = planted
    escape = "Path escapes the store root via a link: "
    for operation, shown in [
        (lambda: store.read("evil/secret.txt"), "evil/secret.txt"),
        (lambda: store.write("evil/new.txt", "pwned"), "evil/new.txt"),
        (lambda: store.write("evil/deep/new.txt", "pwned"), "evil/deep/new.txt"),
        (lambda: store.edit("evil/secret.txt", "top", "no"), "evil/secret.txt"),
        (lambda: store.read("pw.txt"), "pw.txt"),
        (lambda: store.write("pw.txt", "pwned"), "pw.txt"),
        (lambda: store.ls("evil"), "evil"),
        (lambda: store.grep("secret", "evil"), "evil"),
        (lambda: store.rename("real/note.md", "evil/note.md"), "evil/note.md"),
    ]:
        with pytest.raises(FileSystemError) as raised:
            await operation()
        assert str(raised.value) == escape + shown
    assert tree(outside) == {"secret.txt": b"top secret"}


async def test_searches_never_follow_links_and_delete_removes_only_the_link(
    planted: tuple[WorkspaceAgentFileSystem, Path],
) -> None:
    store, outside = planted
    assert await store.glob("**") == ["real/note.md"]
    assert [hit.path for hit in await store.grep("secret|inside")] == ["real/note.md"]
    assert [entry.path for entry in await store.ls()] == ["real"]
    assert (await store.usage()).files == 1
    await store.delete("evil")
    await store.delete("pw.txt")
    assert tree(outside) == {"secret.txt": b"top secret"}
    assert not (store.root / "evil").exists()


async def test_a_link_that_stays_inside_the_store_is_followed(
    planted: tuple[WorkspaceAgentFileSystem, Path],
) -> None:
    store, _ = planted
    assert await store.read("alias/note.md") == "inside"
    await store.write("alias/new.md", "via alias")
    assert (store.root / "real" / "new.md").read_text() == "via alias"


async def test_a_store_below_a_symlinked_directory_works(tmp_path: Path) -> None:
    (tmp_path / "disk").mkdir()
    os.symlink(tmp_path / "disk", tmp_path / "mount")
    store = WorkspaceAgentFileSystem(tmp_path / "mount" / "store")
    await store.write("a/b.md", "ok")
    assert await store.read("a/b.md") == "ok"
    assert (tmp_path / "disk" / "store" / "a" / "b.md").read_text() == "ok"


async def test_a_store_whose_root_is_a_symlink_works_in_its_target(tmp_path: Path) -> None:
    (tmp_path / "target").mkdir()
    os.symlink(tmp_path / "target", tmp_path / "root")
    store = WorkspaceAgentFileSystem(tmp_path / "root")
    await store.write("a.md", "ok")
    assert (tmp_path / "target" / "a.md").read_text() == "ok"
    assert store._real() == str(tmp_path / "target")


async def test_a_new_stores_first_write_resolves_its_parent_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "disk").mkdir()
    os.symlink(tmp_path / "disk", tmp_path / "mount")
    store = WorkspaceAgentFileSystem(tmp_path / "mount" / "files" / "c1")
    (tmp_path / "disk" / "files").mkdir()
    resolved: list[str] = []
    real = os.path.realpath

    def counted(path: str) -> str:
        resolved.append(path)
        return real(path)

    monkeypatch.setattr(os.path, "realpath", counted)
    await store.write("pkg/a.md", "ok")
    await store.write("pkg/b.md", "ok")
    assert resolved == [str(tmp_path / "mount" / "files")], "the parent, once; the root never"
    assert store._real() == str(tmp_path / "disk" / "files" / "c1")
    assert (tmp_path / "disk" / "files" / "c1" / "pkg" / "b.md").read_text() == "ok"


def reference_shown(value: str) -> str:
    """`shown` as it was written first: a test per character."""
    if all(" " <= char != "\x7f" for char in value):
        return value
    return "".join(char if " " <= char != "\x7f" else f"\\x{ord(char):02x}" for char in value)


def reference_check(path: str) -> str:
    """`check_path` as it was written first (before the C-level scans), for comparison."""
    if not path.strip():
        raise FileSystemError("path must not be blank")
    text = path.strip()
    echo = reference_shown(path)
    if "\x00" in text:
        raise FileSystemError(f"path must not contain NUL characters: {echo}")
    if not all(" " <= char != "\x7f" for char in text):
        raise FileSystemError(f"path must not contain control characters: {echo}")
    if "\\" in text:
        raise FileSystemError(f"path must use forward slashes: {echo}")
    if text.startswith("/"):
        raise FileSystemError(f"path must be relative: {echo}")
    if len(text) > MAX_PATH_CHARS:
        raise FileSystemError(f"path is too long: {len(text)} chars (limit {MAX_PATH_CHARS})")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise FileSystemError(f"path is not valid Unicode text: {echo}") from None
    for segment in text.split("/"):
        if segment in ("", ".", ".."):
            raise FileSystemError(f"path contains an illegal segment ('{segment}'): {echo}")
        size = len(segment.encode("utf-8"))
        if size > MAX_SEGMENT_BYTES:
            raise FileSystemError(
                f"path has a name of {size} bytes, over the {MAX_SEGMENT_BYTES}-byte limit: {echo}"
            )
        if segment.endswith(TEMP_SUFFIX):
            raise FileSystemError(f"names ending in {TEMP_SUFFIX} are reserved: {echo}")
    return text


def outcome(check: object, path: str) -> str:
    try:
        return "ok: " + check(path)  # type: ignore[operator]
    except FileSystemError as exc:
        return "error: " + str(exc)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=12),
            st.sampled_from(["", ".", "..", "\x7f", "\x1f", " ", "é" * 101, "n" * 201]),
            st.just(f"x{TEMP_SUFFIX}"),
        ),
        min_size=1,
        max_size=5,
    ).map("/".join)
)
def test_path_checks_answer_exactly_as_the_per_character_versions(path: str) -> None:
    assert outcome(check_path, path) == outcome(reference_check, path)
    assert shown_path(path) == reference_shown(path)
