"""`GET /atmosphere/console/`: the web console, a static page shipped inside the package.

Three files (`index.html`, `console.js`, `console.css`), no build step and nothing fetched from
elsewhere, so the console works offline. They are served by ordinary routes rather than a
`StaticFiles` mount (a mount inside an included router loses the router's prefix), read once
when the router is built. The page talks only to this app: `/api/console/info`, the admin API
(token from the URL fragment `#token=...`, kept in `sessionStorage`) and each endpoint's routes:
the prompt (`POST P`, streamed), run cancel, approvals, the conversation list, history, close
and delete. A strict Content-Security-Policy allows nothing else.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, HTTPException
from fastapi.responses import RedirectResponse, Response

from ..errors import HarnessRoute

CONSOLE_PATH = "/atmosphere/console"

ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self' ws: wss:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def console_router() -> APIRouter:
    """The console's routes; mounted by `create_harness_router`."""
    package = files(__name__)
    contents = {name: package.joinpath(name).read_bytes() for name in ASSETS}
    router = APIRouter(tags=["console"], include_in_schema=False, route_class=HarnessRoute)

    def asset(name: str) -> Response:
        return Response(contents[name], media_type=ASSETS[name], headers=SECURITY_HEADERS)

    @router.get(CONSOLE_PATH)
    async def console_redirect() -> RedirectResponse:
        # Relative, so the redirect also works behind a proxy that serves the app under a prefix.
        return RedirectResponse("console/", status_code=308)

    @router.get(CONSOLE_PATH + "/")
    async def console_page() -> Response:
        return asset("index.html")

    @router.get(CONSOLE_PATH + "/{name}")
    async def console_asset(name: str) -> Response:
        if name not in contents:
            raise HTTPException(404, f"no console asset {name!r}")
        return asset(name)

    return router
