"""Where plans live: the `PlanStore` protocol and `FilePlanStore`, its on-disk implementation.

A plan store holds one `AgentPlan` per agent and conversation. The file store keeps each plan in
`{root}/plans/{agentId}/{conversationId}.json` (DESIGN section 5), where `root` is the owner's
workspace directory, and promises:

- keys are validated before any path is built (blank, `/`, `\\`, `..`, NUL, control characters
  and over-long keys are rejected) and the resolved path, symlinks included, must stay under
  `{root}/plans`;
- a write is atomic and durable: a temp file in the same directory, fsynced, then `os.replace`d
  over the old document and the directory fsynced, so a crash at any instant leaves the old plan
  or the new one, never a torn file;
- bounds are checked before writing (256 steps, 128 KiB serialized); a rejected plan leaves the
  stored one untouched;
- the store never bricks: creating a plan when `plans/` already holds 1024 documents evicts the
  least recently modified ones first, down to 7/8 of the cap, so the next creations cost no scan
  of the directory (the store counts its own creations; it lists `plans/` again when the count
  reaches the cap);
- the cap is exact across processes sharing the root: counting, creating and evicting run under
  an exclusive `flock` on `plans/.plans.lock` (`filelocks.LockFile`), whose holder's mark tells
  a store that another process created or evicted since its own count, which it then takes
  again; an update holds the same lock shared, so an eviction never removes a document while
  it is being written (the least recently modified go first, so a plan in use is the last
  candidate);
- a corrupt or unreadable document reads as no plan (with a WARN) instead of failing the run;
- writes to one document are serialized in the process; reads take no lock (the rename makes
  them safe); across processes the last write of a document wins, whole.

File work runs in a worker thread, so an fsync never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from .._errors import PlanStoreError
from .._filelocks import LockFile
from .._log import get_logger
from .model import AgentPlan

log = get_logger(__name__)

MAX_STEPS = 256
MAX_PLAN_BYTES = 128 * 1024
MAX_PLAN_FILES = 1024
EVICTION_SLACK = 8
"""Eviction goes an eighth of the cap below it: one scan per `max_files // 8` new plans."""
CAP_LOCK = ".plans.lock"
"""The lock file (in `plans/`) under which every process counts, creates and evicts plans."""
MAX_KEY_BYTES = 200
"""Keys name files; 200 bytes keeps `{key}.json` well under every filesystem's 255-byte limit."""

_TEMP_PREFIX = ".plan-"
_TEMP_SUFFIX = ".tmp"
_STALE_TEMP_SECONDS = 60.0


@runtime_checkable
class PlanStore(Protocol):
    """One plan per agent and conversation. Both methods are async and safe to call concurrently.

    `put` replaces the whole plan; a rejected one raises `PlanStoreError` and leaves the stored
    plan as it was. `get` returns `None` when there is no plan.
    """

    async def get(self, agent_id: str, conversation_id: str) -> AgentPlan | None: ...

    async def put(self, agent_id: str, conversation_id: str, plan: AgentPlan) -> None: ...

    async def forget(self, conversation_id: str) -> None:
        """Delete every plan of the conversation, each agent's (a deleted conversation)."""
        ...


def check_key(label: str, value: object) -> str:
    """Validate an `agentId` / `conversationId` before it becomes a path segment."""
    if not isinstance(value, str) or not value.strip():
        raise PlanStoreError(f"{label} must not be blank")
    if "/" in value or "\\" in value or ".." in value or value == ".":
        raise PlanStoreError(f"{label} contains illegal path characters: {value}")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in value):
        raise PlanStoreError(f"{label} contains control characters: {value!r}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_KEY_BYTES:
        raise PlanStoreError(f"{label} is too long ({size} bytes, at most {MAX_KEY_BYTES})")
    return value


def checked_put(
    agent_id: str, conversation_id: str, plan: AgentPlan, *, max_steps: int, max_plan_bytes: int
) -> tuple[str, str, bytes]:
    """A `PlanStore.put`'s arguments validated, as `(agent, conversation, UTF-8 JSON)`: every
    store (files, PostgreSQL, Redis) rejects the same plans with the same messages."""
    if plan is None:
        raise PlanStoreError("plan must not be None")
    agent = check_key("agentId", agent_id)
    conversation = check_key("conversationId", conversation_id)
    if len(plan.steps) > max_steps:
        raise PlanStoreError(
            f"plan rejected: {len(plan.steps)} steps exceeds the {max_steps}-step limit"
        )
    data = plan.to_json().encode("utf-8")
    if len(data) > max_plan_bytes:
        raise PlanStoreError(
            f"plan rejected: {len(data)} bytes exceeds the {max_plan_bytes}-byte limit"
        )
    return agent, conversation, data


class FilePlanStore:
    """Plans as JSON files under `{root}/plans/`; see the module docstring for the guarantees.

    Any root works, so a sub-agent or a test can keep its plans apart:
    `FilePlanStore(tmp_path)`. Directories are created on the first `put`, never by a `get`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_steps: int = MAX_STEPS,
        max_plan_bytes: int = MAX_PLAN_BYTES,
        max_files: int = MAX_PLAN_FILES,
    ) -> None:
        if min(max_steps, max_plan_bytes, max_files) <= 0:
            raise ValueError("plan store limits must be positive")
        self.root = Path(root)
        self.plans_dir = self.root / "plans"
        self.max_steps = max_steps
        self.max_plan_bytes = max_plan_bytes
        self.max_files = max_files
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._create_lock = threading.Lock()
        self._count: int | None = None
        """Documents counted at the last scan plus those created since (under the lock)."""
        self._section = LockFile(str(self.plans_dir / CAP_LOCK))

    def __repr__(self) -> str:
        return f"FilePlanStore({str(self.root)!r})"

    async def get(self, agent_id: str, conversation_id: str) -> AgentPlan | None:
        agent = check_key("agentId", agent_id)
        conversation = check_key("conversationId", conversation_id)
        return await asyncio.to_thread(self._read, agent, conversation)

    async def put(self, agent_id: str, conversation_id: str, plan: AgentPlan) -> None:
        agent, conversation, data = checked_put(
            agent_id,
            conversation_id,
            plan,
            max_steps=self.max_steps,
            max_plan_bytes=self.max_plan_bytes,
        )
        key = (agent, conversation)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            await _finish_in_thread(self._write, agent, conversation, data)

    async def forget(self, conversation_id: str) -> None:
        conversation = check_key("conversationId", conversation_id)
        await _finish_in_thread(self._remove_all, conversation)

    def path_for(self, agent_id: str, conversation_id: str) -> Path:
        """The document path of a plan (keys validated, containment checked, nothing created)."""
        return self._resolve(
            check_key("agentId", agent_id), check_key("conversationId", conversation_id)
        )

    # --- worker-thread side -------------------------------------------------------------------

    def _resolve(self, agent: str, conversation: str) -> Path:
        base = self.plans_dir.resolve()
        target = (base / agent / f"{conversation}.json").resolve()
        if not target.is_relative_to(base) or target.parent.parent != base:
            raise PlanStoreError(f"Path escapes workspace: {self.plans_dir / agent / conversation}")
        return target

    def _read(self, agent: str, conversation: str) -> AgentPlan | None:
        path = self._resolve(agent, conversation)
        try:
            with open(path, "rb") as handle:
                data = handle.read(self.max_plan_bytes + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("plan document unreadable; reading it as empty", path=str(path), error=exc)
            return None
        if len(data) > self.max_plan_bytes:
            log.warning("plan document over the size limit; reading it as empty", path=str(path))
            return None
        try:
            return AgentPlan.from_json(data)
        except (ValueError, TypeError) as exc:
            log.warning("corrupt plan document; reading it as empty", path=str(path), error=exc)
            return None

    def _write(self, agent: str, conversation: str, data: bytes) -> None:
        path = self._resolve(agent, conversation)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            # An update never changes the count; in shared mode it only keeps an eviction
            # (exclusive) from removing the document under it, which would let it reappear.
            with self._section.shared():
                if path.exists():
                    _atomic_write(path, data)
                    return
        # Creating a document is the only way the count grows: every process counts and creates
        # under one exclusive section, so concurrent new conversations cannot overshoot the cap.
        # A count another process may have changed since (the section says so) is taken again.
        with self._create_lock, self._section as foreign:
            if path.exists():  # created meanwhile (another process): an update after all
                _atomic_write(path, data)
                return
            if foreign or self._count is None or self._count >= self.max_files:
                self._count = self._make_room(path.parent.parent)
            _atomic_write(path, data)
            self._count += 1

    def _remove_all(self, conversation: str) -> None:
        """Remove the conversation's document in every agent's folder (under the section, so
        the count is taken again by the next creation)."""
        if not self.plans_dir.is_dir():
            return
        with self._create_lock, self._section:
            for agent_dir in _scan(str(self.plans_dir)):
                if agent_dir.is_dir(follow_symlinks=False):
                    _unlink(os.path.join(agent_dir.path, f"{conversation}.json"))
            self._count = None

    def _make_room(self, base: Path) -> int:
        """Count the documents; at the cap, evict the least recently modified down to 7/8 of it.

        Returns how many documents remain.
        """
        documents: list[tuple[float, str]] = []
        stale_before = time.time() - _STALE_TEMP_SECONDS
        for agent_dir in _scan(str(base)):
            if not agent_dir.is_dir(follow_symlinks=False):
                continue
            for entry in _scan(agent_dir.path):
                try:
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    modified = entry.stat(follow_symlinks=False).st_mtime
                except OSError:  # removed meanwhile (another process sharing the root)
                    continue
                if entry.name.endswith(".json"):
                    documents.append((modified, entry.path))
                elif entry.name.startswith(_TEMP_PREFIX) and modified < stale_before:
                    # Left behind by a process killed mid-write; never read, safe to drop.
                    _unlink(entry.path)
        if len(documents) < self.max_files:
            return len(documents)
        excess = len(documents) - (self.max_files - 1 - self.max_files // EVICTION_SLACK)
        documents.sort()
        for _modified, victim in documents[:excess]:
            _unlink(victim)
        log.warning(
            "plan file cap reached; evicted the least recently modified plans",
            evicted=excess,
            cap=self.max_files,
            root=str(self.root),
        )
        return len(documents) - excess


class OwnerPlanStores:
    """The plan stores of every owner as one `PlanStore`, addressed with `agentId` = owner.

    Plans are stored per owner, but a host's own route is app-level; this is what
    `get_plan_store` hands it. `get("assistant", conversation_id)` reads the plan the
    `assistant` agent wrote; an owner without a plan store has no plans (`get` returns `None`,
    `put` is rejected).
    """

    def __init__(self, lookup: Callable[[str], PlanStore | None]) -> None:
        self._lookup = lookup

    async def get(self, agent_id: str, conversation_id: str) -> AgentPlan | None:
        store = self._lookup(check_key("agentId", agent_id))
        return None if store is None else await store.get(agent_id, conversation_id)

    async def forget(self, conversation_id: str) -> None:
        raise PlanStoreError("delete a conversation through its endpoint, not every owner's")

    async def put(self, agent_id: str, conversation_id: str, plan: AgentPlan) -> None:
        store = self._lookup(check_key("agentId", agent_id))
        if store is None:
            raise PlanStoreError(f"no plan store is attached for agent {agent_id!r}")
        await store.put(agent_id, conversation_id, plan)


async def _finish_in_thread(work: Callable[..., None], *args: object) -> None:
    """Run `work` in a thread and, even if the caller is cancelled, wait until it is done.

    A cancelled run must not release the document's lock while its write is still in flight:
    the next writer could then land first and be overwritten by the stale plan.
    """
    future = asyncio.ensure_future(asyncio.to_thread(work, *args))
    try:
        await asyncio.shield(future)
    except asyncio.CancelledError:
        if not future.done():
            await asyncio.wait([future])
        if not future.cancelled() and future.exception() is not None:
            log.warning("plan write failed after its run was cancelled", error=future.exception())
        raise


def _atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so a crash leaves the old content or the new, never a mix."""
    fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX, dir=path.parent)
    pending: str | None = temp
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
        pending = None
        _fsync_directory(path.parent)
    finally:
        if pending is not None:
            _unlink(pending)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX keeps it in the directory entry)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _scan(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as entries:
            return list(entries)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
