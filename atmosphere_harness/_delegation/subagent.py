"""The `task` tool: an ephemeral, isolated general-purpose sub-agent, bounded and governed.

One call, in order (the messages are Atmosphere's Java harness's, word for word):

1. a blank description, or a `subagent_type` other than `general-purpose`, is refused;
2. the bounds: nesting depth (from the parent chain) and spawns per request (counted on the
   top-level run, so it resets with every prompt and includes nested spawns);
3. governance pre-admission of the description (`subagent.spawn` metadata), fail-closed; a
   `Transform` is honoured: the transformed description is what the sub-agent receives;
4. the spawn: a fresh conversation id, its own plan store and bounded workspace under a
   per-spawn temp root, the coordinator's runtime, `write_todos` + the eight file tools (+ `task`
   while under the depth bound), the parent's governance and approval gate, and the parent's
   skills (listed in its prompt, read-only at `skills/` of its workspace);
5. the run, bounded by `subagent_timeout`; only its final report comes back as the result;
6. the files it wrote are copied into the parent conversation's workspace, under
   `subagents/<agentId>/` (best effort, bounded), so they can still be read once the temp root
   is gone: by a person in the console or the admin API, and by the parent's file tools.

The parent's stream gets `subagent-start` and `subagent-end` (status `completed`, `failed`,
`timeout`, `denied` or `cancelled`, and `files` naming the kept folder), and the sub-agent's
`plan-update` and `approval-required` frames tagged with its `subagentId`; nothing else of the
sub-agent leaks. The temp root is
removed on every exit path, the parent's cancellation included.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _events as events
from .._contracts import Key
from .._errors import FileSystemError
from .._events import Frame
from .._filesystem.base import AgentFileSystem
from .._filesystem.offload import ToolOutputOffload
from .._filesystem.tools import bound_file_system, file_tools
from .._filesystem.workspace import WorkspaceAgentFileSystem
from .._governance.chain import PolicyChain
from .._governance.gate import policy_context
from .._governance.policy import PolicyPhase, PolicyRequest
from .._harness import Harness
from .._log import get_logger
from .._planning.store import FilePlanStore, PlanStore
from .._planning.tools import STORE_SERVICE, write_todos_tool
from .._settings import HarnessSettings
from .._skills.primitive import SKILLS_SERVICE, with_skills
from .._tools.base import Tool, ToolContext
from .fleet import forward

if TYPE_CHECKING:
    from .._contracts import Endpoint, Run, Stream

log = get_logger(__name__)

TOOL_NAME = "task"
GENERAL_PURPOSE = "general-purpose"
TEMP_PREFIX = "atmosphere-subagent-"
CLEANUP_GRACE = 5.0
"""Seconds the tool's own deadline leaves after `subagent_timeout`, so the sub-agent's timeout
message (not the generic `tool_timeout`) is what the model gets."""

KEPT_DIR = "subagents"
"""Where a sub-agent's files are kept in its parent conversation's workspace."""
KEEP_MAX_FILES = 200
KEEP_SECONDS = 2.0
"""Bounds of that copy: it runs inside the tool's `CLEANUP_GRACE` after a timeout."""

DEPTH: Key[int] = Key("delegation.depth")
"""`run.state` key of a sub-agent run: how deep it is nested (1 for a direct spawn)."""
SPAWNS: Key[int] = Key("delegation.spawns")
"""`run.state` key of the top-level run: spawns made during this request."""

SYSTEM_PROMPT = (
    "You are a focused general-purpose subagent working in an isolated workspace. Complete the "
    "single task you are given end to end, using your planning and file tools as needed, then "
    "reply with a concise final report of what you found or produced. You cannot ask follow-up "
    "questions — make reasonable assumptions and finish."
)

DESCRIPTION = (
    "Spawn an ephemeral general-purpose subagent with its own isolated context and workspace "
    "to complete one focused subtask end to end; only its final report comes back to you. "
    "Launch independent subtasks in the same message to run them in parallel. For a named "
    "specialist of your fleet, use delegate_task instead."
)

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "description": {
            "type": "string",
            "description": "The focused subtask, written as a complete standalone instruction "
            "— the subagent cannot ask follow-up questions.",
        },
        "subagent_type": {
            "type": "string",
            "description": f"Only '{GENERAL_PURPOSE}' is supported (the default).",
        },
    },
    "required": ["description"],
    "additionalProperties": False,
}

REQUIRED = "task failed: 'description' is required."
NO_OUTPUT = "task completed with no output."


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def unknown_type(kind: str) -> str:
    return (
        f"task failed: unknown subagent_type '{kind}'. Only '{GENERAL_PURPOSE}' is supported — "
        "use delegate_task for a named fleet specialist."
    )


def depth_refused(max_depth: int) -> str:
    return (
        f"task refused: maximum subagent nesting depth ({max_depth}) reached — complete this "
        "step inline instead of spawning again."
    )


def spawns_refused(max_spawns: int) -> str:
    return f"task refused: maximum subagent spawns ({max_spawns}) for this request reached."


def timed_out(seconds: float) -> str:
    return f"task did not complete within {_seconds(seconds)} seconds."


def depth_of(run: Run) -> int:
    depth = run.state.get(DEPTH, 0)
    return depth if isinstance(depth, int) else 0


def task_tool(settings: HarnessSettings, chain: PolicyChain) -> Tool:
    """The built-in `task` tool, bounded by `settings`, governed by `chain` (read per call)."""
    spawner = _Spawner(settings, chain)
    return Tool(
        name=TOOL_NAME,
        description=DESCRIPTION,
        parameters=PARAMETERS,
        handler=spawner,
        concurrent=True,
        timeout=settings.groups.delegation.timeout + CLEANUP_GRACE,
        origin="delegation",
    )


class _Spawner:
    def __init__(self, settings: HarnessSettings, chain: PolicyChain) -> None:
        self.settings = settings
        self.chain = chain

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        run = context.run
        description = arguments.get("description")
        text = description if isinstance(description, str) else ""
        if not text.strip():
            return REQUIRED
        kind = str(arguments.get("subagent_type") or "").strip() or GENERAL_PURPOSE
        if kind.lower() != GENERAL_PURPOSE:
            return unknown_type(kind)
        settings = self.settings
        depth = depth_of(run)
        if depth >= settings.groups.delegation.max_depth:
            return depth_refused(settings.groups.delegation.max_depth)
        root_state = run.root.state
        spawned = root_state.get(SPAWNS, 0)
        if spawned >= settings.groups.delegation.max_spawns:
            return spawns_refused(settings.groups.delegation.max_spawns)
        # Reserved before the first await, so a parallel batch cannot overshoot the bound.
        root_state.set(SPAWNS, spawned + 1)

        conversation_id = str(uuid.uuid4())
        agent_id = "subagent-" + conversation_id[:8]
        await _emit(
            run.session,
            events.SUBAGENT_START,
            {"subagentId": conversation_id, "agentId": agent_id, "description": text},
        )
        if self.chain:
            request = PolicyRequest(text, {"subagent.spawn": GENERAL_PURPOSE})
            verdict = await self.chain.admit(
                policy_context(run, PolicyPhase.PRE_ADMISSION, request)
            )
            if not verdict.admitted:
                root_state.set(SPAWNS, root_state.get(SPAWNS, 1) - 1)
                reason = (
                    f"policy '{verdict.denied_by}' evaluation failed"
                    if verdict.failure is not None
                    else verdict.reason
                )
                await _end(run.session, conversation_id, "denied", error=reason)
                return f"task denied by policy: {reason}"
            text = verdict.request.message
        return await self._run(run, text, conversation_id, agent_id, depth + 1)

    async def _run(
        self, run: Run, description: str, conversation_id: str, agent_id: str, depth: int
    ) -> str:
        settings = self.settings
        try:
            root = Path(
                tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=settings.groups.delegation.workspace_dir)
            )
        except OSError as exc:
            error = f"could not create an isolated workspace: {exc}"
            await _end(run.session, conversation_id, "failed", error=error)
            return f"task failed: {error}"
        child: Run | None = None
        workspace = WorkspaceAgentFileSystem(
            root / "files", settings.groups.filesystem.limits, private=True
        )
        try:
            endpoint = subagent_endpoint(
                run.endpoint,
                settings,
                root,
                agent_id,
                task=self._nested_task(depth),
                workspace=workspace,
            )
            child = run.child(
                endpoint,
                conversation_id=conversation_id,
                sink=_Forward(run.session, conversation_id),
            )
            child.state.set(DEPTH, depth)
            deadline = asyncio.timeout(settings.groups.delegation.timeout)
            try:
                async with deadline:
                    report = (await child.session.stream(description)).strip()
            except TimeoutError:
                if not deadline.expired():
                    raise
                message = timed_out(settings.groups.delegation.timeout)
                kept = await keep_files(run, workspace, agent_id)
                await _end(
                    run.session, conversation_id, "timeout", error=message, run=child, files=kept
                )
                return message
            result = report or NO_OUTPUT
            kept = await keep_files(run, workspace, agent_id)
            await _end(
                run.session, conversation_id, "completed", report=result, run=child, files=kept
            )
            return result
        except asyncio.CancelledError:
            await _end(run.session, conversation_id, "cancelled", run=child)
            raise
        except Exception as exc:
            log.warning("sub-agent failed", subagent=agent_id, error=str(exc), exc_info=True)
            error = str(exc) or "unknown error"
            kept = await keep_files(run, workspace, agent_id)
            await _end(run.session, conversation_id, "failed", error=error, run=child, files=kept)
            return f"task failed: {error}"
        finally:
            # Synchronous on purpose: the workspace is bounded (a few MiB at most) and this must
            # finish even while the parent run is being cancelled.
            shutil.rmtree(root, ignore_errors=True)

    def _nested_task(self, depth: int) -> Tool | None:
        if depth >= self.settings.groups.delegation.max_depth:
            return None
        return task_tool(self.settings, self.chain)


def subagent_endpoint(
    parent: Endpoint,
    settings: HarnessSettings,
    root: Path,
    agent_id: str,
    *,
    task: Tool | None = None,
    workspace: AgentFileSystem | None = None,
) -> Endpoint:
    """The sub-agent's own endpoint: the parent's runtime and governance, its own plan store and
    workspace under `root` (`workspace`, when the caller keeps a handle on it), and only the plan
    and file tools (+ `task` when given)."""
    threshold = settings.groups.filesystem.offload_threshold
    tools: list[Tool] = [
        write_todos_tool(),
        *file_tools(
            read_budget=threshold, max_grep_hits=settings.groups.filesystem.limits.max_grep_hits
        ),
    ]
    if task is not None:
        tools.append(task)
    skills = parent.services.get(SKILLS_SERVICE)
    endpoint = parent.derive(
        agent_id=agent_id,
        system_prompt=with_skills(SYSTEM_PROMPT, skills) if skills else SYSTEM_PROMPT,
        root=root,
        features=frozenset({Harness.PLANNING, Harness.FILESYSTEM}),
        tools=tools,
    )
    plans: PlanStore = FilePlanStore(root)
    files: AgentFileSystem = workspace or WorkspaceAgentFileSystem(
        root / "files", settings.groups.filesystem.limits, private=True
    )
    if skills is not None:
        # The coordinator's skills, at the same read-only `skills/` route of its own workspace.
        files = skills.view(files)
        endpoint.services.set(SKILLS_SERVICE, skills)
    endpoint.services.set(STORE_SERVICE, plans)
    endpoint.provide(PlanStore, lambda run: plans)
    endpoint.provide(AgentFileSystem, lambda run: files)
    endpoint.admission_hooks.extend(parent.admission_hooks)
    endpoint.approval_hook = parent.approval_hook
    if threshold > 0:
        endpoint.result_hooks.append(ToolOutputOffload(threshold))
    endpoint.result_hooks.extend(
        hook for hook in parent.result_hooks if not isinstance(hook, ToolOutputOffload)
    )
    return endpoint


class _Forward:
    """The sub-agent's sink: plan updates, approvals and nested spawns reach the parent tagged."""

    _ALSO = frozenset({events.PLAN_UPDATE})

    def __init__(self, parent: Stream, subagent_id: str) -> None:
        self._parent = parent
        self._subagent_id = subagent_id

    async def __call__(self, frame: Frame) -> None:
        if frame.event in (events.SUBAGENT_START, events.SUBAGENT_END):
            tags = {"parentSubagentId": self._subagent_id}
        else:
            tags = {"subagentId": self._subagent_id}
        await forward(self._parent, frame, tags, also=self._ALSO)


async def _end(
    session: Stream,
    subagent_id: str,
    status: str,
    *,
    report: str | None = None,
    error: str | None = None,
    run: Run | None = None,
    files: str | None = None,
) -> None:
    data: dict[str, Any] = {"subagentId": subagent_id, "status": status}
    if report is not None:
        data["report"] = report
    if error is not None:
        data["error"] = error
    if run is not None:
        data["usage"] = run.usage.to_wire()
    if files is not None:
        data["files"] = files
    await _emit(session, events.SUBAGENT_END, data)


async def keep_files(parent: Run, workspace: AgentFileSystem, agent_id: str) -> str | None:
    """Copy the sub-agent's files into the parent conversation's workspace, at
    `subagents/<agentId>/`, before its temp root is removed: a report it saved would otherwise be
    gone. Best effort and bounded (`KEEP_MAX_FILES`, `KEEP_SECONDS`, the parent's own store
    limits); the folder's path, or None when the parent has no filesystem or nothing was kept.
    The files are listed from the sub-agent's (private) store's own count when it can answer
    (`known_files`: no walk, no worker thread), else by `glob`."""
    target_fs = bound_file_system(parent)
    if target_fs is None:
        return None
    target = f"{KEPT_DIR}/{agent_id}"
    kept = 0
    try:
        async with asyncio.timeout(KEEP_SECONDS):
            listed = (
                workspace.known_files() if isinstance(workspace, WorkspaceAgentFileSystem) else None
            )
            paths = listed if listed is not None else await workspace.glob("**")
            for path in paths[:KEEP_MAX_FILES]:
                try:
                    content = await workspace.read(path)
                except FileSystemError:  # not text, or too large to read: skipped
                    continue
                await target_fs.write(f"{target}/{path}", content)
                kept += 1
    except Exception as exc:  # a store bound, the disk, the deadline: the run goes on
        log.warning("could not keep a sub-agent's files", subagent=agent_id, error=str(exc))
    return target if kept else None


async def _emit(session: Stream, event: str, data: Mapping[str, Any]) -> None:
    """Progress frames are best effort: a failing stream must not change the tool's result."""
    try:
        await session.emit(event, data)
    except Exception:
        log.debug("could not stream sub-agent progress", event=event, exc_info=True)
