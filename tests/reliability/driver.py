"""The client side of the load: conversations over real HTTP, what each one saw acknowledged,
and the checks that need nothing but the frames.

A conversation records, from its own stream:

- every write the server acknowledged (its `tool-result` frame arrived): the last acknowledged
  version of each file and of the plan, which the fault test holds the disk to after a SIGKILL;
- every result that does not match what the workload says it must be (`problems`): a read that
  returns another conversation's text, a grep or `ls` that shows another conversation's file, a
  bound probe that was not rejected, a frame of another conversation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2

from . import workload
from .apps import PATH

STREAM_TIMEOUT = 120.0
"""Hang guard per frame: a stream that sends nothing for this long has hung."""


class StreamBroken(Exception):
    """The stream ended without a terminal frame (the server died, or the connection did)."""


@dataclass
class Conversation:
    cid: str
    user: str
    turns: int = workload.TURNS
    sent: int = 0
    """Turns sent (the last one may not have finished)."""
    completed: int = 0
    """Turns whose `complete` frame arrived."""
    acked_files: dict[str, int] = field(default_factory=dict)
    """Path -> turn of the last write of it whose `tool-result` arrived (successful writes)."""
    acked_plan: int = -1
    """Order (`workload.plan_version`) of the last acknowledged plan, -1 when none."""
    problems: list[str] = field(default_factory=list)


async def stream_frames(
    client: httpx2.AsyncClient,
    path: str,
    message: str,
    conversation_id: str | None = None,
    headers: dict[str, str] | None = None,
    on_frame: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """POST one prompt and read its frames as they arrive, up to the terminal one."""
    body: dict[str, Any] = {"message": message}
    if conversation_id is not None:
        body["conversationId"] = conversation_id
    frames: list[dict[str, Any]] = []
    try:
        async with client.stream("POST", path, json=body, headers=headers or {}) as response:
            if response.status_code != 200:
                raise AssertionError(f"{response.status_code}: {(await response.aread())[:500]!r}")
            lines = response.aiter_lines()
            while True:
                line = await asyncio.wait_for(anext(lines), STREAM_TIMEOUT)
                if not line.startswith("data:"):
                    continue
                frame: dict[str, Any] = json.loads(line[5:].strip())
                frames.append(frame)
                if on_frame is not None:
                    on_frame(frame)
                if frame["event"] in ("complete", "error"):
                    return frames
    except (StopAsyncIteration, httpx2.TransportError) as exc:
        raise StreamBroken(f"{type(exc).__name__}: {exc}") from exc


class _Turn:
    """Checks one turn's frames against the workload and records what they acknowledge."""

    def __init__(self, conversation: Conversation, turn: int, on_ack: Callable[[], None]) -> None:
        self.conversation = conversation
        self.turn = turn
        self.on_ack = on_ack
        self.calls: dict[str, dict[str, Any]] = {}

    def problem(self, text: str) -> None:
        self.conversation.problems.append(f"{self.conversation.cid} turn {self.turn}: {text}")

    def __call__(self, frame: dict[str, Any]) -> None:
        conv = self.conversation
        cid = conv.cid
        if frame.get("conversationId") not in (cid, None):
            self.problem(f"a frame of conversation {frame.get('conversationId')!r}")
        data = frame["data"]
        if frame["event"] == "tool-start":
            self.calls[data["toolCallId"]] = data
        elif frame["event"] == "plan-update":
            if not str(data.get("goal", "")).startswith(cid + " "):
                self.problem(f"plan-update of another conversation: {data.get('goal')!r}")
        elif frame["event"] == "tool-result":
            start = self.calls.get(data["toolCallId"])
            if start is None:
                self.problem(f"tool-result without tool-start: {data}")
                return
            self.result(data["tool"], start["arguments"], data["result"])
        elif frame["event"] == "error":
            self.problem(f"error frame: {data}")

    def result(self, tool: str, arguments: dict[str, Any], result: str) -> None:
        conv = self.conversation
        cid = conv.cid
        path = arguments.get("path")
        if tool == "write_file":
            fits = path in workload.expected_files(cid, self.turn)  # the probes' first extra
            if result == f"Wrote {path}":
                if not fits:
                    self.problem(f"a write past a bound was accepted: {path}")
                conv.acked_files[str(path)] = self.turn
                self.on_ack()
            elif fits:
                self.problem(f"write of {path} failed: {result[:200]}")
            elif not result.startswith("Error: Write rejected"):
                self.problem(f"over-bound write of {path} answered {result[:200]!r}")
        elif tool == "write_todos":
            goal = str(arguments.get("goal", ""))
            if goal.endswith(" overflow"):
                if "exceeds the 256-step limit" not in result:
                    self.problem(f"an over-long plan was not rejected: {result[:200]!r}")
                return
            if not result.startswith(f"Goal: {goal}"):
                self.problem(f"write_todos answered {result[:200]!r}")
                return
            conv.acked_plan = max(conv.acked_plan, workload.plan_version(goal)[1])
            self.on_ack()
        elif tool == "read_file":
            if result != workload.content(cid, self.turn, "latest.md"):
                self.problem(f"read_file latest.md returned {result[:120]!r}")
        elif tool == "grep":
            hits = result.splitlines()
            if not hits or any(cid not in hit for hit in hits):
                self.problem(f"grep saw another conversation's text: {result[:300]!r}")
        elif tool == "ls":
            allowed = {"notes/", "latest.md", "extra/"}
            names = {line.split(" ")[0] for line in result.splitlines()}
            if not names <= allowed:
                self.problem(f"ls shows {sorted(names - allowed)}")


async def run_conversation(
    client: httpx2.AsyncClient,
    conversation: Conversation,
    *,
    on_ack: Callable[[], None] = lambda: None,
) -> None:
    """Send the conversation's remaining turns, one prompt each, checking every frame, then
    close it (its long-term-memory extraction runs in the server's background)."""
    headers = {"X-User-Id": conversation.user}
    conversation.sent = conversation.completed  # an interrupted turn is sent again
    while conversation.sent < conversation.turns:
        turn = conversation.sent + 1
        conversation.sent = turn
        check = _Turn(conversation, turn, on_ack)
        frames = await stream_frames(
            client,
            PATH,
            workload.message(turn, conversation.turns),
            conversation.cid,
            headers,
            on_frame=check,
        )
        last = frames[-1]
        if last["event"] != "complete":
            conversation.problems.append(f"{conversation.cid} turn {turn} ended with {last}")
            return
        if last["data"].get("summary") != workload.answer(conversation.cid, turn):
            conversation.problems.append(f"{conversation.cid} turn {turn} answered {last}")
        conversation.completed = turn
    try:
        closed = await client.post(
            f"{PATH}/conversations/{conversation.cid}/close", headers=headers
        )
    except httpx2.TransportError as exc:
        raise StreamBroken(f"close: {type(exc).__name__}: {exc}") from exc
    if closed.status_code != 200:
        conversation.problems.append(f"{conversation.cid} close answered {closed.status_code}")


def conversations(count: int, prefix: str) -> list[Conversation]:
    """`count` conversations with ids of the workload's shape, two per user."""
    return [
        Conversation(f"{prefix}-{index:04d}", f"user-{index // 2:04d}") for index in range(count)
    ]


def http_client(base_url: str, concurrency: int) -> httpx2.AsyncClient:
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx2.AsyncClient(base_url=base_url, timeout=STREAM_TIMEOUT, limits=limits)


async def run_load(
    base_url: str,
    convs: list[Conversation],
    *,
    concurrency: int,
    on_ack: Callable[[], None] = lambda: None,
) -> list[BaseException]:
    """Every conversation at once, at most `concurrency` streams open; returns the failures."""
    semaphore = asyncio.Semaphore(concurrency)

    async with http_client(base_url, concurrency) as client:

        async def one(conversation: Conversation) -> None:
            async with semaphore:
                await run_conversation(client, conversation, on_ack=on_ack)

        outcomes = await asyncio.gather(*(one(c) for c in convs), return_exceptions=True)
    return [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
