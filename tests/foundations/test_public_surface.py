"""The package's public face: importing it does no work, and every exported name resolves.

`import atmosphere_harness` loads only the decorators; the web layer (and FastAPI), the provider
SDKs, MCP, the backends and YAML load when a name that needs them is first used. Each check runs
in a fresh interpreter, where nothing else has imported them already.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import atmosphere_harness

PACKAGE = Path(atmosphere_harness.__file__).parent
ROOT = PACKAGE.parent
DOCS = ROOT / "docs"

OPTIONAL = (
    "fastapi",
    "starlette",
    "sse_starlette",
    "ag_ui",
    "uvicorn",
    "openai",
    "anthropic",
    "mcp",
    "redis",
    "psycopg",
    "asyncpg",
    "opentelemetry",
    "yaml",
)
"""What a bare `import atmosphere_harness` must not load (top-level module names)."""


def fresh(script: str, **env: str) -> Any:
    """Run `script` in a new interpreter; it prints one JSON value, returned here."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ATMOSPHERE_", "LLM_"))
    }
    environment.update(env)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_package_loads_no_web_layer_and_no_optional_sdk() -> None:
    loaded = fresh(
        """
        import json, sys
        import atmosphere_harness
        print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
        """
    )
    assert [name for name in OPTIONAL if name in loaded] == []


def test_the_decorators_declare_a_class_without_loading_the_web_layer() -> None:
    loaded = fresh(
        """
        import json, sys
        from atmosphere_harness import agent, prompt

        @agent(name="assistant")
        class Assistant:
            @prompt
            async def chat(self, message: str) -> str:
                return message

        print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
        """
    )
    assert [
        name for name in ("fastapi", "starlette", "openai", "anthropic") if name in loaded
    ] == []


def test_every_exported_name_resolves_in_a_fresh_interpreter() -> None:
    missing = fresh(
        """
        import json
        import atmosphere_harness

        missing = []
        for name in atmosphere_harness.__all__:
            try:
                getattr(atmosphere_harness, name)
            except AttributeError as exc:
                missing.append(f"{name}: {exc}")
        print(json.dumps(missing))
        """
    )
    assert missing == []


def test_harness_router_reads_no_settings_when_it_is_made() -> None:
    """A configuration file that does not exist fails start-up, never the import."""
    routes = fresh(
        """
        import json
        from atmosphere_harness import harness_router

        print(json.dumps(len(harness_router.routes)))
        """,
        ATMOSPHERE_CONFIG_FILE=str(ROOT / "no-such-file.yml"),
    )
    assert routes > 0


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchName"):
        atmosphere_harness.NoSuchName  # type: ignore[attr-defined]  # noqa: B018


def _type_checking_names() -> set[str]:
    """The names the package's `if TYPE_CHECKING:` block imports (what type checkers see)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for statement in ast.walk(node):
                if isinstance(statement, ast.ImportFrom):
                    names.update(alias.asname or alias.name for alias in statement.names)
    return names


def test_what_type_checkers_see_is_what_loads_on_first_use() -> None:
    lazy: dict[str, str] = atmosphere_harness._LAZY
    eager = {"Harness", "__version__", "agent", "ai_endpoint", "coordinator", "prompt", "skill"}
    assert _type_checking_names() == set(lazy)
    assert sorted(set(lazy) | eager) == sorted(atmosphere_harness.__all__)
    assert len(atmosphere_harness.__all__) == len(set(atmosphere_harness.__all__))


def _code_in(text: str) -> str:
    """Every fenced block and code span of a Markdown page, one after the other."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    spans = re.findall(r"`([^`\n]+(?:\n[^`\n]+)?)`", prose)  # a span may wrap once
    return "\n".join(blocks + spans)


def test_every_exported_name_is_documented() -> None:
    """A user finds each name the package exports on a docs page, in code or a code span."""
    code = "\n".join(_code_in(page.read_text(encoding="utf-8")) for page in DOCS.glob("*.md"))
    missing = [
        name
        for name in atmosphere_harness.__all__
        if not re.search(rf"(?:(?<![\w.])|(?<=atmosphere_harness\.)){re.escape(name)}(?!\w)", code)
    ]
    assert missing == []
