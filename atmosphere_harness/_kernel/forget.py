"""Deleting a conversation: the one entry point (`forget_conversation`) every deletion goes
through (`DELETE P/conversations/{id}`, forgetting a user, retention).

A conversation's state is spread over the kernel's stores and the primitives' ones. Each store
forgets it through its own `forget`. The ownership record goes first, under the conversation's
lock (no run of it starts meanwhile): every route answers 404 from then on, and a new prompt
claims the id afresh (it waits for the lock, then finds nothing). Then the conversations derived
from it, each deleted the same way, still under this one's lock (a fleet member's conversation
for this coordinator conversation, whose ownership record names it as their parent: a member
that coordinates a fleet of its own has its own derived ones, followed `MAX_DEPTH` levels
down). Then the kernel's stores: the run journal (finished runs, their frames, the durable
journal's records and checkpoints) and run control's records; then the primitives', through
the endpoint's `forget_hooks` (the memory primitive clears the history, planning the plans and
their updates, governance the approvals, the filesystem the workspace); last the prompts'
`Idempotency-Key`s. If a store fails, the ownership record is put back (unless someone claimed
the id meanwhile), so the owner can ask again: every `forget` is idempotent. Once everything is
deleted, the host's `scrubbers` wipe what the stores' files still hold of the deleted rows
(the embedded SQLite file's free pages and its WAL).

A `task` sub-agent's conversation leaves nothing under its own id: its plan and workspace live
in a temporary folder removed when it ends, and what it reports (its frames, the files it kept,
the approvals it asked for) is its parent conversation's, deleted with it.

A conversation with a run in flight (queued, running or waiting for an approval), or one of the
conversations derived from it, is refused with `RunConflict`, before anything is deleted.
Retention (`kernel.retention`) deletes through the same function, with `idle_before`: the
endpoint's `expire_hooks` run first (fact extraction, for the derived conversations too), and
the ownership record goes only if no prompt used the conversation since, in one atomic step,
which is also what makes two replicas sweeping at once delete it once. Retention never picks a
derived conversation on its own: it goes with its parent.
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
    Scrubber,
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

    @property
    def scrubbers(self) -> list[Scrubber]: ...


PAGE = 100
"""Conversations read per page while a user's are gathered."""
MAX_DEPTH = 8
"""Levels of derived conversations a deletion follows (a fleet member that coordinates a fleet
of its own is one level more; fleets are acyclic, checked at start-up)."""
MAX_DERIVED = 10_000
"""Derived conversations one deletion gathers at most (a bound, never met by a real fleet)."""

Key = tuple[str, str]
"""`(path, conversation_id)`."""


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
    host: DeletingHost,
    path: str,
    conversation_id: str,
    *,
    idle_before: float | None = None,
    scrub: bool = True,
) -> bool:
    """Delete everything every store holds of the conversation of endpoint `path`, and of the
    conversations derived from it; whether it did.

    Raises `RunConflict` while it or one derived from it has a run in flight (nothing is
    deleted). With `idle_before` (retention), the endpoints' `expire_hooks` run first (the
    memory primitive extracts the conversations' facts), and the conversation is kept (`False`)
    when a prompt used it at or after `idle_before`. `scrub=False` leaves the host's scrubbers
    to the caller (one scrub after many deletions). See the module docstring for the order and
    what a failure leaves.
    """
    deleted = await _forget_tree(host, path, conversation_id, idle_before=idle_before)
    if deleted and scrub:
        await scrub_stores(host)
    return bool(deleted)


async def scrub_stores(host: DeletingHost) -> None:
    """Let every store whose files keep deleted rows' bytes wipe them (`Scrubber`)."""
    for scrubber in host.scrubbers:
        await scrubber.scrub()


async def _derived(host: DeletingHost, path: str, conversation_id: str) -> list[Key]:
    """Every conversation derived from this one, level by level (bounded)."""
    found: list[Key] = []
    seen: set[Key] = {(path, conversation_id)}
    level = [(path, conversation_id)]
    for _ in range(MAX_DEPTH):
        below: list[Key] = []
        for parent in level:
            for child in await host.access.owners.children(*parent):
                if child not in seen and len(seen) <= MAX_DERIVED:
                    seen.add(child)
                    below.append(child)
        found += below
        if not below:
            break
        level = below
    return found


async def _forget_tree(
    host: DeletingHost, path: str, conversation_id: str, *, idle_before: float | None
) -> list[Key]:
    """`forget_conversation` without the scrub: the `(path, conversation_id)` it deleted,
    this one and its derived ones (empty: nothing was, retention found it in use)."""
    derived = await _derived(host, path, conversation_id)
    for key in [(path, conversation_id), *derived]:
        if await host.control.active(*key):
            raise _in_flight(conversation_id)
    owner = await host.access.owners.owner(path, conversation_id)
    if owner is None and idle_before is not None:
        return []
    if idle_before is not None:
        for key in [(path, conversation_id), *derived]:
            await _expire(host, *key)
    deleted: list[Key] = []
    await _forget_one(host, path, conversation_id, owner, idle_before, 0, deleted)
    if deleted:
        log.info(
            "conversation deleted",
            endpoint=path,
            conversation=conversation_id,
            derived=len(deleted) - 1,
        )
    return deleted


async def _expire(host: DeletingHost, path: str, conversation_id: str) -> None:
    """Run the endpoint's `expire_hooks` for a conversation retention is about to delete."""
    endpoint = host.endpoints.get(path)
    if endpoint is None or not endpoint.expire_hooks:
        return
    owner = await host.access.owners.owner(path, conversation_id)
    user_id = None if owner in (None, ANONYMOUS) else owner
    for hook in endpoint.expire_hooks:
        await hook(conversation_id, user_id)


async def _forget_one(
    host: DeletingHost,
    path: str,
    conversation_id: str,
    owner: str | None,
    idle_before: float | None,
    depth: int,
    deleted: list[Key],
) -> None:
    """Delete one conversation, then (under its lock) the ones derived from it; each deleted
    `(path, conversation_id)` is added to `deleted`."""
    user_id = None if owner in (None, ANONYMOUS) else owner
    endpoint = host.endpoints.get(path)
    async with host.locks.hold(path, conversation_id):
        if await host.control.active(path, conversation_id):
            raise _in_flight(conversation_id)
        # Read before the record goes (a store may keep the list with it).
        children = await host.access.owners.children(path, conversation_id)
        dropped = await host.access.owners.forget(path, conversation_id, idle_before=idle_before)
        if not dropped and idle_before is not None:
            return  # used again since it was found idle (or deleted meanwhile)
        try:
            if depth < MAX_DEPTH:
                for child_path, child_id in children:
                    child_owner = await host.access.owners.owner(child_path, child_id)
                    await _forget_one(
                        host, child_path, child_id, child_owner, None, depth + 1, deleted
                    )
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
    deleted.append((path, conversation_id))


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
    """Forget a user: every conversation they own (as `forget_conversation`, the ones derived
    from them with them), then what the primitives keep of them beyond conversations
    (`Host.user_forget_hooks`: long-term facts, `/memories` files), then one scrub.

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
    done: set[Key] = set()
    for path, conversation_id in owned:
        if (path, conversation_id) not in done:  # (a derived one its parent took along)
            done.update(await _forget_tree(host, path, conversation_id, idle_before=None))
    for hook in host.user_forget_hooks:
        await hook(user_id)
    await scrub_stores(host)
    log.info("user forgotten", conversations=len(owned))
    return ForgottenUser(conversations=len(owned))
