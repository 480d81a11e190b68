"""The durable-runs test app: a model and tools the test can pause, and that count their calls.

`python -m tests.durable.app` serves it (see `tests.reliability.server.serve_app`) with settings
from the environment. `DURABLE_TEST_DIR` holds:

- `calls.jsonl`: one line per model call (`conversation`, `round`, the messages it was sent, and
  `at`, the wall-clock time it came), so a test counts how often each turn was asked for, across
  server lives, and when;
- `tools.jsonl`: one line each time a user tool's handler starts;
- with `DURABLE_TEST_FALLBACK` set, the model is a `FallbackRuntime` whose primary is always
  overloaded, so every model call falls back to the counting one (and sends a
  `model-fallback` frame);
- `hold/<conversation>-<what>`: while such a file exists, that step waits (`model`: the second
  model turn before it answers; `stream`: a streamed answer after its third chunk; `tool`: the
  sleeping tool), so a test can SIGKILL the server exactly there.

The model is scripted per scenario (the prompt's first word) and by round (assistant messages
since the prompt), so a resumed run asks it for exactly the round it has not got.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from atmosphere_harness import (
    FallbackRuntime,
    ModelError,
    StreamingSession,
    ToolCall,
    ToolContext,
    agent,
    create_harness_router,
    prompt,
    tool,
)
from atmosphere_harness._runtimes.base import (
    AiCapability,
    ModelRequest,
    ModelResponse,
    TextSink,
)
from atmosphere_harness._web.deps import user_id_from_header

PATH = "/atmosphere/agent/durable"
DEPTH = 1200
"""How deep the `deep` scenario's tool call nests its arguments (past any JSON encoder's
recursion, and past `tools.bounds.MAX_ARGUMENT_DEPTH`)."""


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"n": value}
    return value


STREAMED = ["alpha ", "beta ", "gamma ", "delta ", "epsilon ", "zeta"]

SCRIPTS: dict[str, list[Any]] = {
    "approval": [[ToolCall("approve_me", {"item": "invoice-7"}, "call-approval")], "approved."],
    "sleep": [[ToolCall("sleepy", {}, "call-sleep")], "slept."],
    "idem": [[ToolCall("sleepy_idempotent", {}, "call-idem")], "idempotent done."],
    "between": [
        [ToolCall("quick", {"n": 1}, "call-quick-1")],
        [ToolCall("quick", {"n": 2}, "call-quick-2")],
        "between done.",
    ],
    "stream": ["".join(STREAMED)],
    "deep": [[ToolCall("quick", nested(DEPTH), "call-deep")], "deep done."],
    "followup": ["ok."],
}


def directory() -> Path:
    return Path(os.environ["DURABLE_TEST_DIR"])


def _log(name: str, entry: dict[str, Any]) -> None:
    with (directory() / name).open("a", encoding="utf-8") as file:
        file.write(json.dumps(entry) + "\n")
        file.flush()
        os.fsync(file.fileno())


async def wait_while_held(name: str) -> None:
    hold = directory() / "hold" / name
    while hold.exists():  # a file another process removes
        await asyncio.sleep(0.05)


def rounds_so_far(request: ModelRequest) -> int:
    count = 0
    for message in reversed(request.messages):
        if message.role == "user":
            return count
        count += message.role == "assistant"
    return count


def transcript(request: ModelRequest) -> list[list[Any]]:
    return [
        [m.role, m.content, [[c.id, c.name, dict(c.arguments)] for c in m.tool_calls]]
        for m in request.messages
    ]


class CountingRuntime:
    """A scripted model that logs every call it gets (see the module docstring)."""

    name = "scripted"
    capabilities = frozenset(
        {AiCapability.TOOL_CALLING, AiCapability.STREAMING, AiCapability.SYSTEM_PROMPT}
    )

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        prompt_text = next(m.content for m in reversed(request.messages) if m.role == "user")
        scenario = prompt_text.split()[0]
        conversation = request.conversation_id
        round_ = rounds_so_far(request)
        _log(
            "calls.jsonl",
            {
                "conversation": conversation,
                "scenario": scenario,
                "round": round_,
                "messages": transcript(request),
                "at": time.time(),
            },
        )
        step = SCRIPTS[scenario][round_]
        if scenario == "between" and round_ == 1:
            await wait_while_held(f"{conversation}-model")
        if isinstance(step, list):
            return ModelResponse(tool_calls=tuple(step))
        if scenario == "stream" and on_text is not None:
            for index, chunk in enumerate(STREAMED):
                await on_text(chunk)
                if index == 2:
                    await wait_while_held(f"{conversation}-stream")
        elif on_text is not None:
            await on_text(step)
        return ModelResponse(text=step)


class Overloaded:
    """A primary model that never answers: every call is a transient failure."""

    name = "openai"
    model = "overloaded"
    capabilities = CountingRuntime.capabilities

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        raise ModelError("OpenAI failed (HTTP 529): overloaded", status=529, transient=True)


@agent(name="durable")
class DurableAgent:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)

    @tool(requires_approval=True)
    async def approve_me(self, item: str, context: ToolContext) -> str:
        """Do something a person must approve.

        Args:
            item: What to act on.
        """
        _log("tools.jsonl", {"tool": "approve_me", "conversation": context.conversation_id})
        return f"acted on {item}"

    @tool
    async def sleepy(self, context: ToolContext) -> str:
        """Take a nap (not idempotent: a restart must not run it twice)."""
        _log("tools.jsonl", {"tool": "sleepy", "conversation": context.conversation_id})
        await wait_while_held(f"{context.conversation_id}-tool")
        return "rested"

    @tool(idempotent=True)
    async def sleepy_idempotent(self, context: ToolContext) -> str:
        """Take a nap that may be taken again."""
        _log("tools.jsonl", {"tool": "sleepy_idempotent", "conversation": context.conversation_id})
        await wait_while_held(f"{context.conversation_id}-tool")
        return "rested again"

    @tool
    async def quick(self, n: int, context: ToolContext) -> str:
        """Answer at once.

        Args:
            n: A number.
        """
        _log("tools.jsonl", {"tool": "quick", "conversation": context.conversation_id})
        return f"quick {n}"


def create() -> FastAPI:
    app = FastAPI(title="atmosphere-harness durable runs test")
    runtime: Any = CountingRuntime()
    if os.environ.get("DURABLE_TEST_FALLBACK"):
        runtime = FallbackRuntime(Overloaded(), runtime)
    app.include_router(
        create_harness_router(agents=[DurableAgent], runtime=runtime, user_id=user_id_from_header)
    )
    return app


if __name__ == "__main__":
    from tests.reliability.server import serve_app

    del sys.argv[1:]
    serve_app(create())
