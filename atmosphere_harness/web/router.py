"""`create_harness_router`: the one router a host includes.

It carries its own lifespan, merged into the app's by `include_router`: settings are resolved,
stores opened and endpoints attached when the app starts, and everything is closed when it stops.
The lifespan state holds the running `HarnessHost` under one namespaced key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute

from ..assembly import build_host
from ..contracts import Primitive
from ..governance.approval import ToolApprovalPolicy
from ..kernel.host import HarnessHost
from ..log import ensure_handler
from ..registry import registered_agents, spec_of
from ..runtimes.base import AgentRuntime
from ..runtimes.resolve import resolve_runtime
from ..settings import HarnessSettings
from .admin import admin_router, warn_admin_posture
from .console import console_router
from .console_info import console_info_router
from .deps import STATE_KEY
from .routes import ROUTE_BUILDERS, RouteSpec


def create_harness_router(
    settings: HarnessSettings | None = None,
    *,
    agents: Sequence[type] | None = None,
    runtime: AgentRuntime | None = None,
    long_term_memory: Any | None = None,
    policies: Sequence[Any] = (),
    approval_policy: ToolApprovalPolicy | None = None,
    primitives: Sequence[Primitive] | None = None,
) -> APIRouter:
    """Build the harness router.

    Args:
        settings: Configuration; `None` reads `HarnessSettings()` from the environment when the
            app starts (never at import).
        agents: The decorated classes to host; `None` hosts every decorated class.
        runtime: The model runtime; `None` resolves one from the settings.
        long_term_memory: A long-term memory store to use instead of the default one.
        policies: Governance policies evaluated on every tool call, `task` spawn and fleet
            dispatch (before those of the `atmosphere_harness.policies` entry points).
        approval_policy: Which tool calls wait for a person (default
            `ToolApprovalPolicy.annotated()`; an agent class's `approval_policy` wins).
        primitives: Replace the built-in attach engines (advanced; tests use it).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        ensure_handler()
        resolved = settings if settings is not None else HarnessSettings()
        specs = [spec_of(cls) for cls in agents] if agents is not None else registered_agents()
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
        warn_admin_posture(resolved)
        mounted: list[BaseRoute] = []
        try:
            mounted = _mount(app, host)
            yield {STATE_KEY: host}
        finally:
            gone = {id(route) for route in mounted}
            app.router.routes[:] = [r for r in app.router.routes if id(r) not in gone]
            app.openapi_schema = None
            await host.stop()

    router = APIRouter(lifespan=lifespan)
    router.include_router(console_info_router())
    router.include_router(admin_router())
    router.include_router(console_router())
    return router


def _mount(app: FastAPI, host: HarnessHost) -> list[BaseRoute]:
    """Add every endpoint's routes in front of the app's own (so a catch-all cannot shadow them)."""
    before = list(app.router.routes)
    known = {id(route) for route in before}
    for endpoint in host.endpoints.values():
        for build in ROUTE_BUILDERS:
            for spec in build(endpoint, host):
                _add(app, spec)
    added = [route for route in app.router.routes if id(route) not in known]
    app.router.routes[:] = added + before
    app.openapi_schema = None
    return added


def _add(app: FastAPI, spec: RouteSpec) -> None:
    if spec.websocket:
        app.router.add_api_websocket_route(spec.path, spec.endpoint, **spec.options)
    else:
        app.router.add_api_route(
            spec.path, spec.endpoint, methods=list(spec.methods), **spec.options
        )


harness_router = create_harness_router()
"""The default router: hosts every decorated class with settings from the environment."""
