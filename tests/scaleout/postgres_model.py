"""The scripted model of the two-replica tests (it runs in each server process).

Every answer is a function of the request alone (the conversation's stored history, the facts
the memory recalled), so whichever replica serves a turn, the client can tell from the answer
what that replica saw:

- `plan: a|b|c` -> `write_todos` with those steps, then `planned`;
- `history?` -> `seen: <earlier user messages, oldest first, joined by " | ">`;
- `slow <seconds>` -> waits, then `before me: <number of earlier user messages>` (two concurrent
  first turns that are serialized answer 0 and 1; unserialized, both answer 0);
- `approve: <name>` -> `write_file approved/<name>.md` (gated: `APPROVAL_POLICY`), then
  `result: <the tool's result>`;
- `recall?` -> `facts: <the recalled facts block>`;
- `remember: <fact>` -> `noted`; extraction returns every such fact of the conversation;
- `call: <tool> <JSON arguments>` -> that tool call, then `result: <the tool's result>` (the
  workspace tests drive the eight file tools this way).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from atmosphere_harness import ModelRequest, ScriptedRuntime, ToolCall
from atmosphere_harness._governance.approval import ToolApprovalPolicy
from atmosphere_harness._memory.extraction import EXTRACTION_SYSTEM_PROMPT
from atmosphere_harness._runtimes.base import Message

APPROVAL_POLICY = ToolApprovalPolicy.custom(lambda tool: tool.name == "write_file")


def _split(messages: Sequence[Message]) -> tuple[str, list[str], list[Message]]:
    """The last user message, the user messages before it, and what the loop added since."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            earlier = [m.content for m in messages[:index] if m.role == "user"]
            return messages[index].content, earlier, list(messages[index + 1 :])
    return "", [], []


def _facts(messages: Sequence[Message]) -> list[str]:
    found: list[str] = []
    for message in messages:
        for line in message.content.splitlines():
            # The extraction prompt quotes the conversation as `user: ...` lines.
            _before, marker, fact = line.partition("user: remember: ")
            if marker:
                found.append(fact.strip())
    return found


async def turn(request: ModelRequest) -> str | list[ToolCall]:
    if request.system_prompt == EXTRACTION_SYSTEM_PROMPT:
        return json.dumps(_facts(request.messages))
    text, earlier, after = _split(request.messages)
    results = [m.content for m in after if m.role == "tool"]
    if text.startswith("plan: "):
        if not results:
            steps = [{"content": s, "status": "pending"} for s in text[6:].split("|")]
            return [ToolCall("write_todos", {"todos": steps, "goal": text[6:]})]
        return "planned"
    if text == "history?":
        return "seen: " + " | ".join(earlier)
    if text.startswith("slow "):
        await asyncio.sleep(float(text.split()[1]))
        return f"before me: {len(earlier)}"
    if text.startswith("approve: "):
        if not results:
            name = text.removeprefix("approve: ").strip()
            return [ToolCall("write_file", {"path": f"approved/{name}.md", "content": name})]
        return f"result: {results[-1]}"
    if text.startswith("call: "):
        if not results:
            name, _space, arguments = text.removeprefix("call: ").partition(" ")
            return [ToolCall(name, json.loads(arguments or "{}"))]
        return f"result: {results[-1]}"
    if text == "recall?":
        return "facts: " + " ".join(request.context)
    if text.startswith("remember: "):
        return "noted"
    return "ok"


def runtime() -> ScriptedRuntime:
    return ScriptedRuntime((), default=turn)
