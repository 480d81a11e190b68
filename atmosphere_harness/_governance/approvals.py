"""Pending approvals: the calls waiting for a person, and their answers.

An approval belongs to the conversation whose client must answer it: the top-level run of the
request (a sub-agent's or a fleet member's gated call is answered on the coordinator's route).
It lives here, not in the HTTP connection, so the answer route works whether or not the client's
stream is connected, and a reconnecting client finds it still pending until it expires.

Ids are random (122 bits), bound to their endpoint path, and, when the run has a user, to that
user. Answered ids are remembered for a while so a second answer gets "already answered" (409)
rather than "unknown" (404).
"""

from __future__ import annotations

import asyncio
import enum
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

MAX_PENDING = 1024
"""Approvals waiting at once, app-wide; a call beyond it is refused instead of queued."""
REMEMBERED_ANSWERS = 4096


@dataclass(frozen=True, slots=True)
class Answer:
    """A person's answer: run it (maybe with edited arguments) or do not."""

    approve: bool
    arguments: Mapping[str, Any] | None = None


class AnswerStatus(enum.Enum):
    ACCEPTED = "accepted"
    UNKNOWN = "unknown"
    ALREADY_ANSWERED = "already-answered"
    FORBIDDEN = "forbidden"


@dataclass(slots=True)
class PendingApproval:
    """One call waiting for an answer."""

    id: str
    path: str
    conversation_id: str
    user_id: str | None
    tool: str
    tool_call_id: str
    arguments: Mapping[str, Any]
    expires_at: float
    """Wall-clock expiry (epoch seconds)."""
    future: asyncio.Future[Answer] = field(repr=False)

    @classmethod
    def create(
        cls,
        *,
        path: str,
        conversation_id: str,
        user_id: str | None,
        tool: str,
        tool_call_id: str,
        arguments: Mapping[str, Any],
        timeout: float,
        approval_id: str | None = None,
        expires_at: float | None = None,
        now: float | None = None,
    ) -> PendingApproval:
        """What every `ApprovalStore.open` registers: a new id and `timeout` from `now`, or, for
        an approval a durable run re-opens, its own id and deadline."""
        if expires_at is None:
            expires_at = (time.time() if now is None else now) + timeout
        return cls(
            id=approval_id or uuid.uuid4().hex,
            path=path,
            conversation_id=conversation_id,
            user_id=user_id,
            tool=tool,
            tool_call_id=tool_call_id,
            arguments=dict(arguments),
            expires_at=expires_at,
            future=asyncio.get_running_loop().create_future(),
        )

    def expires_at_iso(self) -> str:
        moment = datetime.fromtimestamp(self.expires_at, UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def to_wire(self) -> dict[str, Any]:
        """The `approval-required` frame's data (and one entry of the pending list)."""
        return {
            "approvalId": self.id,
            "toolCallId": self.tool_call_id,
            "tool": self.tool,
            "arguments": dict(self.arguments),
            "expiresAt": self.expires_at_iso(),
        }


class ApprovalStore(Protocol):
    """Where pending approvals live, so the answer route finds them.

    Every method is async: a scale-out store answers an approval raised on another replica by
    routing the answer to the replica whose run waits for it. `ApprovalRegistry` is the embedded
    (one process) implementation; `backends` chooses.
    """

    async def open(
        self,
        *,
        path: str,
        conversation_id: str,
        user_id: str | None,
        tool: str,
        tool_call_id: str,
        arguments: Mapping[str, Any],
        timeout: float,
    ) -> PendingApproval | None:
        """Register a call that waits for an answer; `None` when too many already wait.

        A store that serves durable runs also takes `approval_id` and `expires_at` (epoch
        seconds): the approval a run raised before a restart, re-opened under its id and with
        its deadline (`ApprovalRegistry` does; the gate passes them only then)."""
        ...

    async def wait(self, pending: PendingApproval, timeout: float) -> Answer | None:
        """The answer, or `None` when `timeout` passed first; the approval is closed either way."""
        ...

    async def discard(self, pending: PendingApproval) -> None:
        """Close an approval without an answer (later answers get 404)."""
        ...

    async def answer(
        self, path: str, approval_id: str, answer: Answer, *, user_id: str | None
    ) -> AnswerStatus: ...

    async def pending(
        self, path: str, conversation_id: str, *, user_id: str | None
    ) -> list[PendingApproval]:
        """The conversation's approvals still waiting (those this user may answer: the
        conversation's owner, who ran the prompt; an anonymous run's only anonymously)."""
        ...

    async def forget(self, path: str, conversation_id: str) -> None:
        """Drop every approval of the conversation, waiting or answered (a deleted
        conversation: it has no run in flight)."""
        ...


class ApprovalRegistry:
    """Every pending approval of the app, by id, in this process (an `ApprovalStore`)."""

    def __init__(self, *, max_pending: int = MAX_PENDING) -> None:
        self.max_pending = max_pending
        self._pending: dict[str, PendingApproval] = {}
        self._answered: OrderedDict[str, str] = OrderedDict()
        """Recently answered ids and their endpoint path."""

    async def open(
        self,
        *,
        path: str,
        conversation_id: str,
        user_id: str | None,
        tool: str,
        tool_call_id: str,
        arguments: Mapping[str, Any],
        timeout: float,
        approval_id: str | None = None,
        expires_at: float | None = None,
    ) -> PendingApproval | None:
        """Register a call that waits for an answer; `None` when too many already wait.

        `approval_id` and `expires_at` (epoch seconds) re-open an approval a durable run raised
        before a restart, under its id and with its deadline; otherwise a new id, and `timeout`
        from now."""
        if len(self._pending) >= self.max_pending:
            return None
        pending = PendingApproval.create(
            path=path,
            conversation_id=conversation_id,
            user_id=user_id,
            tool=tool,
            tool_call_id=tool_call_id,
            arguments=arguments,
            timeout=timeout,
            approval_id=approval_id,
            expires_at=expires_at,
        )
        self._pending[pending.id] = pending
        return pending

    async def wait(self, pending: PendingApproval, timeout: float) -> Answer | None:
        """The answer, or `None` when `timeout` passed first. The approval is closed either way
        (also when the waiting run is cancelled)."""
        try:
            return await asyncio.wait_for(asyncio.shield(pending.future), timeout)
        except TimeoutError:
            return None
        finally:
            self._close(pending)

    async def discard(self, pending: PendingApproval) -> None:
        """Close an approval without an answer (later answers get 404)."""
        self._close(pending)

    def _close(self, pending: PendingApproval) -> None:
        """Close an approval without an answer (later answers get 404)."""
        self._pending.pop(pending.id, None)
        if not pending.future.done():
            pending.future.cancel()

    async def answer(
        self, path: str, approval_id: str, answer: Answer, *, user_id: str | None
    ) -> AnswerStatus:
        pending = self._pending.get(approval_id)
        if pending is None:
            if self._answered.get(approval_id) == path:
                return AnswerStatus.ALREADY_ANSWERED
            return AnswerStatus.UNKNOWN
        if pending.path != path:
            return AnswerStatus.UNKNOWN
        if pending.user_id != user_id:
            return AnswerStatus.FORBIDDEN
        if pending.future.done():
            return AnswerStatus.ALREADY_ANSWERED
        pending.future.set_result(answer)
        self._answered[approval_id] = path
        while len(self._answered) > REMEMBERED_ANSWERS:
            self._answered.popitem(last=False)
        return AnswerStatus.ACCEPTED

    async def pending(
        self, path: str, conversation_id: str, *, user_id: str | None
    ) -> list[PendingApproval]:
        """The conversation's approvals still waiting (those this user may answer: the
        conversation's owner, who ran the prompt; an anonymous run's only anonymously)."""
        return [
            entry
            for entry in self._pending.values()
            if entry.path == path
            and entry.conversation_id == conversation_id
            and not entry.future.done()
            and entry.user_id == user_id
        ]

    async def forget(self, path: str, conversation_id: str) -> None:
        for approval_id, entry in list(self._pending.items()):
            if entry.path == path and entry.conversation_id == conversation_id:
                del self._pending[approval_id]
                if not entry.future.done():
                    entry.future.cancel()

    def __len__(self) -> int:
        return len(self._pending)
