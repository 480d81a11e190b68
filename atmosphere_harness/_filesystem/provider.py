"""`AgentFileSystemProvider`: the per-owner source of conversation-scoped filesystems.

One provider per owner (agent, coordinator or endpoint) hands out one canonical instance per
conversation, so every tool call, the `@prompt` method and the admin API of that conversation
share one lock and one usage tally. Instances are kept in a weak map: a store lives as long as a
run, a request or user code holds it, and costs nothing afterwards (its files stay on disk).

The conversation cap (`FileSystemLimits.max_conversations`, 256 by default) is applied when a
conversation's directory is about to be created, which is its first write: at the cap, the least
recently written conversation directories are removed down to 7/8 of it, skipping every store
that is live in any process (`WorkspaceUsage.retire`: a store in use holds a lease). The count
and the creation run under one cross-process section (`files/.conversations.lock`), so processes
sharing the volume never overshoot the cap together. The provider counts the directories it
creates and lists them again only when that count reaches the cap, or when another process
created or evicted one since (the section says so), so a new conversation in a process working
alone costs no scan of its siblings. Asking for a conversation, listing it or reading from it
never creates a directory.

With `stores` (a state backend's `WorkspaceStores`, e.g. PostgreSQL rows) every conversation
workspace and every user's memory store comes from there instead of a directory, and the
backend applies the conversation cap itself; the composite routes, the canonical instances and
the API below stay the same.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import re
import shutil
import threading
import weakref
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from .._errors import FileSystemError
from .._log import get_logger
from .base import AgentFileSystem, FileSystemLimits
from .composite import CompositeAgentFileSystem, normalize_routes
from .paths import conversation_dir_name, store_key
from .stores import WorkspaceStores
from .usage import PROCESS_USAGE, WorkspaceUsage
from .workspace import WorkspaceAgentFileSystem

log = get_logger(__name__)

EVICTION_SLACK = 8
"""Eviction goes an eighth of the cap below it: one scan per `max_conversations // 8` new ones."""
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
LEASE_SUFFIX = ".live"
"""Of a store's lease file, `.{name}.live` beside it (`usage.lease_path`)."""
CAP_LOCK = ".conversations.lock"
"""The lock file (in `files/`) under which every process counts and creates conversations."""


def _nothing() -> None:
    """What retiring a store without a directory removes (only its lock files go)."""


def user_dir_name(user_id: str) -> str:
    """A user id as a directory name: itself when it is a plain name (letters, digits, `.`, `_`,
    `-`, starting with a letter or digit, at most 128), else `_` and a digest of it (an e-mail
    address, say; a plain name never starts with `_`), so no user id can name a path outside
    `memories/` or collide with another."""
    if not isinstance(user_id, str) or not user_id.strip():
        raise FileSystemError("userId must not be blank")
    if _PLAIN_NAME.fullmatch(user_id) and ".." not in user_id:
        return user_id
    return "_" + hashlib.sha256(user_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


class AgentFileSystemProvider:
    """Conversation-scoped filesystems of one owner, rooted at `{agent_root}/files/`.

    `routes` maps route prefixes to backends shared by every conversation (see
    `CompositeAgentFileSystem`); without routes each conversation gets its plain workspace.
    `usage` accounts the files and bytes of every workspace it hands out (default: the
    process-wide in-memory `WorkspaceUsage`). `stores`, when given, holds the conversation
    workspaces and memory stores instead of `{agent_root}/files/` and `{agent_root}/memories/`.
    """

    def __init__(
        self,
        agent_root: str | os.PathLike[str],
        limits: FileSystemLimits | None = None,
        *,
        routes: Mapping[str, AgentFileSystem] | None = None,
        fsync: bool = False,
        usage: WorkspaceUsage | None = None,
        stores: WorkspaceStores | None = None,
    ) -> None:
        self.stores = stores
        self.agent_root = Path(store_key(agent_root))
        self.limits = limits or FileSystemLimits()
        self.fsync = fsync
        self.usage: WorkspaceUsage = usage or PROCESS_USAGE
        self.routes: dict[str, AgentFileSystem] = normalize_routes(routes or {})
        self._live: weakref.WeakValueDictionary[str, AgentFileSystem] = (
            weakref.WeakValueDictionary()
        )
        self._memories: weakref.WeakValueDictionary[str, AgentFileSystem] = (
            weakref.WeakValueDictionary()
        )
        self._lock = threading.Lock()
        self._evicting = threading.Lock()
        self._count: int | None = None
        """Directories counted at the last scan plus those created since (under `_evicting`)."""
        self._section = self.usage.section(str(self.files_root / CAP_LOCK))

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

    @property
    def backend(self) -> str:
        """Where the workspaces live: `files`, or the stores' name (`postgres`)."""
        return "files" if self.stores is None else self.stores.name

    def workspace(self, conversation_id: str) -> AgentFileSystem:
        """The conversation's own bounded workspace (the composite's default backend): a
        `WorkspaceAgentFileSystem`, or the backend's store when `stores` is set."""
        found = self.for_conversation(conversation_id)
        if isinstance(found, CompositeAgentFileSystem):
            return found.default
        return found

    def memories(self, user_id: str) -> AgentFileSystem:
        """The durable memory store of `user_id` with this owner, kept across conversations:
        `{agent_root}/memories/{user}/` or the backend's per-user store (no I/O: nothing is
        created). Same bounds as a conversation's workspace; never evicted by the cap."""
        name = user_dir_name(user_id)
        with self._lock:
            found = self._memories.get(name)
            if found is None:
                if self.stores is not None:
                    found = self.stores.memories(self.agent_root, name, self.limits)
                else:
                    found = WorkspaceAgentFileSystem(
                        self.agent_root / "memories" / name,
                        self.limits,
                        fsync=self.fsync,
                        usage=self.usage,
                    )
                self._memories[name] = found
            return found

    def has_conversation(self, conversation_id: str) -> bool:
        """Whether the conversation ever wrote a file (its directory exists). Never creates.

        Files backend only (a backend's stores answer `has_files`, which is async)."""
        return (self.files_root / conversation_dir_name(conversation_id)).is_dir()

    async def has_files(self, conversation_id: str) -> bool:
        """Whether the conversation ever wrote a file, on either backend. Never creates."""
        if self.stores is None:
            return self.has_conversation(conversation_id)
        name = conversation_dir_name(conversation_id)
        return await self.stores.has_conversation(self.agent_root, name)

    async def forget(self, conversation_id: str) -> None:
        """Delete the conversation's workspace, every file in it (a deleted conversation).

        Raises `FileSystemError` when a process still uses the folder (a run of the
        conversation somewhere: the caller refuses those first)."""
        name = conversation_dir_name(conversation_id)
        with self._lock:
            self._live.pop(name, None)
        if self.stores is not None:
            await self.stores.forget(self.agent_root, name)
            return
        if not await asyncio.to_thread(self._remove, name):
            raise FileSystemError(
                f"the workspace of conversation {conversation_id!r} is in use; try again"
            )

    async def forget_user(self, user_id: str) -> None:
        """Delete the user's `/memories` store with this owner (a forgotten user)."""
        name = user_dir_name(user_id)
        with self._lock:
            self._memories.pop(name, None)
        if self.stores is not None:
            await self.stores.forget_memories(self.agent_root, name)
            return
        path = self.agent_root / "memories" / name
        if not await asyncio.to_thread(self._retire, path):
            raise FileSystemError("the user's /memories store is in use; try again")

    def _remove(self, name: str) -> bool:
        """Remove `{files}/{name}` unless a store of some process is live on it (under the cap's
        section, so the count is taken again by the next creation)."""
        path = self.files_root / name
        if not path.is_dir():
            return True
        with self._evicting, self._section:
            self._count = None
            return self._retire(path)

    def _retire(self, path: Path) -> bool:
        """Remove the store directory `path` unless some process uses it."""
        if not path.is_dir():
            return True
        remove = partial(shutil.rmtree, path, ignore_errors=True)
        if self.usage.retire(store_key(path), remove):
            return True
        # A finished run may still reference the store (a cycle the collector has not reached
        # yet): collect once, then try again.
        gc.collect()
        return self.usage.retire(store_key(path), remove)

    def conversations(self) -> list[str]:
        """Conversation ids with a directory, sorted. Never creates. Files backend only
        (`stores.conversations` lists a backend's)."""
        try:
            with os.scandir(self.files_root) as listing:
                return sorted(
                    entry.name for entry in listing if entry.is_dir(follow_symlinks=False)
                )
        except FileNotFoundError:
            return []

    def _build(self, name: str) -> AgentFileSystem:
        workspace: AgentFileSystem
        if self.stores is not None:
            workspace = self.stores.conversation(self.agent_root, name, self.limits)
        else:
            workspace = WorkspaceAgentFileSystem(
                self.files_root / name,
                self.limits,
                fsync=self.fsync,
                on_create=partial(self._make_room, name),
                usage=self.usage,
            )
        if not self.routes:
            return workspace
        return CompositeAgentFileSystem(workspace, self.routes)

    def _make_room(self, keep: str) -> None:
        """Called before a conversation directory is created: keep the owner under the cap, and
        create the directory.

        The count and the creation are one step for every process on the volume (the usage's
        section over `files/`); a count another process may have changed is taken again."""
        cap = self.limits.max_conversations
        with self._evicting, self._section as foreign:
            if foreign or self._count is None or self._count >= cap:
                self._count = self._evict(keep, cap)
            # Created here, inside the section: a count taken by another process meanwhile
            # must see it.
            (self.files_root / keep).mkdir(parents=True, exist_ok=True)
            self._count += 1

    def _sweep_orphans(self, leases: list[str], directories: set[str], keep: str) -> None:
        """Remove the lock files of stores that have no directory (a conversation whose only
        operations were refused, an edit of a missing file, say) unless some process uses them."""
        for name in leases:
            if name not in directories and name != keep:
                self.usage.retire(store_key(self.files_root / name), _nothing)

    def _evict(self, keep: str, cap: int) -> int:
        """Count the directories; at the cap, remove the least recently written down to 7/8 of
        it (never `keep` or a live store). Returns how many remain."""
        leases: list[str] = []
        try:
            with os.scandir(self.files_root) as listing:
                entries = []
                for entry in listing:
                    if entry.is_dir(follow_symlinks=False):
                        stamp = entry.stat(follow_symlinks=False).st_mtime
                        entries.append((stamp, entry.name, entry.path))
                    elif entry.name.startswith(".") and entry.name.endswith(LEASE_SUFFIX):
                        leases.append(entry.name[1 : -len(LEASE_SUFFIX)])
        except FileNotFoundError:
            return 0
        self._sweep_orphans(leases, {name for _stamp, name, _path in entries}, keep)
        if len(entries) < cap:
            return len(entries)
        excess = len(entries) - (cap - 1 - cap // EVICTION_SLACK)
        remaining = len(entries)
        for _mtime, name, path in sorted(entries):
            if excess <= 0:
                break
            if name == keep or not self.usage.retire(
                store_key(path), partial(shutil.rmtree, path, ignore_errors=True)
            ):
                continue  # in use by some process
            excess -= 1
            remaining -= 1
            log.info("conversation workspace evicted (cap reached)", conversation=name, cap=cap)
        if remaining >= cap:
            log.warning(
                "conversation cap exceeded: the remaining workspaces are in use",
                cap=cap,
                over=remaining - cap + 1,
            )
        return remaining
