"""The attach engine: which file surface an endpoint gets, and the truth it reports."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import (
    AgentFileSystem,
    AiCapability,
    Harness,
    HarnessSettings,
    ScriptedRuntime,
    Tool,
    ToolContext,
    ToolKind,
    agent,
    ai_endpoint,
    tool,
)
from atmosphere_harness._filesystem import AgentFileSystemProvider
from atmosphere_harness._filesystem.offload import ToolOutputOffload
from atmosphere_harness._filesystem.primitive import SURFACE, FilesystemPrimitive
from atmosphere_harness._filesystem.tools import FILE_TOOL_NAMES, bound_file_system
from atmosphere_harness._kernel.endpoint import HostedEndpoint
from atmosphere_harness._kernel.host import HarnessHost
from atmosphere_harness._registry import spec_of
from atmosphere_harness._runtimes.base import AgentRuntime
from atmosphere_harness._settings import SurfaceMode
from tests.agents import echo


async def memory_handler(arguments: Mapping[str, Any], context: ToolContext) -> str:
    fs = bound_file_system(context.run)
    assert fs is not None
    if arguments["command"] == "create":
        await fs.write(arguments["path"], arguments["file_text"])
        return "File created"
    return await fs.read(arguments["path"])


MEMORY_TOOL = Tool(
    name="memory",
    description="Anthropic-style memory tool backed by the conversation filesystem",
    parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    handler=memory_handler,
    kind=ToolKind.EDIT,
    origin="fake-native",
    native={"type": "memory_20250818", "name": "memory"},
)


class NativeRuntime(ScriptedRuntime):
    """A runtime whose provider has its own file tool."""

    name = "fake-native"
    capabilities = ScriptedRuntime.capabilities | {AiCapability.VIRTUAL_FILESYSTEM}

    def __init__(self, *args: Any, tools: Sequence[Tool] = (MEMORY_TOOL,), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.native = list(tools)

    def native_tools(self, capability: AiCapability) -> Sequence[Tool]:
        assert capability is AiCapability.VIRTUAL_FILESYSTEM
        return self.native


class ClaimsButLacks(ScriptedRuntime):
    name = "claims"
    capabilities = ScriptedRuntime.capabilities | {AiCapability.VIRTUAL_FILESYSTEM}


FsAgent = echo(agent(name="fs-agent"), "FsAgent")


@tool(kind=ToolKind.READ)
async def read_file(path: str) -> str:
    """The user's own read_file."""
    return f"user read {path}"


PartialAgent = echo(agent(name="partial-agent"), "PartialAgent", tools=[read_file])


def _user_tool(name: str) -> Tool:
    async def handler(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return f"user {name}"

    return Tool(name=name, description=name, parameters={"type": "object"}, handler=handler)


AllUserAgent = echo(
    agent(name="all-user-agent"),
    "AllUserAgent",
    tools=[_user_tool(name) for name in FILE_TOOL_NAMES],
)


MemoryOnly = echo(agent(name="memory-only", harness=(Harness.MEMORY,)), "MemoryOnly")


FsEndpoint = echo(
    ai_endpoint("/atmosphere/fs-endpoint", harness=(Harness.FILESYSTEM,)), "FsEndpoint"
)


async def attach(
    cls: type, workspace: Path, runtime: AgentRuntime | None = None, **settings: Any
) -> tuple[HarnessHost, HostedEndpoint]:
    host = HarnessHost(
        HarnessSettings(workspace_root=workspace, **settings),
        runtime=runtime or ScriptedRuntime(),
        specs=[spec_of(cls)],
        primitives=[FilesystemPrimitive()],
    )
    await host.start()
    return host, host.endpoints[spec_of(cls).path]


def state(host: HarnessHost, endpoint: HostedEndpoint) -> str:
    return host.truth.endpoint(endpoint.path)["filesystem"]


def file_tools_of(endpoint: HostedEndpoint) -> set[str]:
    return {name for name, t in endpoint.tools.items() if t.origin == "filesystem"}


async def test_feature_off_attaches_nothing(workspace: Path) -> None:
    host, endpoint = await attach(MemoryOnly, workspace)
    assert endpoint.tools == {}
    assert state(host, endpoint) == "INACTIVE(disabled)"
    assert host.surface(SURFACE, "memory-only") is None
    assert endpoint.result_hooks == []


async def test_kill_switch_attaches_nothing(workspace: Path) -> None:
    host, endpoint = await attach(FsAgent, workspace, enabled=False)
    assert endpoint.tools == {}
    assert host.truth.app_wide()["filesystem"] == "INACTIVE(disabled)"


async def test_auto_on_a_plain_runtime_registers_the_eight_tools(workspace: Path) -> None:
    host, endpoint = await attach(FsAgent, workspace)
    assert list(endpoint.tools) == list(FILE_TOOL_NAMES)
    assert state(host, endpoint) == "ACTIVE(builtin)"
    assert host.truth.app_wide()["filesystem"] == "ACTIVE(builtin)"
    assert [type(hook) for hook in endpoint.result_hooks] == [ToolOutputOffload]


async def test_the_registered_surface_is_the_runs_provider(workspace: Path) -> None:
    host, endpoint = await attach(FsAgent, workspace)
    provider = host.surface(SURFACE, "fs-agent")
    assert isinstance(provider, AgentFileSystemProvider)
    assert provider.agent_root == workspace / "agents" / "fs-agent"
    assert endpoint.services.get(SURFACE) is provider
    scoped = endpoint.providers[AgentFileSystem]
    run = type("Run", (), {"conversation_id": "c9"})()
    assert scoped(run) is provider.for_conversation("c9")  # type: ignore[arg-type]
    bad = type("Run", (), {"conversation_id": "../x"})()
    assert scoped(bad) is None  # type: ignore[arg-type]


async def test_an_ai_endpoint_owner_is_its_sanitized_path(workspace: Path) -> None:
    host, _ = await attach(FsEndpoint, workspace)
    provider = host.surface(SURFACE, "atmosphere-fs-endpoint")
    assert provider.agent_root == workspace / "endpoints" / "atmosphere-fs-endpoint"


async def test_auto_on_a_native_runtime_uses_its_tools_instead(workspace: Path) -> None:
    host, endpoint = await attach(FsAgent, workspace, NativeRuntime())
    assert list(endpoint.tools) == ["memory"]
    assert state(host, endpoint) == "ACTIVE(native:fake-native)"
    assert [type(hook) for hook in endpoint.result_hooks] == [ToolOutputOffload]
    assert host.surface(SURFACE, "fs-agent") is not None


async def test_builtin_mode_beats_a_native_runtime(workspace: Path) -> None:
    host, endpoint = await attach(FsAgent, workspace, NativeRuntime(), filesystem="builtin")
    assert list(endpoint.tools) == list(FILE_TOOL_NAMES)
    assert state(host, endpoint) == "ACTIVE(builtin)"


async def test_native_mode_on_a_plain_runtime_attaches_no_surface(
    workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        host, endpoint = await attach(FsAgent, workspace, filesystem="native")
    assert endpoint.tools == {}
    assert endpoint.result_hooks == []
    assert state(host, endpoint) == "INACTIVE(native-unavailable)"
    assert "filesystem=native but the runtime has no native file surface" in caplog.text


async def test_native_mode_on_a_native_runtime_uses_its_tools(workspace: Path) -> None:
    host, endpoint = await attach(FsAgent, workspace, NativeRuntime(), filesystem="NATIVE")
    assert list(endpoint.tools) == ["memory"]
    assert state(host, endpoint) == "ACTIVE(native:fake-native)"


async def test_a_native_runtime_with_no_tools_falls_back_under_auto(workspace: Path) -> None:
    host, endpoint = await attach(FsAgent, workspace, NativeRuntime(tools=()))
    assert state(host, endpoint) == "ACTIVE(builtin)"
    host, endpoint = await attach(FsAgent, workspace, NativeRuntime(tools=()), filesystem="native")
    assert state(host, endpoint) == "INACTIVE(native-unavailable)"


async def test_a_declared_capability_without_native_tools_is_not_native(workspace: Path) -> None:
    host, endpoint = await attach(FsAgent, workspace, ClaimsButLacks())
    assert state(host, endpoint) == "ACTIVE(builtin)"


async def test_a_user_tool_collision_registers_the_rest(workspace: Path) -> None:
    host, endpoint = await attach(PartialAgent, workspace)
    assert state(host, endpoint) == "ACTIVE(builtin,partial)"
    assert file_tools_of(endpoint) == set(FILE_TOOL_NAMES) - {"read_file"}
    assert endpoint.tools["read_file"].origin == "user", "the user's tool wins"
    assert endpoint.result_hooks == [], "no offload when read_file cannot read it back"


async def test_all_eight_user_claimed_is_user_tool(workspace: Path) -> None:
    host, endpoint = await attach(AllUserAgent, workspace)
    assert state(host, endpoint) == "ACTIVE(user-tool)"
    assert file_tools_of(endpoint) == set()


async def test_offload_is_off_when_the_threshold_is_not_positive(workspace: Path) -> None:
    _, endpoint = await attach(FsAgent, workspace, tool_output_offload_threshold=0)
    assert endpoint.result_hooks == []


@pytest.mark.parametrize(
    ("environment", "mode"),
    [
        ({"LLM_FILESYSTEM": "BUILT-IN"}, SurfaceMode.BUILTIN),
        ({"LLM_FILESYSTEM": "Native"}, SurfaceMode.NATIVE),
        ({"LLM_FILESYSTEM": "garbage"}, SurfaceMode.AUTO),
        ({"ATMOSPHERE_AI_FILESYSTEM": "builtin", "LLM_FILESYSTEM": "native"}, SurfaceMode.BUILTIN),
        ({}, SurfaceMode.AUTO),
    ],
)
def test_mode_parsing_is_lenient_and_the_atmosphere_name_wins(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], mode: SurfaceMode
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert HarnessSettings().filesystem is mode
