"""`Depends()` providers for the host's own routes.

Override any of them in tests or to plug in your auth:
`app.dependency_overrides[get_user_id] = current_user_id`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Depends, HTTPException
from starlette.requests import HTTPConnection

from ..ids import CONVERSATION_ID_PATTERN
from ..kernel.endpoint import HostedEndpoint
from ..kernel.host import HarnessHost

STATE_KEY = "atmosphere_harness"

CONVERSATION_ID_SCHEMA: dict[str, Any] = {"pattern": CONVERSATION_ID_PATTERN}
"""The shape of a conversation id, for the OpenAPI document only (`json_schema_extra`).

Routes keep checking ids themselves, with their own status and message (400 for a path, 422
for a query or body); documenting the shape lets clients and API fuzzers send valid ones.
"""


def get_harness(connection: HTTPConnection) -> HarnessHost:
    """The running harness (set up by the router's lifespan)."""
    host = getattr(connection.state, STATE_KEY, None)
    if not isinstance(host, HarnessHost):
        raise RuntimeError(
            "the atmosphere_harness lifespan has not run: include harness_router in the app and "
            "serve it with a server, TestClient as a context manager, or LifespanManager"
        )
    return host


HarnessDep = Annotated[HarnessHost, Depends(get_harness)]


def not_hosted(path: str) -> str:
    """Why a route declared for `path` has nothing to run: the running host lacks the endpoint."""
    return (
        f"{path} is not hosted by the app's running harness (an app serves the agents of one "
        "harness router: is another one included?)"
    )


def hosted_endpoint(host: HarnessHost, path: str) -> HostedEndpoint:
    """The running endpoint that the routes declared for `path` serve (HTTP routes).

    Per-endpoint routes are declared when the router is built, from the agents' specs; they find
    their endpoint in the running host at request time, by path, so they work under any
    `include_router` prefix. A host without it (it should not happen) answers a clear 500.
    """
    endpoint = host.endpoint(path)
    if endpoint is None:
        raise HTTPException(500, not_hosted(path))
    return endpoint


async def get_user_id(connection: HTTPConnection) -> str | None:
    """Who is asking. The default is anonymous (`None`): no long-term memory is kept.

    Override it with your authentication (`app.dependency_overrides[get_user_id] = ...`).
    """
    return None


UserIdDep = Annotated[str | None, Depends(get_user_id)]

USER_ID_HEADER = "X-User-Id"
_USER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}$")


async def user_id_from_header(connection: HTTPConnection) -> str | None:
    """Trust the `X-User-Id` header as the user: for demos and trusted gateways only.

    Anyone who can reach the app can claim any id with it, so install it only behind a proxy
    that sets the header itself: `app.dependency_overrides[get_user_id] = user_id_from_header`.
    No header means anonymous; a malformed one is rejected (400).
    """
    value = connection.headers.get(USER_ID_HEADER)
    if value is None or not value.strip():
        return None
    if not _USER_ID.match(value):
        raise HTTPException(
            400, f"{USER_ID_HEADER} must be 1-128 letters, digits or . _ @ : + - characters"
        )
    return value
