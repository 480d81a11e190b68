"""`WorkspaceStores`: the seam through which a state backend holds workspace files.

The filesystem primitive keeps workspaces as directories under `{owner root}/files/` by default.
A state backend that can hold files itself (PostgreSQL: `backends.postgres.PostgresWorkspaceStores`)
passes one of these instead, and every store the primitive hands out (a conversation's
workspace, a user's `/memories`, a `prefix=postgres:` composite route) comes from it. The eight
tools, the offload hook and the admin REST only see `AgentFileSystem`, so they work unchanged.

The filesystem layer defines the protocol and the backends implement it, so nothing here
imports a backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from .base import AgentFileSystem, FileSystemLimits


@runtime_checkable
class WorkspaceStores(Protocol):
    """Opens bounded file stores by name; each is exact across every process that opens it."""

    name: str
    """What `GET /api/console/info` shows as `backends.workspace` (`postgres`)."""

    def conversation(
        self, owner_root: Path, conversation: str, limits: FileSystemLimits
    ) -> AgentFileSystem:
        """The workspace of one conversation of the owner rooted at `owner_root` (no I/O).

        `conversation` is already a safe name (`paths.conversation_dir_name`). The store keeps
        the owner under `limits.max_conversations` when a conversation first writes."""
        ...

    def memories(self, owner_root: Path, user: str, limits: FileSystemLimits) -> AgentFileSystem:
        """The durable per-user store of one owner (`user` already a safe name; no I/O)."""
        ...

    def route(self, prefix: str, limits: FileSystemLimits) -> AgentFileSystem:
        """The store of a composite route shared by every owner and conversation (no I/O)."""
        ...

    async def has_conversation(self, owner_root: Path, conversation: str) -> bool:
        """Whether the conversation holds any file (never creates anything)."""
        ...

    async def conversations(self, owner_root: Path) -> list[str]:
        """The owner's conversations that hold files, sorted."""
        ...

    async def forget(self, owner_root: Path, conversation: str) -> None:
        """Delete the conversation's workspace: its files and every record of changes to it
        (a deleted conversation)."""
        ...

    async def forget_memories(self, owner_root: Path, user: str) -> None:
        """Delete the user's `/memories` store of the owner (a forgotten user)."""
        ...
