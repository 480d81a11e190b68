"""How every error of a harness route reaches the client: one mapping, one body shape.

Every error body a harness route answers is JSON `{"error": "<message>"}`, sometimes with more
keys beside it (the admin API's 401 adds a `hint`), never FastAPI's `{"detail": ...}`:

| raised | status |
|---|---|
| `Problem(status, message, **extra)` (the routes' own HTTP errors) | its status |
| `HTTPException` (a dependency's, e.g. `user_id_from_header`) | its status |
| `RequestValidationError` (a malformed body, query or path parameter) | 422 |
| a body over `max_request_bytes` (`ATMOSPHERE_MAX_REQUEST_BYTES`) | 413 |
| `FileNotFoundInWorkspace` | 404 |
| `FileSystemError`, `PlanStoreError` (the caller's mistake) | 400 |
| `ToolArgumentError` | 422 |
| `RunConflict` (`multitask: reject` while a run is in flight) | 409 |
| `PlanBusFull` | 503 |
| `BackendUnavailable` (Redis or PostgreSQL is down right now) | 503 |
| `ModelError`, `DelegationError` (something upstream failed) | 502 |
| any other `HarnessError` | 500 |

A validation message names each failing field and says what is wrong with it; it never echoes
the value that was sent (a 10 MB message is not sent back), and every message is cut to a few
hundred characters and made encodable (a lone surrogate in the input cannot turn a 422 into a
500).

`HarnessRoute` applies all of this: the harness's routers are `APIRouter(route_class=
HarnessRoute)` and the per-endpoint routes are added with `route_class_override=HarnessRoute`.
An `APIRouter` cannot install app-level exception handlers, so the route catches what its own
handler raises. Errors the app raises before a route is found (404 for an unknown path, 405)
are the app's own and keep FastAPI's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from fastapi.dependencies.utils import get_flat_params
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from .._errors import (
    BackendUnavailable,
    DelegationError,
    FileNotFoundInWorkspace,
    FileSystemError,
    HarnessError,
    ModelError,
    PlanBusFull,
    PlanStoreError,
    RunConflict,
    ToolArgumentError,
)
from .._kernel.host import HarnessHost
from .._settings import DEFAULT_MAX_REQUEST_BYTES
from .deps import STATE_KEY, dependency_answers

MAX_MESSAGE_CHARS = 2000
"""An error message is cut here (with `…`)."""
MAX_ITEM_CHARS = 300
"""One validation problem (`where: what`) is cut here."""
MAX_ITEMS = 10
"""Validation problems listed in one message; the rest are counted."""

STATUS_OF: Sequence[tuple[type[HarnessError], int]] = (
    (FileNotFoundInWorkspace, 404),
    (FileSystemError, 400),
    (PlanStoreError, 400),
    (ToolArgumentError, 422),
    (RunConflict, 409),
    (PlanBusFull, 503),
    (BackendUnavailable, 503),
    (ModelError, 502),
    (DelegationError, 502),
)
"""The HTTP status of each `HarnessError` subclass; the first match wins, anything else is 500."""

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"error": {"type": "string"}},
    "required": ["error"],
}
"""The OpenAPI schema of every error body (more keys may appear beside `error`)."""


class Problem(HTTPException):
    """An HTTP error a route answers as `{"error": message, **extra}`.

    Raise it from a harness route or dependency: `raise Problem(404, "no such thing")`.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        **extra: str,
    ) -> None:
        super().__init__(status, message, dict(headers) if headers else None)
        self.message = message
        self.extra = extra


def readable(text: object, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` as a JSON body may carry it: encodable (a lone surrogate becomes `\\ud800`, as
    text) and at most `limit` characters."""
    value = str(text)
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(
    status: int,
    message: object,
    *,
    headers: Mapping[str, str] | None = None,
    **extra: object,
) -> JSONResponse:
    """The one error body: `{"error": message, **extra}`."""
    body = {"error": readable(message)}
    body.update({key: readable(value) for key, value in extra.items()})
    return JSONResponse(body, status_code=status, headers=dict(headers) if headers else None)


def status_of(error: HarnessError) -> int:
    for cls, status in STATUS_OF:
        if isinstance(error, cls):
            return status
    return 500


def harness_error_response(error: HarnessError) -> JSONResponse:
    return error_response(status_of(error), str(error) or type(error).__name__)


def http_error_response(error: HTTPException) -> JSONResponse:
    if isinstance(error, Problem):
        return error_response(
            error.status_code, error.message, headers=error.headers, **error.extra
        )
    return error_response(error.status_code, error.detail, headers=error.headers)


def validation_message(errors: Sequence[Any]) -> str:
    """`where: what` for each problem, never the value that was sent."""
    items: list[str] = []
    for error in errors[:MAX_ITEMS]:
        if not isinstance(error, Mapping):
            items.append(readable(error, MAX_ITEM_CHARS))
            continue
        where = ".".join(readable(part, 60) for part in error.get("loc", ()))
        what = str(error.get("msg", "invalid"))
        context = error.get("ctx")
        if error.get("type") == "json_invalid" and isinstance(context, Mapping):
            what = f"{what} ({context.get('error')})"
        items.append(readable(f"{where}: {what}" if where else what, MAX_ITEM_CHARS))
    if len(errors) > MAX_ITEMS:
        items.append(f"and {len(errors) - MAX_ITEMS} more")
    return "; ".join(items) or "the request is invalid"


def validation_error_response(error: RequestValidationError) -> JSONResponse:
    return error_response(422, validation_message(error.errors()))


def max_request_bytes(request: Request) -> int:
    """The running harness's `max_request_bytes` (the default before its lifespan ran)."""
    host = getattr(request.state, STATE_KEY, None)
    if isinstance(host, HarnessHost):
        return host.settings.groups.admin.max_request_bytes
    return DEFAULT_MAX_REQUEST_BYTES


def too_large(size: int | None, limit: int) -> Problem:
    shown = f"{size}" if size is not None else f"more than {limit}"
    return Problem(
        413, f"request body is {shown} bytes; the limit is {limit} (ATMOSPHERE_MAX_REQUEST_BYTES)"
    )


async def read_bounded_body(request: Request, limit: int) -> None:
    """Read the request body, at most `limit` bytes, before the route parses it.

    A declared `Content-Length` over the limit is refused before a byte is read; a body without
    one (chunked) is refused as soon as it passes the limit. The body read is kept on the request
    (`request.body()` returns it), so FastAPI parses it as usual.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise Problem(400, "Content-Length must be a number of bytes") from None
        if size > limit:
            raise too_large(size, limit)
    chunks: list[bytes] = []
    total = 0
    try:
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise too_large(None, limit)
            chunks.append(chunk)
    except ClientDisconnect:
        raise Problem(400, "the client went away before its request body arrived") from None
    request._body = b"".join(chunks)


class HarnessRoute(APIRoute):
    """The route class of every harness HTTP route: bounded bodies, `{"error"}` bodies.

    Before the handler runs, a `POST` (`PUT`, `PATCH`) body is read up to `max_request_bytes`
    (413 beyond). Whatever the handler or its dependencies raise as `RequestValidationError`,
    `HTTPException` (`Problem` included) or `HarnessError` is answered by this module's mapping.
    """

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        error = {"description": "Error", "content": {"application/json": {"schema": ERROR_SCHEMA}}}
        if get_flat_params(self.dependant) or self.body_field is not None:
            self.responses.setdefault(422, {**error, "description": "Validation Error"})
        if self.methods and self.methods & BODY_METHODS:
            self.responses.setdefault(413, {**error, "description": "Request body too large"})
        for status, description in sorted(dependency_answers(self.dependant).items()):
            self.responses.setdefault(status, {**error, "description": description})

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                if request.method in BODY_METHODS:
                    await read_bounded_body(request, max_request_bytes(request))
                return await handler(request)
            except RequestValidationError as exc:
                return validation_error_response(exc)
            except HTTPException as exc:
                return http_error_response(exc)
            except HarnessError as exc:
                return harness_error_response(exc)

        return handle
