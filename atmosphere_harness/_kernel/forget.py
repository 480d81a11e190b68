"""Deleting a conversation: the one entry point (`forget_conversation`) every deletion goes
through (`DELETE P/conversations/{id}`, forgetting a user, retention).

A conversation's state is spread over the kernel's stores and the primitives' ones. Each store
forgets it through its own `forget`. The ownership record goes first, under the conversation's
lock (no run of it starts meanwhile): every route answers 404 from then on, and a new prompt
claims the id afresh (it waits for the lock, then finds nothing). Then the kernel's stores: the
run journal (finished runs, their frames, the durable journal's records and checkpoints) and
run control's records; then the primitives', through the endpoint's `forget_hooks` (the memory
primitive clears the history, planning the plans and their updates, governance the approvals,
the filesystem the workspace); last the prompts' `Idempotency-Key`s. If a store fails, the
ownership record is put back (unless someone claimed the id meanwhile), so the owner can ask
again: every `forget` is idempotent.

A conversation with a run in flight (queued, running or waiting for an approval) is refused
with `RunConflict`, before anything is deleted. Retention (`kernel.retention`) deletes through
the same function, with `idle_before`: the endpoint's `expire_hooks` run first (fact
extraction), and the ownership record goes only if no prompt used the conversation since, in
one atomic step, which is also what makes two replicas sweeping at once delete it once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from .._contracts import (
    ANONYMOUS,
    ConversationLocks,
    Endpoint,
    PromptKeys,
    RunJournal,
    UserForgetHook,
)
from .._errors import RunConflict
from .._log import get_logger
from .control import RunControl
from .owners import ConversationAccess

log = get_logger(__name__)


class DeletingHost(Protocol):
    """What a deletion uses of the host (`kernel.host.HarnessHost`)."""

    @property
    def endpoints(self) -> Mapping[str, Endpoint]: ...

    @property
    def access(self) -> ConversationAccess: ...

    @property
    def control(self) -> RunControl: ...

    @property
    def locks(self) -> ConversationLocks: ...

    @property
    def runs(self) -> RunJournal: ...

    @property
    def prompt_keys(self) -> PromptKeys: ...

    @property
    def user_forget_hooks(self) -> list[UserForgetHook]: ...


PAGE = 100
"""Conversations read per page while a user's are gathered."""


@dataclass
class ForgottenUser:
    """What forgetting a user deleted, or (`busy`) why it deleted nothing."""

    conversations: int = 0
    busy: list[tuple[str, str]] = field(default_factory=list)
    """`(path, conversation_id)` of the user's conversations with a run in flight."""


def _in_flight(conversation_id: str) -> RunConflict:
    return RunConflict(
        f"conversation {conversation_id!r} has a run in flight; cancel it "
        "(POST P/runs/{runId}/cancel) or wait for it to end, then delete the conversation"
    )


async def forget_conversation(
    host: DeletingHost, path: str, conversation_id: str, *, idle_before: float | None = None
) -> bool:
    """Delete everything every store holds of the conversation of endpoint `path`; whether it
    did.

    Raises `RunConflict` while it has a run in flight (nothing is deleted). With `idle_before`
    (retention), the endpoint's `expire_hooks` run first (the memory primitive extracts the
    conversation's facts), and the conversation is kept (`False`) when a prompt used it at or
    after `idle_before`. See the module docstring for the order and what a failure leaves.
    """
    if await host.control.active(path, conversation_id):
        raise _in_flight(conversation_id)
    owner = await host.access.owners.owner(path, conversation_id)
    if owner is None and idle_before is not None:
        return False
    user_id = None if owner in (None, ANONYMOUS) else owner
    endpoint = host.endpoints.get(path)
    if idle_before is not None and endpoint is not None:
        for hook in endpoint.expire_hooks:
            await hook(conversation_id, user_id)
    async with host.locks.hold(path, conversation_id):
        if await host.control.active(path, conversation_id):
            raise _in_flight(conversation_id)
        dropped = await host.access.owners.forget(path, conversation_id, idle_before=idle_before)
        if not dropped and idle_before is not None:
            return False  # used again since it was found idle (or deleted meanwhile)
        try:
            # The journal first: its finished runs here hold their run's objects (the
            # workspace among them), which the stores below then find unused.
            await host.runs.forget(path, conversation_id)
            await host.control.forget(path, conversation_id)
            if endpoint is not None:
                for hook in endpoint.forget_hooks:
                    await hook(conversation_id, user_id)
            await host.prompt_keys.forget(path, conversation_id)
        except BaseException:
            if owner is not None:
                try:
                    await host.access.owners.claim(path, conversation_id, owner)
                except Exception as exc:
                    log.warning(
                        "could not restore the owner of a conversation whose deletion failed",
                        endpoint=path,
                        conversation=conversation_id,
                        error=str(exc),
                    )
            raise
    log.info("conversation deleted", endpoint=path, conversation=conversation_id)
    return True


async def _owned(host: DeletingHost, user: str) -> list[tuple[str, str]]:
    """Every `(path, conversation_id)` the user owns, on every endpoint this host serves."""
    found: list[tuple[str, str]] = []
    for path in sorted(host.endpoints):
        after: tuple[float, str] | None = None
        while True:
            rows = await host.access.owners.page(path, user, PAGE, after)
            found += [(path, row.conversation_id) for row in rows]
            if len(rows) < PAGE:
                break
            after = (rows[-1].updated_at, rows[-1].conversation_id)
    return found


async def forget_user(host: DeletingHost, user_id: str) -> ForgottenUser:
    """Forget a user: every conversation they own (as `forget_conversation`), then what the
    primitives keep of them beyond conversations (`Host.user_forget_hooks`: long-term facts,
    `/memories` files).

    While any of their conversations has a run in flight nothing is deleted and the result
    lists them in `busy` (the caller answers 409): cancel those runs, then ask again. A run
    that starts after that check makes its conversation's deletion raise `RunConflict`, after
    the others were deleted; asking again finishes the work.
    """
    owned = await _owned(host, user_id)
    busy = [
        (path, conversation_id)
        for path, conversation_id in owned
        if await host.control.active(path, conversation_id)
    ]
    if busy:
        return ForgottenUser(busy=busy)
    for path, conversation_id in owned:
        await forget_conversation(host, path, conversation_id)
    for hook in host.user_forget_hooks:
        await hook(user_id)
    log.info("user forgotten", conversations=len(owned))
    return ForgottenUser(conversations=len(owned))
