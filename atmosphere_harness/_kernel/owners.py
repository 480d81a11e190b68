"""Conversation ownership: the embedded record (`InMemoryConversationOwners`) and the one check
every route makes (`ConversationAccess`).

A conversation belongs to the user whose prompt first used its id. A prompt claims the id
(`ConversationAccess.claim`): the claim is atomic in the store, so two users racing for a new
id get one owner, whichever replica each reached. Any other request only reads the owner
(`ConversationAccess.allows`). A request without a user is the anonymous user (`ANONYMOUS`), so
an anonymous conversation is reachable by anyone who knows its id, and a user's conversation is
never reachable without that user.
"""

from __future__ import annotations

from .._contracts import ConversationOwners, user_key


class InMemoryConversationOwners:
    """Owners kept in this process only (a host built without backends: tests, embedding)."""

    def __init__(self) -> None:
        self._owners: dict[tuple[str, str], str] = {}

    async def claim(self, path: str, conversation_id: str, user: str) -> str:
        return self._owners.setdefault((path, conversation_id), user)

    async def owner(self, path: str, conversation_id: str) -> str | None:
        return self._owners.get((path, conversation_id))

    async def forget(self, path: str, conversation_id: str) -> None:
        self._owners.pop((path, conversation_id), None)


class ConversationAccess:
    """Whether a user may use a conversation of an endpoint, over one `ConversationOwners`.

    Both checks answer `False` the same way for "nobody owns it" and "someone else owns it":
    callers answer 404 for both, so a refusal never tells whether an id exists.
    """

    def __init__(self, owners: ConversationOwners) -> None:
        self.owners = owners

    async def claim(self, path: str, conversation_id: str, user_id: str | None) -> bool:
        """A prompt's check: claim the id for the user if it is unused; whether the user owns
        the conversation now."""
        user = user_key(user_id)
        return await self.owners.claim(path, conversation_id, user) == user

    async def allows(self, path: str, conversation_id: str, user_id: str | None) -> bool:
        """Every other request's check: whether the user owns the conversation (an id no
        prompt used is owned by nobody)."""
        return await self.owners.owner(path, conversation_id) == user_key(user_id)

    async def taken(self, path: str, conversation_id: str, user_id: str | None) -> bool:
        """Whether another user owns the conversation (a prompt of this user would be refused):
        the check of a WebSocket handshake, whose prompts claim the id later."""
        owner = await self.owners.owner(path, conversation_id)
        return owner is not None and owner != user_key(user_id)
