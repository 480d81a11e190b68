"""`FilesystemPrimitive`: the attach engine of `Harness.FILESYSTEM`.

For every endpoint whose resolved features include FILESYSTEM it:

1. binds the owner's `AgentFileSystemProvider` (rooted at `{owner root}/files/`) into the
   endpoint's injectables, conversation-scoped, and registers it as the owner's `filesystem`
   surface (the exact instance the admin API reads);
2. picks one file surface by the `filesystem` mode, never both:

   | mode | runtime declares VIRTUAL_FILESYSTEM | otherwise |
   |---|---|---|
   | `auto` | its native tools, `ACTIVE(native:<runtime>)` | the eight tools |
   | `builtin` | the eight tools | the eight tools |
   | `native` | its native tools | nothing, `INACTIVE(native-unavailable)` (WARN) |

   The eight tools report `ACTIVE(builtin)`, `ACTIVE(builtin,partial)` when user tools claim
   some names (the user's tool wins), or `ACTIVE(user-tool)` when they claim all eight;
3. adds the tool-output offload hook when the model has a way to read an offloaded file back:
   `read_file` among the eight tools, or Claude's memory tool (`view`), which the preview names;
4. provides `UserFiles` for runs with a user: the per-owner, per-user durable store
   (`{owner root}/memories/{user}/`) that Claude's memory tool serves as `/memories`, with the
   conversation's `tool-output/` routed in so offloaded results stay readable there.

Composite routes (`filesystem_routes`) are validated when the host starts, so a malformed or
duplicate prefix stops the app at start-up rather than at the first tool call. Route backends
are app-wide: every owner and conversation sees the same `{dir}/files/shared/` store, or, for a
route written `prefix=postgres:`, the same store of the backend of that name (`route_stores`,
from the state backends), shared by every replica too.

With `workspaces` (a state backend's `WorkspaceStores`, `ATMOSPHERE_AI_WORKSPACE_BACKEND=postgres`)
every conversation workspace and memory store is the backend's instead of a directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .._contracts import Endpoint, Host, Key, Primitive, Run
from .._errors import FileSystemError
from .._harness import Harness
from .._log import get_logger
from .._preset import FILESYSTEM
from .._runtimes.base import AiCapability, NativeSurfaceRuntime
from .._settings import SurfaceMode
from .._tools.base import Tool, as_tool
from . import spares, workers
from .base import AgentFileSystem, UserFiles
from .composite import CompositeAgentFileSystem, normalize_routes
from .offload import MEMORY_VIEW, OUTPUT_DIR, READ_FILE, Reader, ToolOutputOffload
from .provider import AgentFileSystemProvider
from .stores import WorkspaceStores
from .tools import file_tools
from .usage import WorkspaceUsage
from .workspace import WorkspaceAgentFileSystem

log = get_logger(__name__)

BUILTIN = "ACTIVE(builtin)"
BUILTIN_PARTIAL = "ACTIVE(builtin,partial)"
USER_TOOL = "ACTIVE(user-tool)"
NATIVE_UNAVAILABLE = "INACTIVE(native-unavailable)"
SHARED_CONVERSATION = "shared"
SURFACE: Key[AgentFileSystemProvider] = Key("filesystem")
"""The owner's file provider, for the admin API (`host.surface`) and `endpoint.services`."""


def native_state(runtime_name: str) -> str:
    return f"ACTIVE(native:{runtime_name})"


class FilesystemPrimitive(Primitive):
    name = "filesystem"

    def __init__(
        self,
        *,
        usage: WorkspaceUsage | None = None,
        workspaces: WorkspaceStores | None = None,
        route_stores: Mapping[str, WorkspaceStores] | None = None,
    ) -> None:
        """`usage` accounts every store's files and bytes (from `backends`; default: this
        process's tally). `workspaces` holds the conversation workspaces instead of directories;
        `route_stores` are the backends a route may name (`memories/=postgres:`)."""
        self.usage = usage
        self.workspaces = workspaces
        self.route_stores: dict[str, WorkspaceStores] = dict(route_stores or {})
        self.routes: dict[str, AgentFileSystem] = {}
        self.providers: dict[Path, AgentFileSystemProvider] = {}

    @property
    def backend(self) -> str:
        """Where conversation workspaces live: `files` or the stores' name (`postgres`)."""
        return "files" if self.workspaces is None else self.workspaces.name

    async def start(self, host: Host) -> None:
        settings = host.settings.groups.filesystem
        try:
            prefixes = normalize_routes(dict(settings.routes))
        except FileSystemError as exc:
            raise ValueError(f"ATMOSPHERE_AI_FILESYSTEM_ROUTES: {exc}") from None
        self.routes = {}
        shown: dict[str, str] = {}
        for key, target in prefixes.items():
            scheme = _route_scheme(target)
            if scheme is not None:
                stores = self.route_stores.get(scheme)
                if stores is None:
                    raise ValueError(
                        f"ATMOSPHERE_AI_FILESYSTEM_ROUTES: the route {key}/={target} needs the "
                        f"{scheme} backend: set ATMOSPHERE_{scheme.upper()}_URL"
                    )
                self.routes[key] = stores.route(key, settings.limits)
                shown[key] = f"{scheme}:"
                continue
            local = WorkspaceAgentFileSystem.for_conversation(
                target,
                SHARED_CONVERSATION,
                settings.limits,
                fsync=settings.fsync,
                usage=self.usage,
            )
            self.routes[key] = local
            shown[key] = str(local.root)
        if self.routes:
            log.info("filesystem routes", routes=shown)

    async def stop(self, host: Host) -> None:
        """Leave every conversation's folder holding only the user's files: the spare files
        made ahead for writes, and their folders, are removed."""
        await workers.run(spares.SPARES.release)

    def attach(self, endpoint: Endpoint, host: Host) -> None:
        if not endpoint.has(Harness.FILESYSTEM):
            return
        settings = host.settings.groups.filesystem
        provider = self.providers.get(endpoint.root)
        if provider is None:
            provider = AgentFileSystemProvider(
                endpoint.root,
                settings.limits,
                routes=self.routes,
                fsync=settings.fsync,
                usage=self.usage,
                stores=self.workspaces,
            )
            self.providers[endpoint.root] = provider
            host.user_forget_hooks.append(provider.forget_user)

        def scoped(run: Run) -> AgentFileSystem | None:
            try:
                return provider.for_conversation(run.conversation_id)
            except FileSystemError as exc:
                log.warning("no filesystem for this conversation", error=str(exc))
                return None

        def user_files(run: Run) -> UserFiles | None:
            if not run.user_id:
                return None
            try:
                memories = provider.memories(run.user_id)
                conversation = provider.for_conversation(run.conversation_id)
            except FileSystemError as exc:
                log.warning("no memory files for this user", error=str(exc))
                return None
            routed = CompositeAgentFileSystem(memories, {OUTPUT_DIR: conversation})
            return UserFiles(routed, run.user_id)

        async def forget(conversation_id: str, user_id: str | None) -> None:
            await provider.forget(conversation_id)

        endpoint.forget_hooks.append(forget)
        endpoint.provide(AgentFileSystem, scoped)
        endpoint.provide(UserFiles, user_files)
        endpoint.services.set(SURFACE, provider)
        host.register_surface(SURFACE, endpoint.owner, provider)

        runtime = endpoint.runtime
        mode = settings.mode
        native = _native_tools(endpoint) if mode is not SurfaceMode.BUILTIN else []
        reader: Reader | None = None
        if native:
            registered = [tool for tool in native if endpoint.add_builtin_tool(tool)]
            state = native_state(runtime.name) if registered else USER_TOOL
            if any(tool.name == MEMORY_VIEW.tool for tool in registered):
                reader = MEMORY_VIEW  # another native surface: no known way to read back
        elif mode is SurfaceMode.NATIVE:
            log.warning(
                "filesystem=native but the runtime has no native file surface; "
                "no file tools are attached",
                endpoint=endpoint.path,
                runtime=runtime.name,
            )
            endpoint.report(FILESYSTEM, NATIVE_UNAVAILABLE)
            return
        else:
            tools = file_tools(
                read_budget=settings.offload_threshold,
                max_grep_hits=settings.limits.max_grep_hits,
            )
            registered = [tool for tool in tools if endpoint.add_builtin_tool(tool)]
            if len(registered) == len(tools):
                state = BUILTIN
            elif registered:
                state = BUILTIN_PARTIAL
            else:
                state = USER_TOOL
            if any(tool.name == READ_FILE.tool for tool in registered):
                reader = READ_FILE
        if reader is not None and settings.offload_threshold > 0:
            endpoint.result_hooks.append(ToolOutputOffload(settings.offload_threshold, reader))
        endpoint.report(FILESYSTEM, state)


def _route_scheme(target: str) -> str | None:
    """`postgres` for a route target written `postgres:` (a backend's shared store), else
    `None` (a directory). A Windows drive letter (`C:`) is one character, never a scheme."""
    name, colon, rest = target.strip().partition(":")
    if colon and not rest and len(name) > 1 and name.isidentifier():
        return name.lower()
    return None


def _native_tools(endpoint: Endpoint) -> list[Tool]:
    """The runtime's native file tools, if it declares and implements a native file surface."""
    runtime = endpoint.runtime
    if AiCapability.VIRTUAL_FILESYSTEM not in runtime.capabilities:
        return []
    if not isinstance(runtime, NativeSurfaceRuntime):
        log.warning(
            "the runtime declares VIRTUAL_FILESYSTEM but has no native_tools(); "
            "using the built-in file tools",
            runtime=runtime.name,
        )
        return []
    return [as_tool(entry) for entry in runtime.native_tools(AiCapability.VIRTUAL_FILESYSTEM)]
