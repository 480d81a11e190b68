"""`Depends()` providers for the host's own routes.

Override any of them in tests or to plug in your auth:
`app.dependency_overrides[get_user_id] = current_user_id`. For the user in production,
`create_harness_router(user_id=current_user_id)` does the same without an override: while an
app has any `dependency_overrides`, FastAPI rebuilds every route's dependency graph on every
request (fastapi/fastapi#16342).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, WebSocketException
from fastapi.dependencies.models import Dependant
from starlette.requests import HTTPConnection

from .._ids import CONVERSATION_ID_PATTERN
from .._kernel.endpoint import HostedEndpoint
from .._kernel.host import HarnessHost
from .._preset import IDENTITY_CUSTOM, identity_of
from .._settings import HarnessSettings

STATE_KEY = "atmosphere_harness"
USER_ID_KEY = "atmosphere_harness_user_id"
"""Where the lifespan state holds `create_harness_router(user_id=...)`, when given."""

UserIdSource = Callable[[HTTPConnection], str | Awaitable[str | None] | None]
"""Who is asking, from the request (`create_harness_router(user_id=...)`): a user id, or `None`
for anonymous; a plain or an `async` function."""

CONVERSATION_ID_SCHEMA: dict[str, Any] = {"pattern": CONVERSATION_ID_PATTERN}
"""The shape of a conversation id, for the OpenAPI document only (`json_schema_extra`).

Routes keep checking ids themselves, with their own status and message (400 for a path or query
parameter, 422 for a body field); documenting the shape lets clients and API fuzzers send valid
ones.
"""


ANSWERS_ATTRIBUTE = "__harness_answers__"
_F = TypeVar("_F", bound=Callable[..., Any])


def answers(responses: Mapping[int, str]) -> Callable[[_F], _F]:
    """Mark a dependency with the error statuses it may answer (`{status: description}`).

    Every `HarnessRoute` that depends on it, directly or through another dependency, lists them
    in the OpenAPI document, so a route states each answer a shared check can give without
    repeating it in its own `responses=`.
    """

    def mark(dependency: _F) -> _F:
        setattr(dependency, ANSWERS_ATTRIBUTE, dict(responses))
        return dependency

    return mark


def dependency_answers(dependant: Dependant) -> dict[int, str]:
    """The statuses (`answers`) declared by `dependant`'s dependencies, all levels down."""
    found: dict[int, str] = {}
    pending = list(dependant.dependencies)
    while pending:
        dependency = pending.pop()
        for status, description in getattr(dependency.call, ANSWERS_ATTRIBUTE, {}).items():
            found.setdefault(status, description)
        pending.extend(dependency.dependencies)
    return found


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


@answers({400: "A malformed or repeated user header (ATMOSPHERE_USER_ID_HEADER)"})
async def get_user_id(connection: HTTPConnection) -> str | None:
    """Who is asking. By default nobody (`None`): anonymous requests keep no long-term memory.

    With `user_id_header` set (`ATMOSPHERE_USER_ID_HEADER=X-Forwarded-User`), the user is that
    request header, as an auth proxy in front of the app sets it: absent means anonymous, a
    malformed or repeated one is refused (`user_id_in`). Or plug in your own authentication,
    which wins over the header: `create_harness_router(user_id=current_user_id)`, or
    `app.dependency_overrides[get_user_id] = current_user_id` (which wins over both).
    """
    custom: UserIdSource | None = getattr(connection.state, USER_ID_KEY, None)
    if custom is not None:
        found = custom(connection)
        return await found if inspect.isawaitable(found) else found
    host = getattr(connection.state, STATE_KEY, None)
    if not isinstance(host, HarnessHost):
        return None
    header = host.settings.groups.admin.user_id_header
    return user_id_in(connection, header) if header else None


UserIdDep = Annotated[str | None, Depends(get_user_id)]

USER_ID_HEADER = "X-User-Id"
_USER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}$")


def user_id_in(connection: HTTPConnection, header: str) -> str | None:
    """The user named by the request header `header`; `None` when it is absent or blank.

    A value must be 1-128 letters, digits or `._@:+-` (starting with a letter or digit), and the
    header must come once: a second copy means something between the client and the app added
    one instead of replacing it, so neither is trusted. A refused value answers 400
    `{"error": ...}` over HTTP; a refused WebSocket handshake is closed with code 1008 before it
    is accepted (the client sees HTTP 403).
    """
    values = connection.headers.getlist(header)
    if not values or (len(values) == 1 and not values[0].strip()):
        return None
    problem = None
    if len(values) > 1:
        problem = f"{header} must be sent once, got {len(values)} copies"
    elif not _USER_ID.match(values[0]):
        problem = f"{header} must be 1-128 letters, digits or . _ @ : + - characters"
    if problem is None:
        return values[0]
    if connection.scope["type"] == "websocket":
        raise WebSocketException(code=1008, reason=problem[:120])
    raise HTTPException(400, problem)


async def user_id_from_header(connection: HTTPConnection) -> str | None:
    """Trust the `X-User-Id` header as the user: for demos and trusted gateways only.

    Anyone who can reach the app can claim any id with it, so install it only behind a proxy
    that sets the header itself: `app.dependency_overrides[get_user_id] = user_id_from_header`.
    No header means anonymous; a malformed one is rejected (400). `ATMOSPHERE_USER_ID_HEADER`
    does the same for a header of your choice without an override.
    """
    return user_id_in(connection, USER_ID_HEADER)


def identity_source(
    overrides: Mapping[Any, Any], settings: HarnessSettings, *, custom: bool = False
) -> str:
    """Where `get_user_id` takes the user from, as runtime truth reports it (`identity`).

    `CUSTOM` when the app overrides `get_user_id` (`overrides` is the app's
    `dependency_overrides`: it wins over the header) or gave the router a `user_id` function
    (`custom`), `HEADER(<name>)` with `user_id_header` set, `NONE` otherwise: every request is
    anonymous and long-term memory keeps nothing.
    """
    if custom or get_user_id in overrides:
        return IDENTITY_CUSTOM
    return identity_of(settings)
