"""The hooks that put governance on every tool call (see `tools.executor` for their order).

- `ToolCallAdmission` (an admission hook, before `tool-start`): the policy chain judges
  `call_tool:<name>`. A denial answers the call with
  `{"status":"cancelled","message":"Tool <name> denied by policy '<policy>': <reason>"}`, which
  the client sees as the call's `tool-start` and `tool-result` frames; a `Transform` whose
  `tool_args` differ replaces the arguments. A call judged again (an approver edited its
  arguments) first releases its earlier admission (post-response, no response), so a stateful
  policy sees one release per admission.
- `PostResponse` (a result hook): every policy sees the result the model gets, so a stateful
  policy can release what it took at admission.
- `ApprovalGate` (the approval hook, after `tool-start`): a call the `ToolApprovalPolicy` gates
  emits `approval-required` and waits for `POST P/approvals/{id}`; deny and timeout answer with
  Atmosphere's JSON, approve runs the tool (with the person's edited arguments, if any, once
  the executor has validated them and the admission hooks admitted them again).
  In a durable run (the run's `contracts.CALL_JOURNAL`) the approval is journalled
  (`approval`), and so is its answer (`answer`): a run resumed after a restart raises it again
  under the same id with the same deadline (the timeout counts from when it was first raised),
  or goes on with the answer it already had.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import _events as events
from .._contracts import CALL_JOURNAL, Approval, Key, Run
from .._tools.results import json_result
from .approval import ToolApprovalPolicy
from .approvals import ApprovalStore
from .chain import PolicyChain, Verdict
from .policy import PolicyContext, PolicyPhase, PolicyRequest

if TYPE_CHECKING:
    from .._runtimes.base import ToolCall
    from .._tools.base import Tool

PREVIEW_CHARS = 200
_ADMITTED: Key[dict[str, PolicyRequest]] = Key("governance.admitted")
"""`run.state` key: the request each admitted call id was judged on (for its post-response)."""

DENIED_BY_APPROVAL_POLICY = json_result(
    status="cancelled", message="Tool execution denied by policy"
)
CANCELLED_BY_USER = json_result(status="cancelled", message="Action cancelled by user")
APPROVAL_TIMED_OUT = json_result(status="timeout", message="Approval timed out")
TOO_MANY_APPROVALS = json_result(
    status="cancelled",
    message="Tool execution refused: too many approvals are already pending; try again later",
)


def policy_context(
    run: Run, phase: PolicyPhase, request: PolicyRequest, response: str | None = None
) -> PolicyContext:
    """A context for `request` asked on behalf of `run`."""
    return PolicyContext(
        phase=phase,
        request=request,
        accumulated_response=response,
        user_id=run.user_id,
        conversation_id=run.conversation_id,
        agent=run.endpoint.owner,
    )


def tool_call_request(tool: Tool, arguments: Mapping[str, Any]) -> PolicyRequest:
    metadata: dict[str, Any] = {"tool_name": tool.name, "action": "call_tool"}
    if arguments:
        text = json.dumps(arguments, ensure_ascii=False, default=str)
        metadata["tool_args_preview"] = (
            text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"
        )
        metadata["tool_args"] = dict(arguments)
    return PolicyRequest(f"call_tool:{tool.name}", metadata)


def denial_reason(verdict: Verdict) -> str:
    """The reason a tool-call denial shows (a failing policy is named by the caller)."""
    if verdict.failure is not None:
        return f"policy evaluation failed: {verdict.failure}"
    return verdict.reason or "denied"


class ToolCallAdmission:
    """Admission hook: the policy chain on `call_tool:<name>`."""

    def __init__(self, chain: PolicyChain) -> None:
        self.chain = chain

    async def __call__(
        self, call: ToolCall, tool: Tool, arguments: dict[str, Any], run: Run
    ) -> str | Mapping[str, Any] | None:
        if not self.chain:
            return None
        admitted = run.state.setdefault(_ADMITTED, dict)
        earlier = admitted.pop(call.id, None)
        if earlier is not None:
            await self.chain.release(policy_context(run, PolicyPhase.POST_RESPONSE, earlier))
        request = tool_call_request(tool, arguments)
        verdict = await self.chain.admit(policy_context(run, PolicyPhase.PRE_ADMISSION, request))
        if not verdict.admitted:
            return json_result(
                status="cancelled",
                message=(
                    f"Tool {tool.name} denied by policy '{verdict.denied_by}': "
                    f"{denial_reason(verdict)}"
                ),
            )
        admitted[call.id] = verdict.request
        rewritten = verdict.request.metadata.get("tool_args", arguments)
        transformed = verdict.request is not request and isinstance(rewritten, Mapping)
        if transformed and dict(rewritten) != arguments:
            return dict(rewritten)
        return None


class PostResponse:
    """Result hook: the post-response phase of every policy; never changes the result."""

    def __init__(self, chain: PolicyChain) -> None:
        self.chain = chain

    async def __call__(self, call: ToolCall, tool: Tool, result: str, run: Run) -> str:
        admitted = run.state.get(_ADMITTED, {})
        request = admitted.pop(call.id, None)
        if self.chain and request is not None:
            await self.chain.release(
                policy_context(run, PolicyPhase.POST_RESPONSE, request, response=result)
            )
        return result


class ApprovalGate:
    """Approval hook: ask a person before a gated call runs."""

    def __init__(self, policy: ToolApprovalPolicy, registry: ApprovalStore, timeout: float) -> None:
        self.policy = policy
        self.registry = registry
        self.timeout = timeout

    async def __call__(
        self, call: ToolCall, tool: Tool, arguments: dict[str, Any], run: Run
    ) -> Approval | None:
        if not self.policy.requires_approval(tool):
            return None
        if self.policy.denies_all:
            return Approval(False, result=DENIED_BY_APPROVAL_POLICY)
        # The person answers on the request's own route: the top-level run's endpoint and
        # conversation, also for a sub-agent's or a fleet member's call.
        root = run.root
        journal = run.state.get(CALL_JOURNAL)
        answered = journal.recall(call, "answer") if journal is not None else None
        if isinstance(answered, Mapping):
            return _verdict(bool(answered.get("approve")), answered.get("arguments"))
        raised = journal.recall(call, "approval") if journal is not None else None
        earlier = raised if isinstance(raised, Mapping) else None
        # Only a resumed run re-opens an approval under its id and deadline (a store that
        # journals no runs need not know these arguments).
        again: dict[str, Any] = (
            {"approval_id": str(earlier["id"]), "expires_at": float(earlier["expiresAt"])}
            if earlier
            else {}
        )
        pending = await self.registry.open(
            path=root.endpoint.path,
            conversation_id=root.conversation_id,
            user_id=root.user_id,
            tool=tool.name,
            tool_call_id=call.id,
            arguments=arguments,
            timeout=self.timeout,
            **again,
        )
        if pending is None:
            return Approval(False, result=TOO_MANY_APPROVALS)
        if earlier is None and journal is not None:
            await journal.record(
                call, "approval", {"id": pending.id, "expiresAt": pending.expires_at}
            )
        with run.hold():
            try:
                await run.session.emit(events.APPROVAL_REQUIRED, pending.to_wire())
            except BaseException:
                await self.registry.discard(pending)
                raise
            answer = await self.registry.wait(pending, max(0.0, pending.expires_at - time.time()))
        if answer is None:
            return Approval(False, result=APPROVAL_TIMED_OUT)
        arguments_given = dict(answer.arguments) if answer.arguments is not None else None
        if journal is not None:
            await journal.record(
                call, "answer", {"approve": answer.approve, "arguments": arguments_given}
            )
        return _verdict(answer.approve, arguments_given)

    async def close_pending(self, run: Run, journal: Mapping[str, Any]) -> None:
        """`contracts.PendingCloser` (the endpoint's `PENDING_APPROVALS`): close the approvals
        a superseded run's first life raised and nobody answered (journalled
        `approval:<turn>:<call>` without `answer:...`).

        Only those ids: the conversation may have newer approvals (its newer turns') pending.
        With the in-process registry a restart already forgot them (only a resumed run raises
        them again); a shared store (Redis, PostgreSQL) still lists them until they expire.
        """
        ids = {
            str(value["id"])
            for key, value in journal.items()
            if key.startswith("approval:")
            and isinstance(value, Mapping)
            and "id" in value
            and "answer:" + key.removeprefix("approval:") not in journal
        }
        if not ids:
            return
        root = run.root
        for pending in await self.registry.pending(
            root.endpoint.path, root.conversation_id, user_id=root.user_id
        ):
            if pending.id in ids:
                await self.registry.discard(pending)


def _verdict(approve: bool, arguments: Any) -> Approval:
    if not approve:
        return Approval(False, result=CANCELLED_BY_USER)
    return Approval(True, arguments=arguments if isinstance(arguments, Mapping) else None)
