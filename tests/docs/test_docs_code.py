"""Every Python example in docs/ and README.md runs as written.

Each ```python (or ```py) block is one of:

- a complete app (it defines `app`): saved as the file its page names (`app.py` unless the block
  says `uvicorn team_app:app` or has `title="..."`), served by `python -m uvicorn <module>:app`
  in its own process on loopback with no model configured, exactly as a reader would; then
  `GET /api/console/info` must answer and, when the app hosts a prompt endpoint, one prompt to the
  first must stream to a `complete` frame; the server must stop cleanly on SIGTERM;
- a test (it defines `test_...` functions): executed, then each test function is called;
- a script (anything else complete): executed;
- a fragment, marked by the HTML comment `<!-- fragment -->` on the last non-blank line before
  its fence (leave a blank line between them, so Markdown keeps the code block): it uses names
  the page defined around it, and is compiled.

A block that needs a provider SDK the environment lacks (the `openai` or `anthropic` extra) is
skipped with the `pip install` line the library gives; the `dev` extra has both, so they run in
`make test`.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import signal
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from atmosphere_harness._registry import DEFAULT_REGISTRY
from tests.runtime_support import PROVIDER_CREDENTIAL_ENV
from tests.support import parse_sse

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRAGMENT = "<!-- fragment -->"

_BLOCK = re.compile(r"^```(?:python|py)\b([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_TITLE = re.compile(r'title="(?P<name>[\w-]+)\.py"')
_RUN_WITH = re.compile(r"\buvicorn (?P<name>[\w-]+):app\b")
_STARTED = re.compile(r"Uvicorn running on (http://127\.0\.0\.1:\d+)")
LOOPBACK = ("--host", "127.0.0.1", "--port", "0")
_EXTRA = re.compile(r"pip install '[^']*\[(?:openai|anthropic)\]'")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    info: str
    code: str
    fragment: bool

    @property
    def label(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def module(self) -> str:
        found = _TITLE.search(self.info) or _RUN_WITH.search(self.code)
        return found.group("name") if found else "app"


def _blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            blocks.append(
                Block(page, line, match.group(1), match.group(2), fragment=before == FRAGMENT)
            )
    return blocks


BLOCKS = _blocks()


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^{name}\s*[:=]", code, re.MULTILINE) is not None


def _environment(tmp_path: Path) -> dict[str, str]:
    """A reader's shell: no harness or provider settings, a home and a temp dir of its own."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.upper().startswith(("ATMOSPHERE_", "LLM_"))
        and name not in PROVIDER_CREDENTIAL_ENV
    }
    for name in ("home", "tmp", "workspace"):
        (tmp_path / name).mkdir(exist_ok=True)
    env.update(
        HOME=str(tmp_path / "home"),
        TMPDIR=str(tmp_path / "tmp"),
        ATMOSPHERE_WORKSPACE_ROOT=str(tmp_path / "workspace"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    return env


def test_the_docs_have_examples_of_every_kind() -> None:
    complete = [block for block in BLOCKS if not block.fragment]
    assert any(_defines(block.code, "app") for block in complete)
    assert any(re.search(r"^(?:async )?def test_", block.code, re.MULTILINE) for block in complete)
    assert any(block.fragment for block in BLOCKS)
    assert len(complete) > 2 * (len(BLOCKS) - len(complete)), "most examples are complete"


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: block.label)
async def test_the_example_runs_as_written(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if block.fragment:
        compile(block.code, block.label, "exec")
        return
    if _defines(block.code, "app"):
        await _serve_the_app(block, tmp_path)
        return
    await _run_the_script(block, tmp_path, monkeypatch)


async def _run_the_script(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = _environment(tmp_path)
    for name in list(os.environ):
        if name not in reader:
            monkeypatch.delenv(name)
    for name, value in reader.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    # The classes the block declares leave the package's registry with the test.
    monkeypatch.setattr(DEFAULT_REGISTRY, "_specs", dict(DEFAULT_REGISTRY._specs))
    path = tmp_path / f"{block.module}.py"
    path.write_text(block.code, encoding="utf-8")
    module = types.ModuleType(f"docs_example_{block.line}")
    module.__file__ = str(path)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    try:
        exec(compile(block.code, str(path), "exec"), module.__dict__)
    except ImportError as error:
        if _EXTRA.search(str(error)):
            pytest.skip(f"{block.label}: {error}")
        raise
    for name, test in sorted(vars(module).items()):
        if name.startswith("test_") and callable(test):
            result = test()
            if inspect.isawaitable(result):
                await result


async def _serve_the_app(block: Block, tmp_path: Path) -> None:
    (tmp_path / f"{block.module}.py").write_text(block.code, encoding="utf-8")
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", f"{block.module}:app", *LOOPBACK],
        cwd=tmp_path,
        env=_environment(tmp_path),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    log: list[str] = []
    try:
        base = await asyncio.to_thread(_wait_until_started, server, log)
        if base is None:
            output = "".join(log)
            if _EXTRA.search(output):
                pytest.skip(f"{block.label}: needs a provider SDK")
            pytest.fail(f"{block.label} did not start:\n{output}")
        async with httpx2.AsyncClient(base_url=base, timeout=60) as client:
            info = (await client.get("/api/console/info")).raise_for_status().json()
            endpoints = [e["path"] for e in info["endpoints"]]
            if endpoints:
                answer = await client.post(endpoints[0], json={"message": "hello"})
                assert answer.status_code == 200, answer.text
                frames = parse_sse(answer.text)
                assert frames[-1]["event"] == "complete", (block.label, frames[-1])
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            _, rest = await asyncio.to_thread(server.communicate, timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            _, rest = server.communicate()
        log.append(rest)
    output = "".join(log)
    # uvicorn stops gracefully on SIGTERM, then ends by that signal
    assert server.returncode in (0, -signal.SIGTERM), (
        f"{block.label}: {server.returncode}\n{output}"
    )
    assert "Traceback" not in output, f"{block.label}:\n{output}"


def _wait_until_started(server: subprocess.Popen[str], log: list[str]) -> str | None:
    """The server's base URL once uvicorn says it is running; `None` if it exited first."""
    assert server.stderr is not None
    for line in server.stderr:
        log.append(line)
        started = _STARTED.search(line)
        if started:
            return started.group(1)
    return None


def test_the_checks_tell_the_kinds_apart() -> None:
    page = ROOT / "docs" / "x.md"
    app = Block(page, 1, ' title="app.py"', "app = FastAPI()\n", fragment=False)
    team = Block(page, 1, "", "# team_app.py — run with: uvicorn team_app:app\napp = 1\n", False)
    assert app.module == "app"
    assert _defines(app.code, "app")
    assert team.module == "team_app"
    assert not _defines("app.include_router(router)\n", "app")
    found = _BLOCK.findall(
        '<!-- fragment -->\n```py\nx = 1\n```\n\n```python title="a.py"\ny\n```\n'
    )
    assert found == [("", "x = 1\n"), (' title="a.py"', "y\n")]
