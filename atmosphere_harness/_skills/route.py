"""The read-only `skills/` route of a conversation's workspace.

At start-up each endpoint's skills are copied (bounded: regular files only, no symlinks, the
workspace's per-file, file-count and total-size limits) into a private staging directory laid out
as `skills/<name>/...`, and served by an ordinary `WorkspaceAgentFileSystem` over it: `ls`,
`read_file` (with its line windows), `glob` and `grep` behave exactly as they do everywhere else
in the workspace, containment and bounds included. A copy, rather than the live folders, means a
skill cannot change under a running conversation and a skill folder's symlinks can never reach
outside it; skills are read again when the app restarts.

`SkillsView` puts that store at `skills/` in front of the conversation's own workspace (through
`CompositeAgentFileSystem`) and rejects every write, edit, delete and rename that touches
`skills/`, with a message the model can act on.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._errors import FileSystemError
from .._filesystem.base import AgentFileSystem, FileInfo, GrepHit
from .._filesystem.composite import CompositeAgentFileSystem
from .._filesystem.paths import check_path, is_under
from .._filesystem.workspace import WorkspaceAgentFileSystem
from .._limits import FileSystemLimits
from .._log import get_logger
from .catalog import CONVENTION_DIR, Skill

log = get_logger(__name__)

PREFIX = CONVENTION_DIR
READ_ONLY = (
    "skills/ is read-only: skills are shared instructions and cannot be changed from a "
    "conversation. To work on a copy, read the file and write it elsewhere in your workspace "
    "(e.g. notes/{name})."
)


def read_only_error(path: str) -> FileSystemError:
    name = path.rsplit("/", 1)[-1] or "copy.md"
    return FileSystemError(f"Cannot change {path}: " + READ_ONLY.format(name=name))


def _under_skills(path: object) -> bool:
    try:
        return is_under(check_path(path), PREFIX)
    except FileSystemError:
        return False


def stage(skills: Mapping[str, Skill], root: Path, limits: FileSystemLimits) -> Path:
    """Copy `skills` into `root/skills/<name>/`; returns `root`. Bounded by `limits`."""
    budget_files = limits.max_files
    budget_bytes = limits.max_total_bytes
    for name in sorted(skills):
        skill = skills[name]
        target = root / PREFIX / name
        target.mkdir(parents=True, exist_ok=True)
        for directory, subdirs, files in os.walk(skill.folder, followlinks=False):
            subdirs[:] = sorted(
                sub for sub in subdirs if not os.path.islink(os.path.join(directory, sub))
            )
            relative = os.path.relpath(directory, skill.folder)
            for file in sorted(files):
                source = os.path.join(directory, file)
                if os.path.islink(source) or not os.path.isfile(source):
                    log.warning("skill file skipped: a symlink or not a regular file", file=source)
                    continue
                size = os.path.getsize(source)
                if size > limits.max_file_bytes:
                    log.warning(
                        "skill file skipped: too large",
                        file=source,
                        size=size,
                        limit=limits.max_file_bytes,
                    )
                    continue
                if budget_files <= 0 or size > budget_bytes:
                    log.warning(
                        "skill file skipped: the skills of this agent are over the workspace "
                        "bounds (files or total bytes)",
                        file=source,
                    )
                    continue
                destination = target / relative / file if relative != "." else target / file
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, destination)
                budget_files -= 1
                budget_bytes -= size
    return root


class SkillsView:
    """A conversation's workspace with the read-only skills store at `skills/`.

    Everything outside `skills/` goes to the conversation's own store unchanged.
    """

    def __init__(self, base: AgentFileSystem, skills: WorkspaceAgentFileSystem) -> None:
        self.base = base
        self.skills = skills
        self._composite = CompositeAgentFileSystem(base, {PREFIX + "/": skills})
        self.max_grep_hits = self._composite.max_grep_hits

    def __repr__(self) -> str:
        return f"SkillsView({self.base!r})"

    @staticmethod
    def _guard(*paths: object) -> None:
        for path in paths:
            try:
                rel = check_path(path)
            except FileSystemError:
                continue  # the store itself reports a malformed path
            if is_under(rel, PREFIX):
                raise read_only_error(rel)

    async def ls(self, dir: str | None = None) -> list[FileInfo]:
        return await self._composite.ls(dir)

    async def read(self, path: str) -> str:
        return await self._composite.read(path)

    async def glob(self, pattern: str) -> list[str]:
        return await self._composite.glob(pattern)

    async def grep(self, pattern: str, dir: str | None = None) -> list[GrepHit]:
        return await self._composite.grep(pattern, dir)

    async def prefetch(self, paths: Sequence[str]) -> int:
        """`read_file`'s prefetch, for the paths outside `skills/` (see
        `WorkspaceAgentFileSystem.prefetch`); a base store that cannot prefetch reads none."""
        prefetch = getattr(self.base, "prefetch", None)
        if prefetch is None:
            return 0
        own = [path for path in paths if not _under_skills(path)]
        count: int = await prefetch(own) if own else 0
        return count

    def drop_prefetched(self) -> None:
        drop = getattr(self.base, "drop_prefetched", None)
        if drop is not None:
            drop()

    async def write(self, path: str, content: str) -> None:
        self._guard(path)
        await self.base.write(path, content)

    async def edit(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        self._guard(path)
        return await self.base.edit(path, old_text, new_text, replace_all=replace_all)

    async def delete(self, path: str) -> None:
        self._guard(path)
        await self.base.delete(path)

    async def rename(self, old_path: str, new_path: str) -> None:
        self._guard(old_path, new_path)
        await self.base.rename(old_path, new_path)
