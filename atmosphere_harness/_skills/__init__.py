"""Skills by convention (DESIGN 8.3): `SKILL.md` folders discovered beside the agent, on the
decorator and app-wide, listed in the system prompt and read on demand from a read-only
`skills/` route of the workspace.

- `catalog`: discovery and the `SKILL.md` front matter;
- `route`: the staged copy and the read-only view of the workspace;
- `primitive`: `SkillsPrimitive`, the attach engine.
"""

from .._errors import SkillSourceError
from .catalog import Skill, discover, parse_skill
from .primitive import SKILLS_SERVICE, SkillSet, SkillsPrimitive

__all__ = [
    "SKILLS_SERVICE",
    "Skill",
    "SkillSet",
    "SkillSourceError",
    "SkillsPrimitive",
    "discover",
    "parse_skill",
]
