"""The `delegate_task` tool: hand a subtask to a named member of the coordinator's fleet.

Messages are those of Atmosphere: no fleet -> `delegate_task unavailable: ...`; a blank or unknown
agent lists the available ones; a member's failure reads `delegate_task to '<agent>' failed:
<detail>`. Every dispatch passes the installed governance policies first (message = the delegated
text, metadata `fleet.dispatch.agent` and `fleet.dispatch.skill`), fail-closed; a `Transform`
rewrites the text the member receives.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._errors import DelegationError
from .._governance.chain import PolicyChain
from .._governance.gate import policy_context
from .._governance.policy import PolicyPhase, PolicyRequest
from .._log import get_logger
from .._tools.base import Tool, ToolContext
from .fleet import AgentFleet

if TYPE_CHECKING:
    from .._contracts import Host

log = get_logger(__name__)

TOOL_NAME = "delegate_task"
UNAVAILABLE = "delegate_task unavailable: no agent fleet is bound to this session."


def _listing(fleet: AgentFleet) -> str:
    return "[" + ", ".join(fleet.names()) + "]"


def _description(fleet: AgentFleet) -> str:
    lines = [
        "Delegate a subtask to a named specialist of your fleet and get its reply. Write the "
        "message as a complete instruction: the specialist does not see this conversation."
    ]
    for member in fleet.members.values():
        summary = f": {member.description}" if member.description else ""
        lines.append(f"- {member.name}{summary}")
    if not fleet.members:
        lines.append("(no fleet members are declared)")
    return "\n".join(lines)


def delegate_tool(host: Host, fleet: AgentFleet, chain: PolicyChain) -> Tool:
    """The built-in `delegate_task` of one coordinator."""

    async def delegate(arguments: Mapping[str, Any], context: ToolContext) -> str:
        if not fleet.members:
            return UNAVAILABLE
        raw = arguments.get("agent")
        name = raw.strip() if isinstance(raw, str) else ""
        if not name:
            return f"delegate_task failed: 'agent' is required. Available agents: {_listing(fleet)}"
        member = fleet.get(name)
        if member is None:
            return (
                f"delegate_task failed: unknown agent '{name}'. Available agents: {_listing(fleet)}"
            )
        message = arguments.get("message")
        text = message if isinstance(message, str) else ""
        if chain:
            request = PolicyRequest(
                text, {"fleet.dispatch.agent": name, "fleet.dispatch.skill": member.skill}
            )
            verdict = await chain.admit(
                policy_context(context.run, PolicyPhase.PRE_ADMISSION, request)
            )
            if not verdict.admitted:
                reason = (
                    f"policy '{verdict.denied_by}' evaluation failed"
                    if verdict.failure is not None
                    else verdict.reason
                )
                return f"delegate_task to '{name}' failed: fleet-interceptor denied: {reason}"
            text = verdict.request.message
        try:
            return await fleet.call(host, member, text, context)
        except DelegationError as exc:
            return f"delegate_task to '{name}' failed: {exc}"
        except Exception as exc:
            log.warning("fleet member failed", agent=name, exc_info=True)
            return f"delegate_task to '{name}' failed: {exc or 'no error detail'}"

    return Tool(
        name=TOOL_NAME,
        description=_description(fleet),
        parameters={
            "type": "object",
            "properties": {
                "agent": {"type": "string", "description": "The fleet member's name"},
                "message": {
                    "type": "string",
                    "description": "The complete instruction for the specialist",
                },
            },
            "required": ["agent", "message"],
            "additionalProperties": False,
        },
        handler=delegate,
        concurrent=True,
        origin="delegation",
    )
