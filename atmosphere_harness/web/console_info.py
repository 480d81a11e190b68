"""`GET /api/console/info`: what each primitive really attached, app-wide and per endpoint."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from .._version import __version__
from ..harness import Harness
from ..kernel.host import HarnessHost
from .deps import HarnessDep, identity_source
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
        }
        for endpoint in host.endpoints.values()
    ]
    info["backends"] = dict(host.backends)
    info["runtime"] = {
        "name": host.runtime.name,
        "capabilities": sorted(capability.value for capability in host.runtime.capabilities),
    }
    return info


def console_info_router() -> APIRouter:
    router = APIRouter(tags=["console"], route_class=HarnessRoute)

    @router.get("/api/console/info", summary="Runtime truth of the harness")
    async def get_console_info(request: Request, host: HarnessDep) -> dict[str, Any]:
        # The app's `get_user_id` override is read where requests read it: on the app serving
        # this one (an override installed after start-up shows too).
        overrides = getattr(request.app, "dependency_overrides", {})
        host.truth.set_identity(identity_source(overrides, host.settings))
        return console_info(host)

    return router
