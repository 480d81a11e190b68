"""The load workload: a scripted model whose every turn depends on its conversation, and the
expectations the client derives from the same functions.

Both sides are deterministic functions of `(conversation id, turn, name)`, so the client knows
what every conversation must have planned, written and read without trusting the server, and
every conversation's contents are unique (they embed its id): a file or plan that shows up in
the wrong conversation is caught byte for byte.

One prompt is one turn (`"turn 2 of 3"`); within it the model takes these rounds (a round is
one model message), chosen from what the loop already did since the user message:

0. `write_todos`: the turn's draft plan (first step in progress);
1. `write_file` x2 in one message: `notes/t{turn}.md` (new) and `latest.md` (overwritten),
   about 300-3300 bytes each;
2. `read_file latest.md`, `grep marker`, `ls` in one message (the client checks the results);
3. `write_todos`: the same plan, every step completed;
4. last turn only, every bound probed in one message: a file one byte over the per-file limit,
   a plan one step over the step limit, and three extra files of which only the first fits the
   file-count limit;
5. the final answer.

The first model call of each conversation can wait at a gate until `GATE` conversations have
arrived, which proves they really run at the same time on the server (a server that serialized
them would never open the gate, and the run would fail instead of passing slowly).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import re
from collections.abc import Sequence

from atmosphere_harness import ModelRequest, ScriptedRuntime, ToolCall
from atmosphere_harness._errors import ModelError
from atmosphere_harness._filesystem.base import FileSystemLimits
from atmosphere_harness._memory.extraction import EXTRACTION_SYSTEM_PROMPT
from atmosphere_harness._planning.store import MAX_STEPS
from atmosphere_harness._runtimes.base import Message

TURNS = 3
LIMITS = FileSystemLimits(max_file_bytes=8 * 1024, max_files=TURNS + 2, max_total_bytes=64 * 1024)
"""Small bounds, so the last turn can probe each of them (files: `notes/t1..tN`, `latest.md`,
`extra/1.md` fill the store exactly)."""

GATE_ENV = "RELIABILITY_LOAD_GATE"
GATE_TIMEOUT = 120.0
"""Hang guard of the gate: generous, it only turns a deadlock into a clear failure."""

_TURN = re.compile(r"^turn (\d+) of (\d+)$")


def _seed(*parts: object) -> str:
    return hashlib.sha256("/".join(str(part) for part in parts).encode()).hexdigest()


@functools.cache
def content(cid: str, turn: int, name: str) -> str:
    """The text conversation `cid` writes to `name` in `turn`: unique, 300-3300 bytes, and
    only its first line contains `marker` (so `grep marker` finds one line per file)."""
    seed = _seed(cid, turn, name)
    lines = [f"{cid} turn={turn} file={name} marker"]
    # 64 hex digits and a newline per line after the header.
    lines.extend(_seed(seed, index) for index in range(1, 5 + int(seed[:4], 16) % 47))
    return "\n".join(lines) + "\n"


def todos(cid: str, turn: int, done: bool) -> tuple[list[dict[str, str]], str]:
    """The plan of `turn` (2-6 steps, their count depends on the conversation) and its goal."""
    count = 2 + int(_seed(cid, turn, "plan")[:2], 16) % 5
    steps = []
    for index in range(count):
        status = "completed" if done else ("in_progress" if index == 0 else "pending")
        step = {"content": f"{cid} turn {turn} step {index + 1}", "status": status}
        if status == "in_progress":
            step["activeForm"] = f"Working on {cid} turn {turn} step {index + 1}"
        steps.append(step)
    return steps, plan_goal(cid, turn, done)


def plan_goal(cid: str, turn: int, done: bool) -> str:
    return f"{cid} turn {turn} {'done' if done else 'draft'}"


def plan_version(goal: str) -> tuple[str, int]:
    """`(conversation id, order)` of a plan goal; later plans of a conversation order higher."""
    cid, _, rest = goal.partition(" turn ")
    turn, _, phase = rest.partition(" ")
    return cid, int(turn) * 2 + (1 if phase == "done" else 0)


def file_version(text: str) -> tuple[str, int, str]:
    """`(conversation id, turn, name)` from a written file's first line."""
    header = text.split("\n", 1)[0]
    match = re.fullmatch(r"(\S+) turn=(\d+) file=(\S+) marker", header)
    if match is None:
        raise ValueError(f"not a workload file: {header[:80]!r}")
    return match.group(1), int(match.group(2)), match.group(3)


def expected_files(cid: str, turns: int = TURNS) -> dict[str, str]:
    """Every file of a conversation that finished `turns` turns, with its final content."""
    files = {
        f"notes/t{turn}.md": content(cid, turn, f"notes/t{turn}.md") for turn in range(1, turns + 1)
    }
    files["latest.md"] = content(cid, turns, "latest.md")
    if turns == TURNS:
        files["extra/1.md"] = content(cid, turns, "extra/1.md")
    return files


def bound_probes(cid: str, turn: int) -> list[ToolCall]:
    """The last turn's probes of every bound (see the module docstring)."""
    oversized = "y" * (LIMITS.max_file_bytes + 1)
    too_long = [{"content": f"{cid} step {i}", "status": "pending"} for i in range(MAX_STEPS + 1)]
    calls = [
        ToolCall("write_file", {"path": "big.md", "content": oversized}),
        ToolCall("write_todos", {"todos": too_long, "goal": f"{cid} overflow"}),
    ]
    for index in (1, 2, 3):
        path = f"extra/{index}.md"
        calls.append(ToolCall("write_file", {"path": path, "content": content(cid, turn, path)}))
    return calls


def step(cid: str, turn: int, last: int, index: int) -> list[ToolCall] | None:
    """The tool calls of round `index` of a turn (see the module docstring); `None` when the
    turn's rounds are over."""
    if index == 0 or index == 3:
        steps, goal = todos(cid, turn, done=index == 3)
        return [ToolCall("write_todos", {"todos": steps, "goal": goal})]
    if index == 1:
        return [
            ToolCall("write_file", {"path": path, "content": content(cid, turn, path)})
            for path in (f"notes/t{turn}.md", "latest.md")
        ]
    if index == 2:
        return [
            ToolCall("read_file", {"path": "latest.md"}),
            ToolCall("grep", {"pattern": "marker"}),
            ToolCall("ls", {}),
        ]
    if index == 4 and turn == last:
        return bound_probes(cid, turn)
    return None


def answer(cid: str, turn: int) -> str:
    return f"{cid} finished turn {turn}"


def fact(cid: str) -> str:
    return f"The user's project code is {cid}"


# --- the model (runs in the server process) -------------------------------------------------


class _Gate:
    """Opens once `size` conversations have arrived; later arrivals pass straight through."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.arrived = 0
        self.open = asyncio.Event()

    async def arrive(self) -> None:
        self.arrived += 1
        if self.arrived >= self.size:
            self.open.set()
        try:
            await asyncio.wait_for(self.open.wait(), GATE_TIMEOUT)
        except TimeoutError:
            raise ModelError(
                f"only {self.arrived} of {self.size} conversations arrived at the gate: the "
                "server does not run them concurrently"
            ) from None


def _since_user(messages: Sequence[Message]) -> tuple[str, list[Message]]:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return messages[index].content, list(messages[index + 1 :])
    return "", []


def runtime() -> ScriptedRuntime:
    """The load model (`RELIABILITY_LOAD_GATE` sets the gate size; unset or 0: no gate)."""
    size = int(os.environ.get(GATE_ENV) or 0)
    gate = _Gate(size) if size > 0 else None

    async def turn(request: ModelRequest) -> str | list[ToolCall]:
        cid = request.conversation_id
        if request.system_prompt == EXTRACTION_SYSTEM_PROMPT:
            # Extraction calls carry `memory-extraction:{conversation id}`.
            return json.dumps([fact(cid.rpartition(":")[2])])
        text, after = _since_user(request.messages)
        match = _TURN.match(text)
        if match is None:
            return f"{cid} says hello"
        number, last = int(match.group(1)), int(match.group(2))
        done = sum(1 for message in after if message.role == "assistant" and message.tool_calls)
        if gate is not None and number == 1 and done == 0:
            await gate.arrive()
        calls = step(cid, number, last, done)
        return calls if calls is not None else answer(cid, number)

    model = ScriptedRuntime((), default=turn)
    model.record_requests = False  # thousands of requests: keep none in memory
    return model


def message(turn: int, turns: int = TURNS) -> str:
    return f"turn {turn} of {turns}"
