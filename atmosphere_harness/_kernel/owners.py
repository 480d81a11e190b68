"""Conversation ownership: the embedded record (`InMemoryConversationOwners`) and the one check
every route makes (`ConversationAccess`).

A conversation belongs to the user whose prompt first used its id. A prompt claims the id
(`ConversationAccess.claim`, or `locked_claim` in the step that takes the conversation's lock:
`kernel.entry`): the claim is atomic in the store, so two users racing for a new id get one
owner, whichever replica each reached. Any other request only reads the owner
(`ConversationAccess.allows`). A request without a user is the anonymous user (`ANONYMOUS`), so
an anonymous conversation is reachable by anyone who knows its id, and a user's conversation is
never reachable without that user.
"""

from __future__ import annotations

import time

from .._contracts import (
    ConversationOwners,
    ExpiredConversation,
    LockedClaim,
    OwnedConversation,
    conversation_title,
    user_key,
)


def newest_first(
    rows: list[OwnedConversation], limit: int, after: tuple[float, str] | None
) -> list[OwnedConversation]:
    """One page of `rows` in list order (newest `updated_at` first, then id descending)."""
    ordered = sorted(rows, key=lambda row: (row.updated_at, row.conversation_id), reverse=True)
    if after is not None:
        ordered = [row for row in ordered if (row.updated_at, row.conversation_id) < after]
    return ordered[:limit]


class InMemoryConversationOwners:
    """Owners kept in this process only (a host built without backends: tests, embedding)."""

    def __init__(self) -> None:
        self._owners: dict[tuple[str, str], tuple[str, float, str]] = {}
        self._parents: dict[tuple[str, str], tuple[str, str]] = {}
        self._sweeps: dict[tuple[str, str], float] = {}

    async def claim(
        self,
        path: str,
        conversation_id: str,
        user: str,
        title: str = "",
        parent: tuple[str, str] | None = None,
    ) -> str:
        key = (path, conversation_id)
        owner, _updated, first_title = self._owners.get(key, (user, 0.0, title))
        if owner == user:
            self._owners[key] = (owner, time.time(), first_title)
            if parent is not None:
                self._parents.setdefault(key, parent)
        return owner

    async def owner(self, path: str, conversation_id: str) -> str | None:
        found = self._owners.get((path, conversation_id))
        return None if found is None else found[0]

    async def children(self, path: str, conversation_id: str) -> list[tuple[str, str]]:
        return sorted(
            child for child, parent in self._parents.items() if parent == (path, conversation_id)
        )

    async def page(
        self, path: str, user: str, limit: int, after: tuple[float, str] | None = None
    ) -> list[OwnedConversation]:
        rows = [
            OwnedConversation(conversation_id, updated, title)
            for (at, conversation_id), (owner, updated, title) in self._owners.items()
            if at == path and owner == user
        ]
        return newest_first(rows, limit, after)

    async def forget(
        self, path: str, conversation_id: str, *, idle_before: float | None = None
    ) -> bool:
        key = (path, conversation_id)
        found = self._owners.get(key)
        if found is None or (idle_before is not None and found[1] >= idle_before):
            return False
        del self._owners[key]
        self._parents.pop(key, None)
        self._sweeps.pop(key, None)
        return True

    async def release(self, path: str, conversation_id: str) -> None:
        self._sweeps.pop((path, conversation_id), None)

    async def expired(self, before: float, limit: int, lease: float) -> list[ExpiredConversation]:
        now = time.time()
        rows = sorted(
            (updated, path, conversation_id, owner)
            for (path, conversation_id), (owner, updated, _title) in self._owners.items()
            if updated < before
            and (path, conversation_id) not in self._parents
            and self._sweeps.get((path, conversation_id), 0.0) < now
        )[:limit]
        for _updated, path, conversation_id, _owner in rows:
            self._sweeps[(path, conversation_id)] = now + lease
        return [
            ExpiredConversation(path, cid, owner, updated) for updated, path, cid, owner in rows
        ]


class ConversationAccess:
    """Whether a user may use a conversation of an endpoint, over one `ConversationOwners`.

    Both checks answer `False` the same way for "nobody owns it" and "someone else owns it":
    callers answer 404 for both, so a refusal never tells whether an id exists.
    """

    def __init__(self, owners: ConversationOwners) -> None:
        self.owners = owners

    async def claim(
        self,
        path: str,
        conversation_id: str,
        user_id: str | None,
        message: str = "",
        parent: tuple[str, str] | None = None,
    ) -> bool:
        """A prompt's check: claim the id for the user if it is unused; whether the user owns
        the conversation now. `message` (the prompt) titles a new conversation, and each
        prompt of the owner makes it the newest of their list; `parent` (`(path,
        conversation_id)`) is the conversation whose run this prompt is part of (a fleet
        member's), deleted with it."""
        user = user_key(user_id)
        title = conversation_title(message)
        if parent is None:
            return await self.owners.claim(path, conversation_id, user, title) == user
        return await self.owners.claim(path, conversation_id, user, title, parent) == user

    def locked_claim(
        self, path: str, conversation_id: str, user_id: str | None, message: str = ""
    ) -> LockedClaim:
        """`claim`, as an offer to the conversation's lock (`contracts.LockedClaim`), which
        makes it in the step that takes the lock (`kernel.entry`)."""
        return LockedClaim(
            self.owners, path, conversation_id, user_key(user_id), conversation_title(message)
        )

    async def allows(self, path: str, conversation_id: str, user_id: str | None) -> bool:
        """Every other request's check: whether the user owns the conversation (an id no
        prompt used is owned by nobody)."""
        return await self.owners.owner(path, conversation_id) == user_key(user_id)

    async def taken(self, path: str, conversation_id: str, user_id: str | None) -> bool:
        """Whether another user owns the conversation (a prompt of this user would be refused):
        the check of a WebSocket handshake, whose prompts claim the id later."""
        owner = await self.owners.owner(path, conversation_id)
        return owner is not None and owner != user_key(user_id)
