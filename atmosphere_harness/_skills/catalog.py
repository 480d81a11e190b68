"""Skill discovery: `SKILL.md` folders from three sources, parsed and checked, later wins.

A skill is a folder holding `SKILL.md`, whose YAML front matter carries `name` and `description`
(optional `allowed-tools`, `metadata`): the Agent Skills format deepagents and Claude use. The
front matter is parsed with PyYAML's safe loader, never by hand. A file that is unreadable,
oversized, not UTF-8, without front matter, or whose name or description is missing or too long
is skipped with a WARN naming it, so one bad skill never stops the app.

Sources, weakest first (DESIGN 8.5): the `skills/` folder beside the agent's module, then the
decorator's `skills=` folders, then `ATMOSPHERE_AI_SKILLS_DIRS`; a later source replaces an earlier
skill of the same name. Each source is a folder of skill folders (a folder that itself holds
`SKILL.md` is taken as one skill).
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .._errors import SkillSourceError
from .._log import get_logger

log = get_logger(__name__)

SKILL_FILE = "SKILL.md"
CONVENTION_DIR = "skills"
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_SKILL_FILE_BYTES = 256 * 1024
"""A `SKILL.md` larger than this is skipped: it is meant to be read whole by the model."""
MAX_SKILLS_PER_SOURCE = 512
"""Skill folders one source may hold; the rest are skipped with a WARN."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)^---[ \t]*\r?$", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Skill:
    """One discovered skill: its front matter and the folder it came from."""

    name: str
    description: str
    folder: Path
    source: str
    """Which source gave it: `convention`, `decorator` or `settings`."""
    allowed_tools: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """Where the model reads it in its workspace."""
        return f"{CONVENTION_DIR}/{self.name}/{SKILL_FILE}"

    def describe(self) -> dict[str, Any]:
        """The console's view of the skill (no host paths)."""
        return {"name": self.name, "description": self.description, "path": self.path}


def parse_skill(folder: Path, source: str) -> Skill | None:
    """The skill in `folder`, or `None` (with a WARN naming the file) when it is unusable."""
    file = folder / SKILL_FILE
    try:
        size = file.stat().st_size
        if size > MAX_SKILL_FILE_BYTES:
            return _skip(file, f"it is {size} bytes (limit {MAX_SKILL_FILE_BYTES})")
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return _skip(file, "it is not UTF-8 text")
    except OSError as exc:
        return _skip(file, f"it cannot be read ({exc.strerror or exc})")
    match = _FRONT_MATTER.match(text.lstrip("\ufeff"))
    if match is None:
        return _skip(file, "it has no YAML front matter between '---' lines")
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        return _skip(file, f"its front matter is not valid YAML ({_first_line(exc)})")
    if not isinstance(data, dict):
        return _skip(file, "its front matter is not a mapping of keys to values")
    name = data.get("name")
    description = data.get("description")
    if not isinstance(name, str) or not name.strip():
        return _skip(file, "its front matter has no 'name'")
    name = name.strip()
    if len(name) > MAX_NAME_CHARS:
        return _skip(file, f"its name is {len(name)} characters (limit {MAX_NAME_CHARS})")
    if not _NAME.match(name):
        return _skip(file, f"its name {name!r} is not letters, digits, '.', '_' or '-'")
    if not isinstance(description, str) or not description.strip():
        return _skip(file, "its front matter has no 'description'")
    description = " ".join(description.split())
    if len(description) > MAX_DESCRIPTION_CHARS:
        return _skip(
            file,
            f"its description is {len(description)} characters (limit {MAX_DESCRIPTION_CHARS})",
        )
    allowed = data.get("allowed-tools", ())
    if isinstance(allowed, str):
        allowed = allowed.split()
    metadata = data.get("metadata")
    return Skill(
        name=name,
        description=description,
        folder=folder,
        source=source,
        allowed_tools=tuple(str(item) for item in allowed) if isinstance(allowed, list) else (),
        metadata=dict(metadata) if isinstance(metadata, dict) else {},
    )


def skills_in(directory: Path, source: str) -> list[Skill]:
    """Every usable skill in `directory` (a folder of skill folders, or one skill folder)."""
    if (directory / SKILL_FILE).is_file():
        found = parse_skill(directory, source)
        return [found] if found is not None else []
    try:
        folders = sorted(entry for entry in directory.iterdir() if entry.is_dir())
    except OSError as exc:
        log.warning("skill folder cannot be listed", folder=str(directory), error=str(exc))
        return []
    if len(folders) > MAX_SKILLS_PER_SOURCE:
        log.warning(
            "too many skill folders; the rest are skipped",
            folder=str(directory),
            limit=MAX_SKILLS_PER_SOURCE,
        )
        folders = folders[:MAX_SKILLS_PER_SOURCE]
    skills: list[Skill] = []
    for folder in folders:
        if not (folder / SKILL_FILE).is_file():
            continue
        found = parse_skill(folder, source)
        if found is not None:
            skills.append(found)
    return skills


def discover(sources: Iterable[tuple[str, Path]]) -> dict[str, Skill]:
    """Skills by name from `(source label, folder)` pairs, weakest first: later ones win."""
    skills: dict[str, Skill] = {}
    for label, directory in sources:
        seen: set[str] = set()
        for found in skills_in(directory, label):
            if found.name in seen:
                log.warning(
                    "two skills in one folder share a name; the later one is used",
                    skill=found.name,
                    file=str(found.folder / SKILL_FILE),
                )
            seen.add(found.name)
            previous = skills.get(found.name)
            if previous is not None and previous.folder != found.folder:
                log.info(
                    "skill overridden by a later source",
                    skill=found.name,
                    replaced=str(previous.folder),
                    by=str(found.folder),
                )
            skills[found.name] = found
    return skills


def sources_for(
    cls: type | None, declared: Sequence[str], app_wide: Sequence[Path]
) -> list[tuple[str, Path]]:
    """The folders to search for one agent class, weakest first.

    The convention folder is optional; a declared folder (decorator or setting) that does not
    exist is a configuration mistake and raises `SkillSourceError` naming it.
    """
    module_dir = _module_dir(cls)
    sources: list[tuple[str, Path]] = []
    if module_dir is not None and (module_dir / CONVENTION_DIR).is_dir():
        sources.append(("convention", module_dir / CONVENTION_DIR))
    owner = cls.__name__ if cls is not None else "the agent"
    for entry in declared:
        sources.append(("decorator", _declared(entry, module_dir, f"{owner}: skills=")))
    for folder in app_wide:
        sources.append(("settings", _declared(str(folder), None, "ATMOSPHERE_AI_SKILLS_DIRS")))
    return sources


def _declared(entry: str, module_dir: Path | None, where: str) -> Path:
    """A declared folder: absolute, else relative to the agent's module, then to the cwd."""
    raw = Path(os.path.expanduser(entry))
    candidates = [raw] if raw.is_absolute() else []
    if not raw.is_absolute():
        if module_dir is not None:
            candidates.append(module_dir / raw)
        candidates.append(Path.cwd() / raw)
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    tried = ", ".join(str(candidate) for candidate in candidates)
    raise SkillSourceError(f"{where} names a skill folder that does not exist: {entry} ({tried})")


def _module_dir(cls: type | None) -> Path | None:
    if cls is None:
        return None
    try:
        source = inspect.getsourcefile(cls)
    except (TypeError, OSError):  # a builtin, or a class defined in `python -c` code
        return None
    return Path(source).resolve().parent if source else None


def _skip(file: Path, why: str) -> Skill | None:
    """WARN naming the file; `None`, so a parser can `return _skip(...)`."""
    log.warning(f"skill skipped: {file} — {why}", file=str(file))
    return None


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
