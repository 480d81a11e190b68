"""`SkillsPrimitive`: skills by convention, with progressive disclosure.

For every endpoint with a workspace (the FILESYSTEM feature) it discovers the agent's skills
(`catalog`), stages them (`route.stage`), lists each one's name, description and path in the
system prompt, and serves them through a read-only `skills/` route of every conversation's
workspace (`route.SkillsView`). Only the list goes into the prompt; the model reads a skill's
`SKILL.md`, and any file beside it, when a task calls for it. `task` sub-agents get the same list
and route (the delegation primitive reads `SKILLS_SERVICE`).

Truth `skills`: `ACTIVE(<count>)` for an endpoint with at least one skill, else Atmosphere's
`CONVENTION`; an endpoint that has skills but no workspace to read them from reports
`INACTIVE(no-filesystem)` and gets nothing (WARN).

It must attach after the filesystem primitive: it wraps the workspace that one provides.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .._contracts import Endpoint, Host, Key, Primitive, Run
from .._errors import FileSystemError
from .._filesystem.base import AgentFileSystem
from .._filesystem.primitive import SURFACE
from .._filesystem.workspace import WorkspaceAgentFileSystem
from .._harness import Harness
from .._log import get_logger
from .._preset import SKILLS
from .._registry import sanitize
from .catalog import Skill, discover, sources_for
from .route import SkillsView, stage

log = get_logger(__name__)

NO_FILESYSTEM = "INACTIVE(no-filesystem)"
STAGING_PREFIX = "atmosphere-skills-"


def active(count: int) -> str:
    return f"ACTIVE({count})"


@dataclass(frozen=True)
class SkillSet:
    """One endpoint's skills, their read-only store and the prompt section that lists them."""

    skills: Mapping[str, Skill]
    store: WorkspaceAgentFileSystem

    def view(self, base: AgentFileSystem) -> SkillsView:
        """`base` with the skills at `skills/`, read-only."""
        return SkillsView(base, self.store)

    def prompt_section(self) -> str:
        lines = [
            "## Skills",
            "",
            "You have skills: folders of instructions (sometimes with scripts, templates or "
            "references) for particular kinds of task. When a task matches a skill's "
            "description, read its SKILL.md with read_file before you start and follow it; "
            "open the other files it mentions (ls, read_file, grep under its folder) only when "
            "you need them. The skills/ folder is read-only.",
            "",
        ]
        for name in sorted(self.skills):
            skill = self.skills[name]
            lines.append(f"- {skill.name}: {skill.description} ({skill.path})")
        return "\n".join(lines)

    def describe(self) -> list[dict[str, object]]:
        return [self.skills[name].describe() for name in sorted(self.skills)]


SKILLS_SERVICE: Key[SkillSet] = Key("skills")
"""An endpoint's `SkillSet` (`endpoint.services`): delegation and the console read it."""


def with_skills(system_prompt: str, skills: SkillSet) -> str:
    return f"{system_prompt.rstrip()}\n\n{skills.prompt_section()}"


class SkillsPrimitive(Primitive):
    name = "skills"

    def __init__(self) -> None:
        self.staging: Path | None = None

    async def start(self, host: Host) -> None:
        self.staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX))

    async def stop(self, host: Host) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None

    def attach(self, endpoint: Endpoint, host: Host) -> None:
        spec = endpoint.spec
        if spec is None:
            return
        app_wide = host.settings.groups.skills.dirs
        sources = sources_for(spec.cls, spec.skill_sources, app_wide)
        if not sources:
            return
        skills = discover(sources)
        if not skills:
            return
        provider = endpoint.services.get(SURFACE)
        if not endpoint.has(Harness.FILESYSTEM) or provider is None:
            log.warning(
                "this endpoint has skills but no workspace to read them from; enable the "
                "FILESYSTEM feature to use them",
                endpoint=endpoint.path,
                skills=sorted(skills),
            )
            endpoint.report(SKILLS, NO_FILESYSTEM)
            return
        if self.staging is None:
            self.staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX))
        limits = host.settings.groups.filesystem.limits
        root = stage(skills, self.staging / sanitize(endpoint.path), limits)
        skill_set = SkillSet(skills, WorkspaceAgentFileSystem(root, limits))
        endpoint.services.set(SKILLS_SERVICE, skill_set)

        def scoped(run: Run) -> AgentFileSystem | None:
            try:
                base = provider.for_conversation(run.conversation_id)
            except FileSystemError as exc:
                log.warning("no filesystem for this conversation", error=str(exc))
                return None
            return skill_set.view(base)

        endpoint.provide(AgentFileSystem, scoped)
        endpoint.system_prompt = with_skills(endpoint.system_prompt, skill_set)
        endpoint.report(SKILLS, active(len(skills)))
        log.info(
            "skills attached",
            endpoint=endpoint.path,
            skills={name: skill.source for name, skill in sorted(skills.items())},
        )
