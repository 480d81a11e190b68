"""The admin API under `/api/admin`: who has a workspace, what is in it, and forgetting a user.

Every route reads the exact instance an attach engine registered with
`host.register_surface` (the owner's `FilePlanStore`, its `AgentFileSystemProvider`), never a
twin rebuilt from settings, and no route ever creates a directory: a conversation that never
wrote a file answers 404 instead of an empty listing.

- `GET /api/admin/workspace/owners`: `[{"owner", "plan", "filesystem"}]`, sorted by owner.
- `GET /api/admin/agents/{name}/plan?conversationId=`: `{"agent", "conversationId",
  "sessionId", "goal"?, "steps"}`; 404 without a plan store or a stored plan.
- `GET /api/admin/agents/{name}/plan/events?conversationId=`: the same stream as
  `P/plan/events`.
- `GET /api/admin/agents/{name}/files?conversationId=&path=`: `{"agent", "conversationId",
  "sessionId", "path", "entries": [{"path", "size", "directory"}]}`; 404 without a filesystem or
  when the conversation never wrote a file; 400 when `path` is a file.
- `GET /api/admin/agents/{name}/files/content?conversationId=&path=`: `{"agent",
  "conversationId", "sessionId", "path", "content"}`; 404 for a missing file; 400 for a file too
  large or not UTF-8.
- `DELETE /api/admin/users/{userId}` (token always required): deletes every conversation the
  user owns, their long-term facts and `/memories` files (`kernel.forget.forget_user`);
  `{"userId", "conversationsDeleted"}`, or 409 naming the user's conversations with a run in
  flight (nothing deleted).

`sessionId` is the older name of `conversationId`: both are accepted (both given and different is
400), and bodies carry both keys. Traversal-shaped names, conversation ids and paths answer 400
before any I/O. Errors are JSON `{"error": message}` (`web.errors`).

Access: `get_admin_principal` names who is asking, from the `X-Atmosphere-Auth` header (or the
query parameter of that name, for `EventSource`) compared in constant time with
`ATMOSPHERE_ADMIN_TOKEN`. Workspace reads need a principal and are denied when no token is
configured (fail closed); `owners` is open unless `ATMOSPHERE_ADMIN_HTTP_READ_AUTH_REQUIRED=true`.
A host with its own authentication replaces the check:
`app.dependency_overrides[get_admin_principal] = my_admin_or_none`.
"""

from __future__ import annotations

import hmac
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query
from fastapi.responses import Response
from sse_starlette import EventSourceResponse
from starlette.requests import HTTPConnection

from .._filesystem.base import AgentFileSystem
from .._filesystem.paths import shown
from .._filesystem.primitive import SURFACE as FILE_SURFACE
from .._filesystem.provider import AgentFileSystemProvider
from .._ids import check_conversation_id
from .._kernel.host import HarnessHost
from .._log import get_logger
from .._planning.attach import SURFACE as PLAN_SURFACE
from .._planning.bus import PlanEventBus
from .._planning.store import PlanStore
from .._planning.tools import BUS_SERVICE
from .._settings import HarnessSettings
from .deps import CONVERSATION_ID_SCHEMA, HarnessDep, answers, get_harness
from .errors import HarnessRoute, Problem
from .planning import plan_event_response
from .route_spec import error_responses

log = get_logger(__name__)

AUTH_HEADER = "X-Atmosphere-Auth"
TOKEN_PRINCIPAL = "admin-token"
"""The principal `get_admin_principal` returns for a request carrying the admin token."""

UNAUTHORIZED = "Admin read operations require authentication"
HINT = f"Send the {AUTH_HEADER} header (or query parameter) with the ATMOSPHERE_ADMIN_TOKEN value"
HINT_NO_TOKEN = "No ATMOSPHERE_ADMIN_TOKEN is configured, so admin reads are denied"

READ_ANSWERS = error_responses(
    {
        400: "A blank or traversal-shaped agent name, conversation id or path",
        404: "No such agent surface, conversation, plan or file",
    }
)
"""The errors of an admin read of one conversation (401 comes with `get_admin_principal`)."""


@answers({401: "An admin read without a valid token (ATMOSPHERE_ADMIN_TOKEN)"})
async def get_admin_principal(connection: HTTPConnection) -> str | None:
    """Who is asking the admin API: `"admin-token"` for a valid token, `None` if anonymous.

    Override it to use your own authentication; return any non-`None` name to grant reads.
    """
    token = get_harness(connection).settings.groups.admin.token
    given = connection.headers.get(AUTH_HEADER) or connection.query_params.get(AUTH_HEADER)
    if not token or not given:
        return None
    if hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8")):
        return TOKEN_PRINCIPAL
    return None


AdminPrincipalDep = Annotated[str | None, Depends(get_admin_principal)]


def require_principal(principal: str | None, settings: HarnessSettings) -> None:
    if principal is None:
        hint = HINT if settings.groups.admin.token else HINT_NO_TOKEN
        raise Problem(401, UNAUTHORIZED, hint=hint)


def check_agent_name(name: str) -> str:
    if not name.strip():
        raise Problem(400, "agent name must not be blank")
    if ".." in name or "\\" in name or "/" in name or not all(" " <= c != "\x7f" for c in name):
        raise Problem(400, f"agent name contains illegal path characters: {shown(name)}")
    return name


def check_session_id(session_id: str | None, label: str = "conversationId") -> str:
    """The conversation id of an admin read; traversal-shaped ids are 400 before any I/O.
    `label` is the query parameter it came in (`conversationId`, or its alias `sessionId`)."""
    if session_id is None or not session_id.strip():
        raise Problem(400, f"{label} must not be blank")
    if ".." in session_id or "/" in session_id or "\\" in session_id:
        raise Problem(400, f"{label} contains illegal path characters: {shown(session_id)}")
    try:
        return check_conversation_id(session_id)
    except ValueError as exc:
        raise Problem(400, f"{label} is invalid: {exc}") from None


def conversation_param(conversation_id: str | None, session_id: str | None) -> str:
    """The conversation of an admin read from `conversationId` or its alias `sessionId`."""
    if conversation_id is None and session_id is not None:
        return check_session_id(session_id, "sessionId")
    if session_id is not None and session_id != conversation_id:
        raise Problem(
            400,
            "conversationId and sessionId name different conversations; "
            "send conversationId only (sessionId is its older name)",
        )
    return check_session_id(conversation_id)


def workspace_read(
    host: HarnessHost,
    principal: str | None,
    name: str,
    conversation_id: str | None,
    session_id: str | None = None,
) -> tuple[str, str]:
    """Gate and validate one workspace read: the checked owner name and conversation id."""
    require_principal(principal, host.settings)
    return check_agent_name(name), conversation_param(conversation_id, session_id)


def conversation_keys(conversation_id: str) -> dict[str, str]:
    """How a body names its conversation: `conversationId`, and `sessionId` for older clients."""
    return {"conversationId": conversation_id, "sessionId": conversation_id}


def plan_store_of(host: HarnessHost, name: str) -> PlanStore:
    store = host.surface(PLAN_SURFACE, name)
    if not isinstance(store, PlanStore):
        raise Problem(404, f"agent {name!r} has no plan store")
    return store


async def conversation_files(host: HarnessHost, name: str, session_id: str) -> AgentFileSystem:
    """The conversation's filesystem, only if it already holds files, on disk or in the
    workspace backend (probes create nothing)."""
    provider = host.surface(FILE_SURFACE, name)
    if not isinstance(provider, AgentFileSystemProvider):
        raise Problem(404, f"agent {name!r} has no filesystem")
    if not await provider.has_files(session_id):
        raise Problem(404, f"conversation {session_id!r} has no files")
    return provider.for_conversation(session_id)


ConversationQuery = Annotated[
    str | None,
    Query(
        alias="conversationId",
        description="The conversation id to read",
        json_schema_extra=CONVERSATION_ID_SCHEMA,
    ),
]
SessionQuery = Annotated[
    str | None,
    Query(
        alias="sessionId",
        description="The older name of conversationId (accepted; both given must agree)",
        deprecated=True,
        json_schema_extra=CONVERSATION_ID_SCHEMA,
    ),
]
_NAME_CHAR = r"[^/\\\x00-\x1f\x7f]"
AGENT_NAME_PATTERN = rf"^(?!.*\.\.){_NAME_CHAR}*[^\s\x85/\\\x00-\x1f\x7f]{_NAME_CHAR}*$"
"""What `check_agent_name` accepts, for the OpenAPI document only: no `..`, `/`, `\\` or control
character, and not blank."""
AgentName = Annotated[str, Path(json_schema_extra={"pattern": AGENT_NAME_PATTERN})]
MAX_USER_ID_CHARS = 256
USER_ID_PATTERN = rf"^(?!\s*$)[^\x00-\x1f\x7f-\x9f]{{1,{MAX_USER_ID_CHARS}}}$"
"""What `check_user_id` accepts (and the OpenAPI document states): 1-256 characters, no control
character, not blank."""
UserIdPath = Annotated[
    str,
    Path(
        alias="userId",
        description="The user to forget",
        json_schema_extra={"pattern": USER_ID_PATTERN},
    ),
]
_SEGMENT = "[A-Za-z0-9_-][A-Za-z0-9._-]{0,13}"
WORKSPACE_PATH_PATTERN = f"^{_SEGMENT}(/{_SEGMENT}){{0,7}}$"
"""Workspace paths every backend accepts, for the OpenAPI document of a file read (any other
path is 400 or 404 there): relative, `/`-separated names of a few plain characters (no `.` or
`..` segment, no reserved suffix). A directory listing takes any path the filesystem's rules
allow (a missing directory lists empty), so its `path` has no pattern."""
PATH_DESCRIPTION = "A path inside the conversation workspace"
PathQuery = Annotated[
    str | None, Query(description=f"{PATH_DESCRIPTION}; blank or `.` is its root")
]
FilePathQuery = Annotated[
    str, Query(description=PATH_DESCRIPTION, json_schema_extra={"pattern": WORKSPACE_PATH_PATTERN})
]


def admin_router() -> APIRouter:
    """The admin routes; mounted by `create_harness_router`."""
    router = APIRouter(prefix="/api/admin", tags=["admin"], route_class=HarnessRoute)

    @router.get("/workspace/owners", summary="Owners with a plan store and/or a filesystem")
    async def owners(host: HarnessDep, principal: AdminPrincipalDep) -> Any:
        if host.settings.groups.admin.read_auth_required:
            require_principal(principal, host.settings)
        plans = set(host.owners(PLAN_SURFACE))
        files = set(host.owners(FILE_SURFACE))
        return [
            {"owner": owner, "plan": owner in plans, "filesystem": owner in files}
            for owner in sorted(plans | files)
        ]

    @router.get(
        "/agents/{name}/plan",
        summary="The stored plan of one agent and conversation",
        responses=READ_ANSWERS,
    )
    async def plan(
        name: AgentName,
        host: HarnessDep,
        principal: AdminPrincipalDep,
        conversation_id: ConversationQuery = None,
        session_id: SessionQuery = None,
    ) -> Any:
        name, conversation = workspace_read(host, principal, name, conversation_id, session_id)
        found = await plan_store_of(host, name).get(name, conversation)
        if found is None:
            raise Problem(404, f"no plan for agent {name!r} in conversation {conversation!r}")
        body: dict[str, Any] = {"agent": name, **conversation_keys(conversation)}
        if found.goal:
            body["goal"] = found.goal
        body["steps"] = found.wire_steps()
        return body

    @router.get(
        "/agents/{name}/plan/events",
        summary="The live plan of one agent and conversation (SSE)",
        response_class=EventSourceResponse,
        responses={
            200: {"content": {"text/event-stream": {}}},
            **READ_ANSWERS,
            **error_responses({503: "The plan event bus is not running"}),
        },
    )
    async def plan_events(
        name: AgentName,
        host: HarnessDep,
        principal: AdminPrincipalDep,
        conversation_id: ConversationQuery = None,
        session_id: SessionQuery = None,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    ) -> Response:
        name, conversation = workspace_read(host, principal, name, conversation_id, session_id)
        store = plan_store_of(host, name)
        bus: PlanEventBus | None = host.services.get(BUS_SERVICE)
        if bus is None:
            raise Problem(503, "the plan event bus is not running")
        return plan_event_response(
            bus,
            store,
            owner=name,
            agent_id=name,
            conversation_id=conversation,
            last_event_id=last_event_id,
        )

    @router.delete(
        "/users/{userId}",
        summary="Forget a user: every conversation they own, their facts and /memories",
        responses={
            200: {"description": "Forgotten: `{userId, conversationsDeleted}`"},
            **error_responses(
                {
                    400: "A blank user id, or one with a control character",
                    409: "A conversation of the user has a run in flight; nothing was deleted",
                }
            ),
        },
    )
    async def forget_user(
        user_id: UserIdPath, host: HarnessDep, principal: AdminPrincipalDep
    ) -> Any:
        require_principal(principal, host.settings)
        user = check_user_id(user_id)
        result = await host.forget_user(user)
        if result.busy:
            shown_busy = result.busy[:SHOWN_BUSY]
            named = ", ".join(f"{path} {conversation}" for path, conversation in shown_busy)
            more = len(result.busy) - len(shown_busy)
            raise Problem(
                409,
                f"{len(result.busy)} conversation(s) of this user have a run in flight, nothing "
                f"was deleted: {named}{f' and {more} more' if more else ''}; cancel them "
                "(POST P/runs/{runId}/cancel) and ask again",
            )
        return {"userId": user, "conversationsDeleted": result.conversations}

    @router.get(
        "/agents/{name}/files",
        summary="A directory of a conversation workspace",
        responses=READ_ANSWERS,
    )
    async def files(
        name: AgentName,
        host: HarnessDep,
        principal: AdminPrincipalDep,
        conversation_id: ConversationQuery = None,
        session_id: SessionQuery = None,
        path: PathQuery = None,
    ) -> Any:
        name, conversation = workspace_read(host, principal, name, conversation_id, session_id)
        fs = await conversation_files(host, name, conversation)
        entries = await fs.ls(path)  # a FileSystemError answers 400 (web.errors)
        return {
            "agent": name,
            **conversation_keys(conversation),
            "path": path.strip() if path and path.strip() else ".",
            "entries": [
                {"path": entry.path, "size": entry.size, "directory": entry.directory}
                for entry in entries
            ],
        }

    @router.get(
        "/agents/{name}/files/content",
        summary="One file of a conversation workspace",
        responses=READ_ANSWERS,
    )
    async def file_content(
        name: AgentName,
        path: FilePathQuery,
        host: HarnessDep,
        principal: AdminPrincipalDep,
        conversation_id: ConversationQuery = None,
        session_id: SessionQuery = None,
    ) -> Any:
        name, conversation = workspace_read(host, principal, name, conversation_id, session_id)
        fs = await conversation_files(host, name, conversation)
        # FileNotFoundInWorkspace answers 404, any other FileSystemError 400 (web.errors).
        content = await fs.read(path)
        return {"agent": name, **conversation_keys(conversation), "path": path, "content": content}

    return router


SHOWN_BUSY = 20
"""Conversations a 409 of `DELETE /api/admin/users/{userId}` names (of those in flight)."""


def check_user_id(user_id: str) -> str:
    """A user id the admin API may name (`USER_ID_PATTERN`)."""
    if re.fullmatch(USER_ID_PATTERN, user_id) is None:
        raise Problem(
            400,
            f"userId must be 1 to {MAX_USER_ID_CHARS} characters, not blank, with no control "
            "character",
        )
    return user_id


def warn_admin_posture(settings: HarnessSettings) -> None:
    """Say at start-up when every admin read will be denied (the gate fails closed)."""
    if settings.groups.admin.token:
        return
    if settings.groups.admin.read_auth_required:
        log.warning(
            "ATMOSPHERE_ADMIN_HTTP_READ_AUTH_REQUIRED is on but no ATMOSPHERE_ADMIN_TOKEN is "
            "set: every admin read is denied"
        )
    else:
        log.info("no ATMOSPHERE_ADMIN_TOKEN: admin workspace reads are denied")
