"""`CompositeAgentFileSystem` routing and the provider: routes, fan-out, the conversation cap."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import pytest

from atmosphere_harness import (
    CompositeAgentFileSystem,
    FileSystemLimits,
    HarnessSettings,
    WorkspaceAgentFileSystem,
)
from atmosphere_harness._filesystem import AgentFileSystemProvider, FileInfo, GrepHit
from atmosphere_harness._filesystem.composite import normalize_routes
from atmosphere_harness._filesystem.primitive import FilesystemPrimitive
from atmosphere_harness._kernel.host import HarnessHost
from atmosphere_harness._runtimes.scripted import ScriptedRuntime
from tests.fs_support import rejects, tree


@pytest.fixture
def parts(tmp_path: Path) -> tuple[CompositeAgentFileSystem, dict[str, WorkspaceAgentFileSystem]]:
    backends = {
        "default": WorkspaceAgentFileSystem(tmp_path / "default"),
        "memory": WorkspaceAgentFileSystem(tmp_path / "memory"),
        "memory/deep": WorkspaceAgentFileSystem(tmp_path / "deep"),
        "shared": WorkspaceAgentFileSystem(
            tmp_path / "shared", FileSystemLimits(max_file_bytes=10)
        ),
    }
    composite = CompositeAgentFileSystem(
        backends["default"],
        {
            "memory/": backends["memory"],
            "memory/deep": backends["memory/deep"],
            "shared": backends["shared"],
        },
    )
    return composite, backends


async def test_writes_route_by_prefix_with_the_path_unchanged(
    parts: tuple[CompositeAgentFileSystem, dict[str, WorkspaceAgentFileSystem]],
) -> None:
    composite, backends = parts
    await composite.write("notes.md", "default")
    await composite.write("memory/prefs.md", "memory")
    await composite.write("memory/deep/x.md", "deep")
    await composite.write("memoryfoo/y.md", "default too")
    assert tree(backends["default"].root) == {
        "notes.md": b"default",
        "memoryfoo/y.md": b"default too",
    }
    assert tree(backends["memory"].root) == {"memory/prefs.md": b"memory"}
    assert tree(backends["memory/deep"].root) == {"memory/deep/x.md": b"deep"}
    assert await composite.read("memory/prefs.md") == "memory"
    assert await composite.edit("memory/deep/x.md", "deep", "DEEP") == 1
    assert await composite.read("memory/deep/x.md") == "DEEP"
    await composite.delete("memory/prefs.md")
    assert tree(backends["memory"].root) == {}


async def test_every_delegate_keeps_its_bounds_and_path_checks(
    parts: tuple[CompositeAgentFileSystem, dict[str, WorkspaceAgentFileSystem]],
) -> None:
    composite, _ = parts
    with rejects("Write rejected: shared/a would be 11 bytes, over the 10-byte per-file limit"):
        await composite.write("shared/a", "x" * 11)
    with rejects("path contains an illegal segment ('..'): memory/../x"):
        await composite.write("memory/../x", "x")
    with rejects("path must not be blank"):
        await composite.read("  ")


async def test_rename_within_a_backend_works_and_across_backends_fails_loudly(
    parts: tuple[CompositeAgentFileSystem, dict[str, WorkspaceAgentFileSystem]],
) -> None:
    composite, _ = parts
    await composite.write("memory/a.md", "x")
    await composite.rename("memory/a.md", "memory/b.md")
    assert await composite.read("memory/b.md") == "x"
    with rejects(
        "cross-backend rename is not supported: memory/b.md -> notes/b.md "
        "(source and destination route to different backends)"
    ):
        await composite.rename("memory/b.md", "notes/b.md")
    assert await composite.read("memory/b.md") == "x"


async def test_ls_merges_the_root_and_routes_a_directory(
    parts: tuple[CompositeAgentFileSystem, dict[str, WorkspaceAgentFileSystem]],
) -> None:
    composite, _ = parts
    assert await composite.ls() == [
        FileInfo("memory", 0, True),
        FileInfo("shared", 0, True),
    ], "routed prefixes are visible before anything is written"
    await composite.write("a.md", "x")
    await composite.write("memory/m.md", "mm")
    await composite.write("memory/deep/d.md", "d")
    assert await composite.ls() == [
        FileInfo("memory", 0, True),
        FileInfo("shared", 0, True),
        FileInfo("a.md", 1, False),
    ]
    assert await composite.ls("memory") == [
        FileInfo("memory/deep", 0, True),
        FileInfo("memory/m.md", 2, False),
    ]
    assert await composite.ls("memory/deep") == [FileInfo("memory/deep/d.md", 1, False)]


async def test_glob_fans_out_and_grep_fans_out_at_the_root_but_routes_when_scoped(
    parts: tuple[CompositeAgentFileSystem, dict[str, WorkspaceAgentFileSystem]],
) -> None:
    composite, _ = parts
    await composite.write("a.md", "needle")
    await composite.write("memory/b.md", "needle")
    await composite.write("memory/deep/c.md", "needle")
    await composite.write("shared/d.txt", "needle")
    assert await composite.glob("**/*.md") == ["a.md", "memory/b.md", "memory/deep/c.md"]
    assert await composite.grep("needle") == [
        GrepHit("a.md", 1, "needle"),
        GrepHit("memory/deep/c.md", 1, "needle"),
        GrepHit("memory/b.md", 1, "needle"),
        GrepHit("shared/d.txt", 1, "needle"),
    ]
    assert await composite.grep("needle", "memory") == [
        GrepHit("memory/b.md", 1, "needle"),
        GrepHit("memory/deep/c.md", 1, "needle"),
    ]
    assert await composite.grep("needle", "shared") == [GrepHit("shared/d.txt", 1, "needle")]


async def test_files_shadowed_by_a_route_are_never_listed(tmp_path: Path) -> None:
    default = WorkspaceAgentFileSystem(tmp_path / "default")
    await default.write("memory/old.md", "written before the route existed")
    composite = CompositeAgentFileSystem(
        default, {"memory": WorkspaceAgentFileSystem(tmp_path / "memory")}
    )
    assert await composite.glob("**") == []
    assert await composite.grep("written") == []
    assert await composite.ls("memory") == []
    with rejects("File not found: memory/old.md"):
        await composite.read("memory/old.md")


async def test_root_grep_is_capped_globally(tmp_path: Path) -> None:
    limits = FileSystemLimits(max_grep_hits=3)
    composite = CompositeAgentFileSystem(
        WorkspaceAgentFileSystem(tmp_path / "a", limits),
        {"b": WorkspaceAgentFileSystem(tmp_path / "b", limits)},
    )
    await composite.write("x.md", "hit\nhit\n")
    await composite.write("b/y.md", "hit\nhit\n")
    hits = await composite.grep("hit")
    assert [(hit.path, hit.line) for hit in hits] == [("x.md", 1), ("x.md", 2), ("b/y.md", 1)]
    assert composite.max_grep_hits == 3


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        ({" ": 1}, "route prefix must not be blank"),
        ({"a\\b": 1}, "route prefix must use forward slashes: a\\b"),
        ({"/abs": 1}, "route prefix must be a relative, non-root path: /abs"),
        ({"/": 1}, "route prefix must be a relative, non-root path: /"),
        ({"a//b": 1}, "route prefix has an illegal segment (''): a//b"),
        ({"a/../b": 1}, "route prefix has an illegal segment ('..'): a/../b"),
        ({"memory": 1, "memory/": 2}, "duplicate route prefix: memory/ (normalizes to 'memory')"),
        ({"x": None}, "route filesystem must not be null for prefix: x"),
    ],
)
def test_malformed_routes_are_rejected(routes: dict[str, object], message: str) -> None:
    with rejects(message):
        normalize_routes(routes)


def test_route_keys_normalize_like_the_builder(tmp_path: Path) -> None:
    backend = WorkspaceAgentFileSystem(tmp_path / "m")
    assert normalize_routes({" memory/ ": backend, "a/b": backend}) == {
        "memory": backend,
        "a/b": backend,
    }
    composite = CompositeAgentFileSystem(backend, {"z": backend, "a/b": backend, "a": backend})
    assert list(composite.routes) == ["a/b", "a", "z"], "longest first, then by name"


# --- routes from the settings, checked when the host starts ----------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("memory/=/var/a,memory=/var/b", "duplicate route prefix: memory (normalizes to 'memory')"),
        ("/etc=/var/a", "route prefix must be a relative, non-root path: /etc"),
        ("a/../b=/var/a", "route prefix has an illegal segment ('..'): a/../b"),
    ],
)
async def test_bad_routes_stop_the_host_at_start_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str, message: str
) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_FILESYSTEM_ROUTES", value)
    host = HarnessHost(
        HarnessSettings(workspace_root=tmp_path),
        runtime=ScriptedRuntime(),
        specs=[],
        primitives=[FilesystemPrimitive()],
    )
    with pytest.raises(ValueError, match=r"^ATMOSPHERE_AI_FILESYSTEM_ROUTES: ") as raised:
        await host.start()
    assert str(raised.value).endswith(message)


def test_an_entry_without_a_directory_is_rejected_by_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLM_FILESYSTEM_ROUTES", "memory/")
    with pytest.raises(ValueError, match="malformed filesystem route 'memory/'"):
        HarnessSettings()


# --- the provider ----------------------------------------------------------------------------


async def test_no_routes_gives_a_plain_workspace_and_routes_a_shared_backend(
    tmp_path: Path,
) -> None:
    plain = AgentFileSystemProvider(tmp_path / "plain")
    assert isinstance(plain.for_conversation("c1"), WorkspaceAgentFileSystem)
    shared = WorkspaceAgentFileSystem.for_conversation(tmp_path / "durable", "shared")
    provider = AgentFileSystemProvider(tmp_path / "agent", routes={"memory/": shared})
    first = provider.for_conversation("c1")
    assert isinstance(first, CompositeAgentFileSystem)
    await first.write("memory/prefs.md", "likes tea")
    await first.write("scratch.md", "only c1")
    second = provider.for_conversation("c2")
    assert await second.read("memory/prefs.md") == "likes tea"
    assert await second.glob("**") == ["memory/prefs.md"]
    assert (tmp_path / "durable" / "files" / "shared" / "memory" / "prefs.md").is_file()
    assert provider.workspace("c1").root == tmp_path / "agent" / "files" / "c1"


async def test_probing_a_conversation_never_creates_it(tmp_path: Path) -> None:
    provider = AgentFileSystemProvider(tmp_path / "agent")
    fs = provider.for_conversation("ghost")
    assert await fs.ls() == []
    assert not provider.has_conversation("ghost")
    assert provider.conversations() == []
    assert not (tmp_path / "agent").exists()
    await fs.write("a.md", "x")
    assert provider.has_conversation("ghost")
    assert provider.conversations() == ["ghost"]


def test_the_provider_hands_out_one_instance_while_it_is_held(tmp_path: Path) -> None:
    provider = AgentFileSystemProvider(tmp_path / "agent")
    held = provider.for_conversation("c1")
    assert provider.for_conversation("c1") is held
    with rejects("conversationId must not be blank"):
        provider.for_conversation(" ")


async def test_at_the_conversation_cap_eviction_makes_room_for_an_eighth_of_it(
    tmp_path: Path,
) -> None:
    provider = AgentFileSystemProvider(tmp_path / "agent", FileSystemLimits(max_conversations=8))
    past = time.time() - 1000
    for index in range(8):
        await provider.for_conversation(f"c{index}").write("a.md", "x")
        os.utime(tmp_path / "agent" / "files" / f"c{index}", (past + index,) * 2)
    gc.collect()
    await provider.for_conversation("n1").write("a.md", "x")
    kept = [f"c{index}" for index in range(2, 8)]
    assert provider.conversations() == [*kept, "n1"], "the 2 oldest went: 6 + the new one"
    await provider.for_conversation("n2").write("a.md", "x")
    assert provider.conversations() == [*kept, "n1", "n2"], "no eviction below the cap"
    gc.collect()
    await provider.for_conversation("n3").write("a.md", "x")
    assert len(provider.conversations()) == 7


async def test_the_conversation_cap_evicts_the_oldest_and_skips_live_stores(
    tmp_path: Path,
) -> None:
    provider = AgentFileSystemProvider(tmp_path / "agent", FileSystemLimits(max_conversations=3))
    live = provider.for_conversation("live")
    await live.write("a.md", "keep me")
    for name in ("old1", "old2"):
        await provider.for_conversation(name).write("a.md", name)
    gc.collect()
    past = time.time() - 1000
    for age, name in enumerate(("live", "old1", "old2")):
        os.utime(tmp_path / "agent" / "files" / name, (past + age, past + age))
    await provider.for_conversation("new1").write("a.md", "new")
    assert provider.conversations() == ["live", "new1", "old2"], "old1 evicted, live skipped"
    assert await live.read("a.md") == "keep me"
    await provider.for_conversation("new2").write("a.md", "new")
    assert provider.conversations() == ["live", "new1", "new2"]
