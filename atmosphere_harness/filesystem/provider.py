"""`AgentFileSystemProvider`: the per-owner source of conversation-scoped filesystems.

One provider per owner (agent, coordinator or endpoint) hands out one canonical instance per
conversation, so every tool call, the `@prompt` method and the admin API of that conversation
share one lock and one usage tally. Instances are kept in a weak map: a store lives as long as a
run, a request or user code holds it, and costs nothing afterwards (its files stay on disk).

The conversation cap (`FileSystemLimits.max_conversations`, 256 by default) is applied when a
conversation's directory is about to be created, which is its first write: the least recently
written conversation directories are removed until there is room, skipping every store that is
live in this process. Asking for a conversation, listing it or reading from it never creates a
directory.
"""

from __future__ import annotations

import os
import shutil
import threading
import weakref
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from ..log import get_logger
from .base import AgentFileSystem, FileSystemLimits
from .composite import CompositeAgentFileSystem, normalize_routes
from .workspace import WorkspaceAgentFileSystem, conversation_dir_name, is_live, store_key

log = get_logger(__name__)


class AgentFileSystemProvider:
    """Conversation-scoped filesystems of one owner, rooted at `{agent_root}/files/`.

    `routes` maps route prefixes to backends shared by every conversation (see
    `CompositeAgentFileSystem`); without routes each conversation gets its plain workspace.
    """

    def __init__(
        self,
        agent_root: str | os.PathLike[str],
        limits: FileSystemLimits | None = None,
        *,
        routes: Mapping[str, AgentFileSystem] | None = None,
        fsync: bool = False,
    ) -> None:
        self.agent_root = Path(store_key(agent_root))
        self.limits = limits or FileSystemLimits()
        self.fsync = fsync
        self.routes: dict[str, AgentFileSystem] = normalize_routes(routes or {})
        self._live: weakref.WeakValueDictionary[str, AgentFileSystem] = (
            weakref.WeakValueDictionary()
        )
        self._lock = threading.Lock()
        self._evicting = threading.Lock()

    @property
    def files_root(self) -> Path:
        return self.agent_root / "files"

    def for_conversation(self, conversation_id: str) -> AgentFileSystem:
        """The canonical filesystem of `conversation_id` (no I/O: nothing is created)."""
        name = conversation_dir_name(conversation_id)
        with self._lock:
            found = self._live.get(name)
            if found is None:
                found = self._build(name)
                self._live[name] = found
            return found

    def workspace(self, conversation_id: str) -> WorkspaceAgentFileSystem:
        """The conversation's own bounded workspace (the composite's default backend)."""
        found = self.for_conversation(conversation_id)
        if isinstance(found, CompositeAgentFileSystem):
            default = found.default
            assert isinstance(default, WorkspaceAgentFileSystem)
            return default
        assert isinstance(found, WorkspaceAgentFileSystem)
        return found

    def has_conversation(self, conversation_id: str) -> bool:
        """Whether the conversation ever wrote a file (its directory exists). Never creates."""
        return (self.files_root / conversation_dir_name(conversation_id)).is_dir()

    def conversations(self) -> list[str]:
        """Conversation ids with a directory, sorted. Never creates."""
        try:
            with os.scandir(self.files_root) as listing:
                return sorted(
                    entry.name for entry in listing if entry.is_dir(follow_symlinks=False)
                )
        except FileNotFoundError:
            return []

    def _build(self, name: str) -> AgentFileSystem:
        workspace = WorkspaceAgentFileSystem(
            self.files_root / name,
            self.limits,
            fsync=self.fsync,
            on_create=partial(self._make_room, name),
        )
        if not self.routes:
            return workspace
        return CompositeAgentFileSystem(workspace, self.routes)

    def _make_room(self, keep: str) -> None:
        """Evict least recently written conversations until one more fits under the cap."""
        cap = self.limits.max_conversations
        with self._evicting:
            try:
                with os.scandir(self.files_root) as listing:
                    entries = [
                        (entry.stat(follow_symlinks=False).st_mtime, entry.name, entry.path)
                        for entry in listing
                        if entry.is_dir(follow_symlinks=False)
                    ]
            except FileNotFoundError:
                return
            excess = len(entries) - (cap - 1)
            if excess <= 0:
                return
            for _mtime, name, path in sorted(entries):
                if excess <= 0:
                    break
                if name == keep or is_live(path):
                    continue
                shutil.rmtree(path, ignore_errors=True)
                excess -= 1
                log.info("conversation workspace evicted (cap reached)", conversation=name, cap=cap)
            if excess > 0:
                log.warning(
                    "conversation cap exceeded: the remaining workspaces are in use",
                    cap=cap,
                    over=excess,
                )
