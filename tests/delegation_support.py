"""Helpers for the delegation and governance tests: governed apps, an incremental frame reader."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from fastapi import FastAPI

from atmosphere_harness import (
    Admit,
    Deny,
    PolicyContext,
    ToolApprovalPolicy,
)
from atmosphere_harness._runtimes.base import AgentRuntime
from tests.support import make_app


def governed_app(
    agents: Sequence[type],
    *,
    runtime: AgentRuntime | None = None,
    workspace: Path,
    policies: Sequence[Any] = (),
    approval_policy: ToolApprovalPolicy | None = None,
    **settings: Any,
) -> FastAPI:
    """`tests.support.make_app` with policies and an approval policy."""
    router = {"policies": policies, "approval_policy": approval_policy}
    return make_app(agents, runtime=runtime, workspace=workspace, router=router, **settings)


class Recorder:
    """A policy that admits (or applies `decide`) and records every context it saw."""

    def __init__(self, name: str = "recorder", decide: Any = None) -> None:
        self.name = name
        self.decide = decide
        self.seen: list[PolicyContext] = []

    def evaluate(self, ctx: PolicyContext) -> Any:
        self.seen.append(ctx)
        return self.decide(ctx) if self.decide is not None else Admit()


def deny_when(name: str, predicate: Any, reason: str = "not allowed") -> Recorder:
    return Recorder(name, lambda ctx: Deny(reason) if predicate(ctx) else Admit())


class FrameReader:
    """Reads a frame stream one frame at a time (pings and `retry` blocks skipped)."""

    def __init__(self, response: httpx2.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()
        self.frames: list[dict[str, Any]] = []

    async def next(self, timeout: float = 15) -> dict[str, Any]:
        return await asyncio.wait_for(self._next(), timeout)

    async def _next(self) -> dict[str, Any]:
        async for line in self._lines:
            if line.startswith("data:"):
                frame: dict[str, Any] = json.loads(line[5:].strip())
                self.frames.append(frame)
                return frame
        raise EOFError("the stream ended")

    async def until(self, event: str, timeout: float = 15) -> dict[str, Any]:
        while True:
            frame = await self.next(timeout)
            if frame["event"] == event:
                return frame

    async def rest(self, timeout: float = 15) -> list[dict[str, Any]]:
        """Every remaining frame, up to and including the terminal one."""
        got: list[dict[str, Any]] = []
        while True:
            frame = await self.next(timeout)
            got.append(frame)
            if frame["event"] in ("complete", "error"):
                return got


@asynccontextmanager
async def open_prompt(
    client: httpx2.AsyncClient,
    path: str,
    message: str,
    conversation_id: str | None = None,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[FrameReader]:
    body: dict[str, Any] = {"message": message}
    if conversation_id is not None:
        body["conversationId"] = conversation_id
    async with client.stream("POST", path, json=body, headers=headers or {}) as response:
        assert response.status_code == 200, await response.aread()
        yield FrameReader(response)
