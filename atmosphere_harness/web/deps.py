"""`Depends()` providers for the host's own routes.

Override any of them in tests or to plug in your auth:
`app.dependency_overrides[get_user_id] = current_user_id`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from ..host import HarnessHost

STATE_KEY = "atmosphere_harness"


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


async def get_user_id(connection: HTTPConnection) -> str | None:
    """Who is asking. The default is anonymous (`None`): no long-term memory is kept.

    Override it with your authentication (`app.dependency_overrides[get_user_id] = ...`).
    """
    return None


UserIdDep = Annotated[str | None, Depends(get_user_id)]
