"""The hostile model: a scripted model that does what a broken or subverted model might.

The user message names the scenario (`"hostile flood"`); each runs one hostile message, then
answers. A message ending in `hold:{token}` makes the final model call announce itself (it creates
`{RELIABILITY_RELEASE_DIR}/{token}.held`) and wait until the test creates
`{RELIABILITY_RELEASE_DIR}/{token}`: the hostile run is then provably still open while the test
checks that the server answers other clients.

- `huge`: 50 MB of incompressible text as `write_file` content and as an unknown tool's argument;
- `types`: every argument of the wrong type, arguments that are not an object (text, a list),
  a lone surrogate, arguments nested 10,000 levels deep;
- `unknown`: tools that do not exist, with empty, NUL-bearing and 10,000-character names;
- `flood`: 10,000 `write_file` calls in one message;
- `recurse`: every agent and sub-agent asks for three `task` spawns per message, five times;
- `regex`: a catastrophically backtracking `grep` over a file built to trigger it;
- `traversal`: `..`, absolute, NUL and backslash paths through every file tool; then, in a
  second prompt after the test planted symlinks to outside the store, reads and writes through
  them.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atmosphere_harness import ModelRequest, ScriptedRuntime, ToolCall
from atmosphere_harness._errors import ModelError
from atmosphere_harness._runtimes.base import Message

RELEASE_ENV = "RELIABILITY_RELEASE_DIR"
HOLD_TIMEOUT = 120.0
"""Hang guard of a held run (the test releases it within seconds)."""

HUGE_CHARS = 50_000_000
FLOOD_CALLS = 10_000
SPAWNS_PER_MESSAGE = 3
RECURSE_ROUNDS = 5
CATASTROPHIC = "(a|aa)+$"
"""Exponential backtracking on a long run of `a` that ends in something else."""
HAYSTACK = ("a" * 40 + "!\n") * 50
SECRET = "outside-the-store secret"
SUBAGENT_MARKER = "general-purpose subagent"


def huge_text() -> str:
    """50 MB that compresses badly (a store that packs its payloads cannot hide it)."""
    return random.randbytes(HUGE_CHARS // 2).hex()


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def scenario(name: str) -> list[ToolCall]:
    """The one hostile message of a scenario (the second prompt of `traversal` excepted)."""
    if name == "huge":
        text = huge_text()
        return [
            ToolCall("write_file", {"path": "huge.txt", "content": text}),
            ToolCall("no_such_tool", {"payload": text}),
        ]
    if name == "types":
        return [
            ToolCall("write_file", {"path": ["a.txt"], "content": {"not": "text"}}),
            ToolCall("write_file", {"path": "a.txt"}),
            ToolCall("read_file", {"path": "a.txt", "offset": "abc"}),
            ToolCall("read_file", {"path": "a.txt", "limit": -5}),
            ToolCall("write_todos", {"todos": "not a list"}),
            ToolCall("write_todos", {"todos": [1, None, "x"]}),
            ToolCall("write_todos", {"todos": [{"content": "a", "status": "exploded"}]}),
            ToolCall("edit_file", {"path": "a.txt", "old_text": 1, "new_text": []}),
            ToolCall("grep", {"pattern": None}),
            ToolCall("grep", {"pattern": "("}),
            ToolCall("glob", {"pattern": {"x": 1}}),
            ToolCall("rename", {"old_path": {}, "new_path": []}),
            ToolCall("delete", {"path": 3.5}),
            ToolCall("task", {"description": ["not", "text"]}),
            ToolCall("delegate_task", {"agent": None, "message": "hi"}),
            ToolCall("write_file", "{not json"),  # type: ignore[arg-type]
            ToolCall("read_file", [1, 2, 3]),  # type: ignore[arg-type]
            ToolCall("write_file", {"path": "s\ud800.txt", "content": "lone \udc00 surrogate"}),
            ToolCall("write_file", {"path": "deep.txt", "content": _nested(10_000)}),
        ]
    if name == "unknown":
        return [
            ToolCall("rm_rf", {"path": "/"}),
            ToolCall("", {}),
            ToolCall("x" * 10_000, {}),
            ToolCall("write_file ", {"path": "a.txt", "content": "trailing space"}),
            ToolCall("read_file\x00", {"path": "a.txt"}),
            ToolCall("__import__", {"name": "os"}),
        ]
    if name == "flood":
        return [
            ToolCall("write_file", {"path": f"flood/{index}.txt", "content": str(index)})
            for index in range(FLOOD_CALLS)
        ]
    if name == "regex":
        return [
            ToolCall("write_file", {"path": "haystack.txt", "content": HAYSTACK}),
            ToolCall("grep", {"pattern": CATASTROPHIC}),
            ToolCall("grep", {"pattern": "a!"}),
        ]
    if name == "traversal":
        return [
            ToolCall("write_file", {"path": "../escape.txt", "content": "x"}),
            ToolCall("write_file", {"path": "/tmp/absolute.txt", "content": "x"}),
            ToolCall("write_file", {"path": "a\x00b.txt", "content": "x"}),
            ToolCall("write_file", {"path": "dir\\..\\..\\escape.txt", "content": "x"}),
            ToolCall("read_file", {"path": "../../../../etc/passwd"}),
            ToolCall("read_file", {"path": "/etc/passwd"}),
            ToolCall("ls", {"dir": "../.."}),
            ToolCall("glob", {"pattern": "../**"}),
            ToolCall("grep", {"pattern": "root", "dir": "/etc"}),
            ToolCall("rename", {"old_path": "inside.txt", "new_path": "../moved.txt"}),
            ToolCall("delete", {"path": ".."}),
            ToolCall("edit_file", {"path": "../x", "old_text": "a", "new_text": "b"}),
            ToolCall("write_file", {"path": "inside.txt", "content": "inside"}),
        ]
    if name == "through-links":
        return [
            ToolCall("read_file", {"path": "link/secret.txt"}),
            ToolCall("read_file", {"path": "filelink"}),
            ToolCall("write_file", {"path": "link/planted.txt", "content": "planted"}),
            ToolCall("write_file", {"path": "filelink", "content": "overwritten"}),
            ToolCall("edit_file", {"path": "filelink", "old_text": "secret", "new_text": "x"}),
            ToolCall("ls", {"dir": "link"}),
            ToolCall("grep", {"pattern": "secret", "dir": "link"}),
            ToolCall("delete", {"path": "link/secret.txt"}),
            ToolCall("rename", {"old_path": "link/secret.txt", "new_path": "stolen.txt"}),
        ]
    raise ValueError(f"unknown scenario {name!r}")


def _since_user(messages: Sequence[Message]) -> tuple[str, list[Message]]:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return messages[index].content, list(messages[index + 1 :])
    return "", []


def hold_token(text: str) -> str | None:
    last = text.split()[-1] if text.split() else ""
    return last[len("hold:") :] if last.startswith("hold:") else None


async def _hold(token: str) -> None:
    """Announce the hold (`{token}.held`), then wait for the test's `{token}` file."""
    directory = Path(os.environ[RELEASE_ENV])
    (directory / f"{token}.held").touch()
    release = directory / token
    deadline = asyncio.get_running_loop().time() + HOLD_TIMEOUT
    while not release.exists():
        if asyncio.get_running_loop().time() > deadline:
            raise ModelError(f"the test never released {token}")
        await asyncio.sleep(0.02)


def runtime() -> ScriptedRuntime:
    async def turn(request: ModelRequest) -> str | list[ToolCall]:
        text, after = _since_user(request.messages)
        done = sum(1 for message in after if message.role == "assistant" and message.tool_calls)
        tools = {tool.name for tool in request.tools}
        if SUBAGENT_MARKER in request.system_prompt or text.startswith("hostile recurse"):
            # Every agent in the tree keeps spawning while it can, for a fixed number of rounds.
            if done < RECURSE_ROUNDS:
                return [
                    ToolCall("task", {"description": f"recurse level {index}"})
                    for index in range(SPAWNS_PER_MESSAGE)
                ]
            token = hold_token(text)
            if token is not None:
                await _hold(token)
            return f"recursion over after {done} rounds ({'task' in tools})"
        words = text.split()
        if len(words) >= 2 and words[0] == "hostile":
            if done == 0:
                return scenario(words[1])
            token = hold_token(text)
            if token is not None:
                await _hold(token)
            return f"survived {words[1]}"
        return f"echo: {text}"

    model = ScriptedRuntime((), default=turn)
    model.record_requests = False  # the huge arguments must not be kept by the test model
    return model
