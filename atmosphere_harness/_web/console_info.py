"""`GET /api/console/info`: what each primitive really attached, app-wide and per endpoint."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from .._harness import Harness
from .._kernel.endpoint import HostedEndpoint
from .._kernel.host import HarnessHost
from .._mcp.tools import server_of
from .._skills.primitive import SKILLS_SERVICE
from .._version import __version__
from .deps import USER_ID_KEY, HarnessDep, identity_source
from .errors import HarnessRoute


def console_info(host: HarnessHost) -> dict[str, Any]:
    info: dict[str, Any] = {"version": __version__}
    if host.truth.resolved_any:
        info["harness"] = host.truth.app_wide()
    info["endpoints"] = [
        {
            "path": endpoint.path,
            "kind": endpoint.kind.value,
            "owner": endpoint.owner,
            "features": [feature.value for feature in Harness.ordered(endpoint.features)],
            "harness": host.truth.endpoint(endpoint.path),
            "tools": sorted(endpoint.tools),
            "skills": _skills(endpoint),
            "toolServers": _tool_servers(endpoint),
        }
        for endpoint in host.endpoints.values()
    ]
    info["backends"] = dict(host.backends)
    info["runtime"] = {
        "name": host.runtime.name,
        "capabilities": sorted(capability.value for capability in host.runtime.capabilities),
    }
    return info


def _skills(endpoint: HostedEndpoint) -> list[dict[str, object]]:
    """The endpoint's skills (name, description, path in the workspace), by name."""
    found = endpoint.services.get(SKILLS_SERVICE)
    return found.describe() if found is not None else []


def _tool_servers(endpoint: HostedEndpoint) -> dict[str, str]:
    """Which MCP server each MCP tool came from (the console labels its tool cards)."""
    found = {name: server_of(tool) for name, tool in endpoint.tools.items()}
    return {name: server for name, server in sorted(found.items()) if server is not None}


def console_info_router() -> APIRouter:
    router = APIRouter(tags=["console"], route_class=HarnessRoute)

    @router.get("/api/console/info", summary="Runtime truth of the harness")
    async def get_console_info(request: Request, host: HarnessDep) -> dict[str, Any]:
        # The app's `get_user_id` override is read where requests read it: on the app serving
        # this one (an override installed after start-up shows too).
        overrides = getattr(request.app, "dependency_overrides", {})
        custom = getattr(request.state, USER_ID_KEY, None) is not None
        host.truth.set_identity(identity_source(overrides, host.settings, custom=custom))
        return console_info(host)

    return router
