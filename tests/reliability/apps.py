"""The apps the reliability suite serves: the personal-assistant sample's agents (a coordinator
with its fleet and an opted-in `ai_endpoint`: every primitive on), on a scripted model picked
per suite. `tests.reliability.server` imports this module in the server subprocess.

Identity comes from the `X-User-Id` header (`user_id_from_header`), so a client can act as a
user and long-term memory is exercised; settings come from the environment the test sets
(workspace, admin token, limits).
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from atmosphere_harness import HarnessSettings, ScriptedRuntime, create_harness_router
from atmosphere_harness._governance.approval import ToolApprovalPolicy
from atmosphere_harness._runtimes.base import AgentRuntime
from atmosphere_harness._web.deps import user_id_from_header
from samples.personal_assistant.app import Assistant, Chat
from tests.scaleout import postgres_model

from . import hostile, workload

OWNER = "assistant"
PATH = "/atmosphere/agent/assistant"
CHAT = "/atmosphere/ai-chat"
HEALTH = "/api/console/info"

RUNTIMES: dict[str, Callable[[], AgentRuntime]] = {
    # The demo model answers every prompt in a few bounded rounds (plan, file, delegation,
    # sub-agent or echo), so a fuzzer's prompts always end.
    "fuzz": ScriptedRuntime.demo,
    "load": workload.runtime,
    "hostile": hostile.runtime,
    # The two-replica tests' model (tests/scaleout): answers say what the replica saw.
    "postgres": postgres_model.runtime,
    # The same model without the approval gate on `write_file` (the workspace tests).
    "postgres-files": postgres_model.runtime,
}
APPROVALS: dict[str, ToolApprovalPolicy] = {"postgres": postgres_model.APPROVAL_POLICY}


def create(kind: str, settings: HarnessSettings | None = None) -> FastAPI:
    """The sample's agents on the `kind` model; `settings=None` reads the environment.

    `redis`: the scale-out tests' own app (`tests.scaleout.redis_app`).
    """
    if kind == "redis":
        from tests.scaleout.redis_app import create as create_replica

        return create_replica(settings)
    app = FastAPI(title=f"atmosphere-harness reliability ({kind})")
    app.include_router(
        create_harness_router(
            settings,
            agents=[Assistant, Chat],
            runtime=RUNTIMES[kind](),
            approval_policy=APPROVALS.get(kind),
            user_id=user_id_from_header,
        )
    )
    return app
