"""`create_harness_router`: the one router a host includes.

Building the router does no work; every route is declared when the app includes it, so
`app.include_router(router, prefix="/v1")` serves the agents under the prefix and
`app.openapi()` lists them before the app starts. The
per-endpoint routes come from the agents' declarations (`routes.ROUTE_BUILDERS`); their handlers
find the running host in the lifespan state (`get_harness`) and their endpoint by path.

The router carries its own lifespan, merged into the app's by `include_router`: settings are
resolved, stores opened and the declared agents hosted when the app starts, and everything is
closed when it stops. The lifespan state holds the running `HarnessHost` under one namespaced
key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute

from .._assembly import build_host
from .._contracts import Primitive
from .._governance.approval import ToolApprovalPolicy
from .._kernel.host import HarnessHost
from .._log import ensure_handler, get_logger
from .._preset import IDENTITY_NONE, LONG_TERM_MEMORY, is_active
from .._registry import DEFAULT_REGISTRY, AgentRegistry, AgentSpec, EndpointKind, spec_of
from .._runtimes.base import AgentRuntime
from .._runtimes.resolve import resolve_runtime
from .._settings import HarnessSettings
from .admin import admin_router, warn_admin_posture
from .console import console_router
from .console_info import console_info_router
from .deps import STATE_KEY, USER_ID_KEY, UserIdSource, identity_source
from .errors import HarnessRoute
from .route_spec import RouteSpec
from .routes import ROUTE_BUILDERS

log = get_logger(__name__)


class HarnessRouter(APIRouter):
    """The router `create_harness_router` returns: every agent's routes, then the app-wide ones.

    Building it does no work: its routes are declared the first time they are read, which is
    when the app includes it (`app.include_router` reads `router.routes`). Declared from a list
    (`agents=[...]`), they are those classes and their fleets. Declared from a registry
    (`harness_router`, `create_harness_router()`, `agents=registry`), they are the classes it
    holds at that moment: `harness_router` exists before the classes below its import are
    decorated, so reading the registry any earlier would miss them. A class decorated into the
    registry after that has no routes, so the app refuses to start and names it
    (`hosted_specs`).

    Agent routes come first in the router, before the console and admin routes; where they
    stand among the app's own routes is decided by the order of the app's `include_router`
    calls, so include the harness router before a catch-all route or mount.
    """

    def __init__(
        self,
        *,
        agents: Sequence[AgentSpec] | AgentRegistry,
        lifespan: Callable[[FastAPI], AbstractAsyncContextManager[Any]],
    ) -> None:
        self._source = agents
        self._specs: list[AgentSpec] | None = None
        super().__init__(lifespan=lifespan)

    @property
    def routes(self) -> list[BaseRoute]:
        if self._specs is None:
            self._declare()
        return self._routes

    @routes.setter
    def routes(self, routes: list[BaseRoute]) -> None:
        self._routes = routes

    @property
    def specs(self) -> list[AgentSpec]:
        """Every agent this router declared routes for (or hosts, when headless)."""
        if self._specs is None:
            self._declare()
        assert self._specs is not None
        return list(self._specs)

    def hosted_specs(self) -> list[AgentSpec]:
        """The specs the lifespan hosts: exactly those the routes were declared for.

        Raises `RuntimeError` naming every class decorated into the router's registry after it
        declared its routes: it has no route, and hosting it anyway would make the host and its
        routes disagree, so the app does not start.
        """
        specs = self.specs
        if isinstance(self._source, AgentRegistry):
            declared = {spec.cls for spec in specs}
            late = [spec for spec in self._source.specs() if spec.cls not in declared]
            if late:
                names = ", ".join(f"{spec.cls.__name__} ({spec.path})" for spec in late)
                raise RuntimeError(
                    f"{names}: decorated after the harness router declared its routes (when "
                    "the app included it), so it has no routes. Declare the agent classes "
                    "before app.include_router(...), or pass them to "
                    "create_harness_router(agents=[...])"
                )
        return specs

    def check_served(self, host: HarnessHost) -> None:
        """Every endpoint the host runs must have the routes this router declared for it."""
        declared = {spec.path for spec in self.specs if not spec.headless}
        missing = [path for path in host.endpoints if path not in declared]
        if missing:
            raise RuntimeError(
                f"the harness hosts {', '.join(missing)} but its router declared no routes for it"
            )

    def _declare(self) -> None:
        """Declare every agent's routes, then the app-wide ones (console info, admin, console)."""
        source = self._source
        self._specs = with_fleets(
            source.specs() if isinstance(source, AgentRegistry) else list(source)
        )
        paths: set[str] = set()
        for spec in self._specs:
            if spec.headless or spec.path in paths:
                continue  # no prompt loop; a duplicate path fails at start-up, with both names
            paths.add(spec.path)
            for build in ROUTE_BUILDERS:
                for route in build(spec):
                    self._add(route)
        self.include_router(console_info_router())
        self.include_router(admin_router())
        self.include_router(console_router())

    def _add(self, route: RouteSpec) -> None:
        """The one place a per-endpoint route is created (and its route class chosen)."""
        if route.websocket:
            self.add_api_websocket_route(route.path, route.endpoint, **route.options)
        else:
            self.add_api_route(
                route.path,
                route.endpoint,
                methods=list(route.methods),
                route_class_override=HarnessRoute,
                **route.options,
            )


def with_fleets(specs: Sequence[AgentSpec]) -> list[AgentSpec]:
    """`specs` and the fleet classes of their coordinators, nested fleets included.

    A class named in a `fleet=[...]` is hosted even when the router was not given it (see
    `delegation.fleet`), so it is declared here, in the order the host's fleet resolution adds
    it. An entry the host rejects at start-up (not decorated, an `ai_endpoint`, a name or path
    already taken) is left out, for the host to report.
    """
    out = list(specs)
    names = {spec.name for spec in out if spec.kind is not EndpointKind.AI_ENDPOINT}
    pending = [spec for spec in out if spec.kind is EndpointKind.COORDINATOR]
    while pending:
        for entry in pending.pop().fleet:
            if not isinstance(entry, type):
                continue
            try:
                spec = spec_of(entry)
            except TypeError:
                continue
            if spec.kind is EndpointKind.AI_ENDPOINT or spec.name in names:
                continue
            if not spec.headless and any(other.path == spec.path for other in out):
                continue
            out.append(spec)
            names.add(spec.name)
            if spec.kind is EndpointKind.COORDINATOR:
                pending.append(spec)
    return out


def note_identity(host: HarnessHost, identity: str) -> None:
    """Record where the user comes from in the truth, and say so when nobody is ever known."""
    host.truth.set_identity(identity)
    if identity != IDENTITY_NONE:
        return
    remembering = [
        path
        for path in host.endpoints
        if is_active(host.truth.endpoint(path).get(LONG_TERM_MEMORY, ""))
    ]
    if remembering:
        log.info(
            "long-term memory is attached but every request is anonymous, so it keeps no "
            "facts: set ATMOSPHERE_USER_ID_HEADER behind an auth proxy, or give "
            "create_harness_router a user_id function",
            endpoints=remembering,
        )


def create_harness_router(
    settings: HarnessSettings | None = None,
    *,
    agents: Sequence[type] | AgentRegistry | None = None,
    runtime: AgentRuntime | None = None,
    long_term_memory: Any | None = None,
    policies: Sequence[Any] = (),
    approval_policy: ToolApprovalPolicy | None = None,
    primitives: Sequence[Primitive] | None = None,
    user_id: UserIdSource | None = None,
) -> HarnessRouter:
    """Build the harness router.

    Args:
        settings: Configuration; `None` reads `HarnessSettings()` from the environment when the
            app starts (never at import).
        agents: The decorated classes to host (and the classes their fleets name), or a
            registry (`AgentRegistry`) whose classes are read when the app includes the router;
            `None` is the registry of the package's decorators.
        runtime: The model runtime; `None` resolves one from the settings.
        long_term_memory: A long-term memory store to use instead of the default one.
        policies: Governance policies evaluated on every tool call, `task` spawn and fleet
            dispatch (before those of the `atmosphere_harness.policies` entry points).
        approval_policy: Which tool calls wait for a person (default
            `ToolApprovalPolicy.annotated()`; an agent class's `approval_policy` wins).
        primitives: Replace the built-in attach engines (advanced; tests use it).
        user_id: Who is asking, for an app with its own authentication: called with each
            request (or WebSocket) of the harness's routes, it returns the user's id or `None`
            (anonymous); plain or `async`. It wins over `user_id_header`. It does what
            `app.dependency_overrides[get_user_id] = user_id` does (an override still wins over
            it) without its price: while an app has any dependency override, FastAPI rebuilds
            every route's dependency graph on every request.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        ensure_handler()
        specs = router.hosted_specs()
        resolved = settings if settings is not None else HarnessSettings()
        host = build_host(
            resolved,
            runtime=runtime if runtime is not None else resolve_runtime(resolved),
            specs=specs,
            primitives=primitives,
            long_term_memory=long_term_memory,
            policies=policies,
            approval_policy=approval_policy,
        )
        await host.start()
        try:
            router.check_served(host)
            warn_admin_posture(resolved)
            custom = user_id is not None
            note_identity(host, identity_source(app.dependency_overrides, resolved, custom=custom))
            yield {STATE_KEY: host, **({USER_ID_KEY: user_id} if custom else {})}
        finally:
            await host.stop()

    if agents is None:
        agents = DEFAULT_REGISTRY
    source = agents if isinstance(agents, AgentRegistry) else [spec_of(cls) for cls in agents]
    router = HarnessRouter(agents=source, lifespan=lifespan)
    return router


harness_router = create_harness_router()
"""The default router: hosts every class the package's decorators declared, with settings from
the environment. Building it does no work; its routes are declared when the app includes it."""
