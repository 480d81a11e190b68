"""The app two replicas serve in the scale-out tests (`python -m tests.reliability.server redis`).

One agent, `scribe`, with the whole harness and a tool that needs a person's approval, on a
scripted model whose every answer is a function of what the request holds, so a client can tell
from the text what the server saw:

- `plan <goal>`: `write_todos` (three steps, the goal), then `planned <goal>`;
- `transfer <n>`: the gated `transfer` tool, then the tool's result;
- `slow <ms> ...`: waits that long first (two turns of one conversation overlapping on two
  replicas would both see only their own message);
- `facts`: the long-term-memory facts the request carries, as `facts: a | b`;
- anything else: `seen: ` and every user message of the conversation so far, oldest first;
- an extraction request: every user message `remember <fact>` gives the fact `<fact>`.

Identity comes from the `X-User-Id` header. Settings (the Redis URL, the workspace) come from
the environment the test sets.
"""

from __future__ import annotations

import asyncio
import json
import re

from fastapi import FastAPI

from atmosphere_harness import (
    Harness,
    HarnessSettings,
    ModelRequest,
    ScriptedRuntime,
    ToolCall,
    agent,
    create_harness_router,
    tool,
)
from atmosphere_harness._memory.extraction import EXTRACTION_SYSTEM_PROMPT
from atmosphere_harness._runtimes.base import Message
from atmosphere_harness._web.deps import user_id_from_header
from tests.agents import echo

PATH = "/atmosphere/agent/scribe"
OWNER = "scribe"

_REMEMBER = re.compile(r"^user: remember (.+)$", re.MULTILINE)
"""A user's `remember <fact>` line in the transcript an extraction request carries."""


@tool(requires_approval=True)
async def transfer(amount: int, to: str) -> str:
    """Send money (needs a person's approval).

    Args:
        amount: How much.
        to: Who gets it.
    """
    return f"sent {amount} to {to}"


Scribe = echo(agent(name="scribe", harness=(Harness.ALL,)), "Scribe", tools=[transfer])


def _since_user(messages: list[Message]) -> tuple[str, list[Message]]:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return messages[index].content, messages[index + 1 :]
    return "", []


async def turn(request: ModelRequest) -> str | list[ToolCall]:
    if request.system_prompt == EXTRACTION_SYSTEM_PROMPT:
        text = "\n".join(m.content for m in request.messages)
        return json.dumps(_REMEMBER.findall(text))
    messages = list(request.messages)
    text, after = _since_user(messages)
    rounds = sum(1 for m in after if m.role == "assistant" and m.tool_calls)
    results = [m.content for m in after if m.role == "tool"]
    if text.startswith("slow ") and rounds == 0 and not results:
        await asyncio.sleep(int(text.split()[1]) / 1000)
    if text.startswith("plan "):
        goal = text[5:].strip()
        if rounds == 0:
            todos = [
                {"content": f"{goal} step {n}", "status": "in_progress" if n == 1 else "pending"}
                for n in (1, 2, 3)
            ]
            return [ToolCall("write_todos", {"todos": todos, "goal": goal})]
        return f"planned {goal}"
    if text.startswith("transfer "):
        if rounds == 0:
            return [ToolCall("transfer", {"amount": int(text.split()[1]), "to": "bob"})]
        return results[-1] if results else "(no result)"
    if text == "facts":
        lines = [line for block in request.context for line in block.splitlines()]
        return "facts: " + " | ".join(line[2:] for line in lines if line.startswith("- "))
    seen = [m.content for m in messages if m.role == "user"]
    return "seen: " + " | ".join(seen)


def create(settings: HarnessSettings | None = None) -> FastAPI:
    runtime = ScriptedRuntime((), default=turn)
    runtime.record_requests = False
    app = FastAPI(title="atmosphere-harness scale-out replica")
    app.include_router(
        create_harness_router(
            settings, agents=[Scribe], runtime=runtime, user_id=user_id_from_header
        )
    )
    return app
