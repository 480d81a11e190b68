"""A coding agent on the scripted model: it reads its bug-fixing skill, writes code, searches it,
fixes a bug, runs the tests (a long log, offloaded to `tool-output/` and read back by line window)
and keeps a lesson in `memory/`, which a composite route sends to a store shared by every
conversation.

Its two skills live in `skills/` beside this module (found by convention): `fix-a-failing-test`
and `write-python-tests`. The system prompt lists them; the model reads one with `read_file` from
the read-only `skills/` folder of its workspace when a task matches it.

Everything runs offline. With the planning primitive attached (`write_todos`), the script also
plans the work first and ticks the plan off at the end; without it, it goes straight to the files.
Point `LLM_BASE_URL` at a real model to let that model drive the same tools.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fastapi import FastAPI

from atmosphere_harness import (
    AgentFileSystem,
    HarnessSettings,
    Message,
    ModelRequest,
    ScriptedRuntime,
    StreamingSession,
    ToolCall,
    ToolKind,
    agent,
    create_harness_router,
    prompt,
    tool,
)

BUGGY = """def add(a: int, b: int) -> int:
    return a + b


def divide(a: float, b: float) -> float:
    # TODO: guard against division by zero
    return a / b
"""

TESTS = """from src.calc import add, divide


def test_add() -> None:
    assert add(2, 3) == 5


def test_divide_by_zero() -> None:
    assert divide(1, 0) is None
"""

SKILL = "skills/fix-a-failing-test/SKILL.md"
FIX_OLD = "    # TODO: guard against division by zero\n    return a / b\n"
FIX_NEW = "    if b == 0:\n        return None\n    return a / b\n"


@tool(kind=ToolKind.EXECUTE)
async def run_tests(fs: AgentFileSystem) -> str:
    """Run the project's tests and return the full (long) log."""
    source = await fs.read("src/calc.py")
    fixed = "if b == 0" in source
    lines = [f"collecting ... case {n:04d}: checking arithmetic invariants ok" for n in range(400)]
    lines.append("tests/test_calc.py::test_add PASSED")
    lines.append(
        "tests/test_calc.py::test_divide_by_zero "
        + ("PASSED" if fixed else "FAILED (ZeroDivisionError: division by zero)")
    )
    lines.append("2 passed" if fixed else "1 passed, 1 failed")
    return "\n".join(lines) + "\n"


@agent(name="coder", description="Writes, searches and fixes code in its workspace.")
class Coder:
    """A coding agent with a bounded workspace, a shared memory route and a test runner."""

    tools = [run_tests]

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


def _since_last_user(messages: Sequence[Message]) -> list[Message]:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return list(messages[index + 1 :])
    return []


def _plan(status: Sequence[str]) -> ToolCall:
    steps = ["Write the code and its tests", "Find and fix the bug", "Run the tests"]
    return ToolCall(
        "write_todos",
        {
            "todos": [
                {"content": step, "status": state}
                for step, state in zip(steps, status, strict=True)
            ],
            "goal": "Fix the calculator",
        },
    )


def coding_turn(request: ModelRequest) -> list[ToolCall] | str:
    """One turn of the scripted coding model, derived only from the request."""
    after = _since_last_user(request.messages)
    tools = {spec.name for spec in request.tools}
    if not {"write_file", "read_file", "grep", "edit_file"} <= tools:
        return "I need the file tools for this (enable Harness.FILESYSTEM)."
    planning = "write_todos" in tools
    steps: list[list[ToolCall]] = []
    if planning:
        steps.append([_plan(["in_progress", "pending", "pending"])])
    if SKILL in request.system_prompt:  # progressive disclosure: read the skill, then work
        steps.append([ToolCall("read_file", {"path": SKILL})])
    steps += [
        [
            ToolCall("write_file", {"path": "src/calc.py", "content": BUGGY}),
            ToolCall("write_file", {"path": "tests/test_calc.py", "content": TESTS}),
        ],
        [ToolCall("grep", {"pattern": r"TODO|def \w+"}), ToolCall("glob", {"pattern": "**/*.py"})],
        [ToolCall("edit_file", {"path": "src/calc.py", "old_text": FIX_OLD, "new_text": FIX_NEW})],
        [ToolCall("run_tests", {})],
    ]
    rounds = sum(1 for message in after if message.role == "assistant" and message.tool_calls)
    if rounds < len(steps):
        return steps[rounds]
    last = after[-1].content if after else ""
    saved = re.search(r"Full output saved to (\S+) — ", last)
    if saved:  # the test log was offloaded: read its last lines back
        return [ToolCall("read_file", {"path": saved.group(1), "offset": 400})]
    if "Wrote memory/lessons.md" not in [message.content for message in after]:
        lesson = "- Guard divisions: `divide(x, 0)` must return None, not raise.\n"
        finish = [ToolCall("write_file", {"path": "memory/lessons.md", "content": lesson})]
        if planning:
            finish.append(_plan(["completed", "completed", "completed"]))
        return finish
    return (
        "Fixed `divide` in src/calc.py (it now returns None for a zero divisor); both tests "
        "pass, and I noted the lesson in memory/lessons.md."
    )


def create_app(settings: HarnessSettings | None = None) -> FastAPI:
    app = FastAPI(title="atmosphere-harness coding agent")
    runtime = ScriptedRuntime((), default=coding_turn)
    app.include_router(create_harness_router(settings, agents=[Coder], runtime=runtime))
    return app


app = create_app()
