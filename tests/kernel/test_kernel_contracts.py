"""The kernel's seams: typed keys, settings groups, and state backends that slot in unchanged."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from atmosphere_harness import HarnessSettings, ScriptedRuntime, agent
from atmosphere_harness._assembly import build_host, default_primitives
from atmosphere_harness._backends import StateBackends, resolve_backends
from atmosphere_harness._contracts import Key, TypedMap
from atmosphere_harness._kernel.host import HarnessHost
from atmosphere_harness._kernel.live import LiveRuns
from atmosphere_harness._kernel.locks import InProcessConversationLocks
from atmosphere_harness._registry import spec_of
from tests.agents import echo

ROOT = Path(__file__).resolve().parents[2]


ContractEcho = echo(agent(name="contract-echo", headless=False), "ContractEcho")


def test_typed_map_keeps_values_by_key_identity_not_name() -> None:
    first: Key[int] = Key("same")
    second: Key[int] = Key("same")
    values = TypedMap()
    values.set(first, 1)
    assert values.get(first) == 1
    assert values.get(second) is None, "two keys with one name are two keys"
    assert values.get(second, 7) == 7
    assert values.setdefault(second, lambda: 2) == 2
    assert values.setdefault(second, lambda: 3) == 2
    assert values.pop(first) == 1
    assert first not in values
    with pytest.raises(LookupError, match="same is not available"):
        values.require(first)


def test_settings_groups_mirror_the_flat_settings(workspace: Path) -> None:
    settings = HarnessSettings(
        workspace_root=workspace,
        tool_output_offload_threshold=123,
        subagent_max_depth=2,
        conversation_idle_timeout=9,
        admin_token="secret-token",
        postgres_url="postgresql://u:pw@db/x",
    )
    groups = settings.groups
    assert groups is settings.groups, "built once"
    assert groups.filesystem.offload_threshold == 123
    assert groups.filesystem.workspace_root == workspace
    assert groups.filesystem.limits == settings.filesystem_limits
    assert groups.delegation.max_depth == 2
    assert groups.memory.idle_timeout == 9
    assert groups.admin.token == "secret-token"
    assert groups.backends.postgres_url == "postgresql://u:pw@db/x"
    # Secrets never show in a repr (logs print settings groups).
    assert "secret-token" not in repr(groups)
    assert "pw@" not in repr(groups)


def test_settings_groups_read_the_same_environment_names(
    monkeypatch: pytest.MonkeyPatch, workspace: Path
) -> None:
    monkeypatch.setenv("LLM_TOOL_OUTPUT_OFFLOAD_THRESHOLD", "77")
    monkeypatch.setenv("ATMOSPHERE_ADMIN_TOKEN", "from-env")
    groups = HarnessSettings(workspace_root=workspace).groups
    assert groups.filesystem.offload_threshold == 77
    assert groups.admin.token == "from-env"


def test_embedded_backends_are_chosen_in_one_place(workspace: Path) -> None:
    backends = resolve_backends(HarnessSettings(workspace_root=workspace))
    assert backends.describe() == {"state": "sqlite", "events": "local", "workspace": "files"}
    assert isinstance(backends.runs, LiveRuns)
    assert isinstance(backends.locks, InProcessConversationLocks)
    host = build_host(
        HarnessSettings(workspace_root=workspace),
        runtime=ScriptedRuntime(["hi"]),
        specs=[spec_of(ContractEcho)],
    )
    assert host.backends == {"state": "sqlite", "events": "local", "workspace": "files"}


class RecordingLocks:
    """A `ConversationLocks` of our own: what a Redis or PostgreSQL lock would slot in as."""

    def __init__(self) -> None:
        self.held: list[tuple[str, str]] = []
        self.inner = InProcessConversationLocks()

    @contextlib.asynccontextmanager
    async def hold(self, path: str, conversation_id: str) -> AsyncIterator[None]:
        self.held.append((path, conversation_id))
        async with self.inner.hold(path, conversation_id):
            yield


class RecordingJournal(LiveRuns):
    def __init__(self) -> None:
        super().__init__()
        self.started: list[str] = []

    def start(self, work, *, path, conversation_id, user_id, **more):  # type: ignore[no-untyped-def]
        self.started.append(conversation_id)
        return super().start(
            work, path=path, conversation_id=conversation_id, user_id=user_id, **more
        )


async def test_a_backend_slots_in_without_touching_a_primitive(workspace: Path) -> None:
    locks = RecordingLocks()
    journal = RecordingJournal()
    backends = StateBackends(state="test", events="test", locks=locks, runs=journal)
    host = HarnessHost(
        HarnessSettings(workspace_root=workspace, conversation_idle_timeout=0),
        runtime=ScriptedRuntime(["first", "second"]),
        specs=[spec_of(ContractEcho)],
        primitives=default_primitives(backends),
        locks=backends.locks,
        runs=backends.runs,
    )
    await host.start()
    try:
        endpoint = host.endpoints["/atmosphere/agent/contract-echo"]
        for _ in range(2):
            live = host.start_run(endpoint, message="hello", conversation_id="c1", user_id=None)
            frames = [frame async for frame in live.follow(0)]
            assert frames[-1].event == "complete"
    finally:
        await host.stop()
    assert locks.held == [("/atmosphere/agent/contract-echo", "c1")] * 2
    assert journal.started == ["c1", "c1"]


class RecordingResource:
    """A `Resource` (what a backend's pool is): opened before the primitives, closed last."""

    def __init__(self, name: str, events: list[str], *, fail_open: bool = False) -> None:
        self.name = name
        self.events = events
        self.fail_open = fail_open

    async def open(self) -> None:
        if self.fail_open:
            raise ConnectionError(f"{self.name} is unreachable")
        self.events.append(f"open {self.name}")

    async def aclose(self) -> None:
        self.events.append(f"close {self.name}")


async def test_the_host_opens_backend_resources_first_and_closes_them_last(
    workspace: Path,
) -> None:
    events: list[str] = []
    backends = StateBackends(
        state="test",
        events="test",
        resources=[RecordingResource("pool", events), RecordingResource("listener", events)],
    )
    host = build_host(
        HarnessSettings(workspace_root=workspace, conversation_idle_timeout=0),
        runtime=ScriptedRuntime(["hi"]),
        specs=[spec_of(ContractEcho)],
    )
    host.resources = backends.resources
    await host.start()
    assert events == ["open pool", "open listener"]
    assert host.endpoints, "primitives attached after the resources opened"
    await host.stop()
    assert events == ["open pool", "open listener", "close listener", "close pool"]


async def test_a_resource_that_fails_to_open_fails_start_and_closes_the_opened_ones(
    workspace: Path,
) -> None:
    events: list[str] = []
    host = HarnessHost(
        HarnessSettings(workspace_root=workspace, conversation_idle_timeout=0),
        runtime=ScriptedRuntime(["hi"]),
        specs=[spec_of(ContractEcho)],
        resources=[
            RecordingResource("pool", events),
            RecordingResource("redis", events, fail_open=True),
        ],
    )
    with pytest.raises(ConnectionError, match="redis is unreachable"):
        await host.start()
    assert events == ["open pool", "close pool"]
    assert not host.endpoints, "nothing attached on a failed start"


def test_the_architecture_contract_holds() -> None:
    """`lint-imports` (the layers in pyproject.toml) passes on this tree, and every ignored
    import in the contracts is one the tree makes (`unmatched_ignore_imports_alerting`; the
    cache would skip that check)."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


def test_the_architecture_contract_catches_a_primitive_importing_the_kernel(
    tmp_path: Path,
) -> None:
    """The contract is not vacuous: a copy of the package whose planning primitive imports the
    kernel host (as every primitive did before the redesign) is rejected."""
    import shutil

    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "atmosphere_harness", copy / "atmosphere_harness")
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    attach = copy / "atmosphere_harness" / "_planning" / "attach.py"
    attach.write_text(
        attach.read_text(encoding="utf-8") + "\nfrom .._kernel.host import HarnessHost  # noqa\n",
        encoding="utf-8",
    )
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=copy,
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode != 0, result.stdout[-3000:]
    assert "atmosphere_harness._planning.attach -> atmosphere_harness._kernel.host" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "chain"),
    [
        (
            "_settings.py",
            "from ._tools.bounds import MAX_NAME_CHARS  # noqa",
            "atmosphere_harness._settings -> atmosphere_harness._tools.bounds",
        ),
        (
            "_preset.py",
            "from ._contracts import Host  # noqa",
            "atmosphere_harness._preset -> atmosphere_harness._contracts",
        ),
        (
            "_runtimes/anthropic.py",
            "from .._filesystem.base import FileInfo  # noqa",
            "atmosphere_harness._runtimes.anthropic -> atmosphere_harness._filesystem.base",
        ),
    ],
)
def test_the_architecture_contract_catches_a_foundation_importing_a_layer_above(
    tmp_path: Path, module: str, line: str, chain: str
) -> None:
    """Foundations import only each other (docs/architecture.md): a copy of the package where
    one imports the tools, the contracts or a primitive outside the declared exceptions is
    rejected."""
    import shutil

    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "atmosphere_harness", copy / "atmosphere_harness")
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    source = copy / "atmosphere_harness" / module
    source.write_text(source.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=copy,
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode != 0, result.stdout[-3000:]
    assert chain in " ".join(result.stdout.split()), result.stdout[-3000:]


async def test_the_backends_workspace_usage_accounts_the_filesystem(workspace: Path) -> None:
    from atmosphere_harness._filesystem.paths import store_key
    from atmosphere_harness._filesystem.primitive import SURFACE
    from atmosphere_harness._filesystem.usage import (
        PROCESS_USAGE,
        InProcessWorkspaceUsage,
        StoreUsage,
    )

    usage = InProcessWorkspaceUsage()
    backends = StateBackends(state="test", events="test", workspace_usage=usage)
    host = HarnessHost(
        HarnessSettings(workspace_root=workspace, conversation_idle_timeout=0),
        runtime=ScriptedRuntime(["hi"]),
        specs=[spec_of(ContractEcho)],
        primitives=default_primitives(backends),
    )
    await host.start()
    try:
        provider = host.surface(SURFACE, "contract-echo")
        assert provider is not None
        assert provider.usage is usage
        files = provider.for_conversation("c1")
        await files.write("a.txt", "hello")
        key = store_key(files.root)
        assert usage.is_live(key), "the store's ledger is the backend's"
        assert not PROCESS_USAGE.is_live(key), "not the process-wide default"
        assert usage.ledger(key).current() == StoreUsage(1, 5)
    finally:
        await host.stop()
