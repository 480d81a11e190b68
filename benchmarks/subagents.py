"""Sub-agent benchmark: `task` fan-out, ours vs deepagents' `task`, and failure containment.

    python benchmarks/subagents.py [--spawns 8] [--size-kib 16] [--repeats 7] > result.json

Workload (no LLM: a scripted model answers instantly, so the figures are harness overhead): one
prompt whose first model turn asks for `--spawns` `task` calls in one message; each sub-agent
writes a `--size-kib` file, reads it back and reports; the parent then answers with the reports.
Shapes:

- `fanout`: the `--spawns` sub-agents of one message (they run concurrently on both sides);
- `single`: one spawn, the per-spawn cost;
- `containment`: the fan-out with one sub-agent whose model raises. We count the sibling reports
  that reached the parent and whether the run completed; deepagents is run the same way.

Ours is the real harness in-process: a `@coordinator` with the default harness (conversation
memory in SQLite, planning, files, governance), driven through `execute_prompt` with a null
sink, each spawn in its own temp workspace that is removed afterwards. The peer is
`create_deep_agent` (its default general-purpose sub-agent, `StateBackend` files) with the same
scripted turns, driven by `ainvoke` (and `invoke`, its thread-pool path). Each repeat runs both,
alternating which goes first. Prints one JSON document: medians in ms, `ratio` = peer / ours
(> 1 means we are faster), and `peer: null` with the reason when deepagents is not installed
(`pip install '.[bench]'`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from common import summary, version

from atmosphere_harness import (
    HarnessSettings,
    ModelRequest,
    ScriptedRuntime,
    StreamingSession,
    ToolCall,
    coordinator,
    prompt,
)
from atmosphere_harness._assembly import default_primitives
from atmosphere_harness._delegation import SYSTEM_PROMPT
from atmosphere_harness._errors import ModelError
from atmosphere_harness._events import Frame
from atmosphere_harness._kernel.host import HarnessHost
from atmosphere_harness._kernel.run import execute_prompt
from atmosphere_harness._registry import spec_of

EXPLODE = "job-explode"


@coordinator("bench-lead", fleet=())
class BenchLead:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


def jobs(spawns: int, fail: bool) -> list[str]:
    names = [f"job-{n}" for n in range(spawns)]
    if fail and names:
        names[len(names) // 2] = EXPLODE
    return names


def body(size_kib: int, job: str) -> str:
    line = (job + " ").ljust(63, "x") + "\n"
    return line * (size_kib * 1024 // 64)


# --- ours ---------------------------------------------------------------------------------------


def our_model(spawns: int, size_kib: int, fail: bool) -> ScriptedRuntime:
    def turn(request: ModelRequest) -> Any:
        last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
        after = request.messages[last_user + 1 :]
        if request.system_prompt == SYSTEM_PROMPT:
            job = request.messages[0].content
            if job == EXPLODE:
                raise ModelError("kaboom")
            rounds = sum(1 for m in after if m.role == "assistant")
            if rounds == 0:
                return [
                    ToolCall("write_file", {"path": f"{job}.md", "content": body(size_kib, job)})
                ]
            if rounds == 1:
                return [ToolCall("read_file", {"path": f"{job}.md"})]
            return f"report {job}: {len(after[-1].content)} chars"
        if not after:
            return [ToolCall("task", {"description": job}) for job in jobs(spawns, fail)]
        return "\n".join(m.content for m in after if m.role == "tool")

    runtime = ScriptedRuntime((), default=turn)
    runtime.record_requests = False
    return runtime


class Ours:
    def __init__(self, root: Path, spawns: int, size_kib: int, fail: bool) -> None:
        spawn_dir = root / "spawns"
        spawn_dir.mkdir(parents=True, exist_ok=True)
        self.spawn_dir = spawn_dir
        self.host = HarnessHost(
            HarnessSettings(
                workspace_root=root / "workspace",
                subagent_workspace_dir=spawn_dir,
                subagent_max_spawns=max(8, spawns),
                tool_output_offload_threshold=size_kib * 1024 * 2,
            ),
            runtime=our_model(spawns, size_kib, fail),
            specs=[spec_of(BenchLead)],
            primitives=default_primitives(),
        )

    async def __aenter__(self) -> Ours:
        await self.host.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.host.stop()

    async def run(self) -> dict[str, Any]:
        endpoint = self.host.endpoints["/atmosphere/agent/bench-lead"]
        last: list[Frame] = []

        async def sink(frame: Frame) -> None:
            if frame.terminal:
                last.append(frame)

        await execute_prompt(
            self.host,
            endpoint,
            message="go",
            conversation_id=str(uuid.uuid4()),
            user_id=None,
            sink=sink,
        )
        (end,) = last
        answer = str(end.data.get("summary", ""))
        return {
            "completed": end.event == "complete",
            "reports": answer.count("report job-"),
            "leftover_workspaces": len(list(self.spawn_dir.iterdir())),
        }


# --- the peer -----------------------------------------------------------------------------------


def peer_graph(spawns: int, size_kib: int, fail: bool) -> Any:
    from deepagents import create_deep_agent
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "args": args,
            "id": "call_" + uuid.uuid4().hex[:12],
            "type": "tool_call",
        }

    class Scripted(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> Any:
            human = next(m for m in messages if isinstance(m, HumanMessage))
            job = str(human.content)
            rounds = sum(1 for m in messages if isinstance(m, AIMessage))
            tools = [m for m in messages if isinstance(m, ToolMessage)]
            if job != "go":
                if job == EXPLODE:
                    raise RuntimeError("kaboom")
                if rounds == 0:
                    reply = AIMessage(
                        "",
                        tool_calls=[
                            call(
                                "write_file",
                                {"file_path": f"/{job}.md", "content": body(size_kib, job)},
                            )
                        ],
                    )
                elif rounds == 1:
                    reply = AIMessage(
                        "", tool_calls=[call("read_file", {"file_path": f"/{job}.md"})]
                    )
                else:
                    reply = AIMessage(f"report {job}: {len(str(tools[-1].content))} chars")
            elif rounds == 0:
                reply = AIMessage(
                    "",
                    tool_calls=[
                        call("task", {"description": j, "subagent_type": "general-purpose"})
                        for j in jobs(spawns, fail)
                    ],
                )
            else:
                reply = AIMessage("\n".join(str(m.content) for m in tools))
            return ChatResult(generations=[ChatGeneration(message=reply)])

    return create_deep_agent(model=Scripted())


def peer_runner(graph: Any, asynchronous: bool) -> Callable[[], Awaitable[dict[str, Any]]]:
    from langchain_core.messages import HumanMessage

    async def run() -> dict[str, Any]:
        state = {"messages": [HumanMessage("go")]}
        try:
            if asynchronous:
                result = await graph.ainvoke(state)
            else:
                result = await asyncio.to_thread(graph.invoke, state)
        except Exception as exc:
            return {"completed": False, "reports": 0, "raised": type(exc).__name__}
        text = str(result["messages"][-1].content)
        return {"completed": True, "reports": text.count("report job-")}

    return run


# --- measuring ----------------------------------------------------------------------------------


async def timed(run: Callable[[], Awaitable[dict[str, Any]]]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    outcome = await run()
    return (time.perf_counter() - started) * 1000, outcome


async def measure(
    name: str, spawns: int, size_kib: int, repeats: int, fail: bool, root: Path, peer: bool
) -> dict[str, Any]:
    sides: dict[str, list[float]] = {"ours": [], "deepagents_async": [], "deepagents_sync": []}
    outcomes: dict[str, dict[str, Any]] = {}
    async with Ours(root / name, spawns, size_kib, fail) as ours:
        runners: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {"ours": ours.run}
        if peer:
            graph = peer_graph(spawns, size_kib, fail)
            runners["deepagents_async"] = peer_runner(graph, True)
            runners["deepagents_sync"] = peer_runner(graph, False)
        for side in runners.values():  # warm-up: imports, caches, first SQLite connection
            await side()
        for index in range(repeats):
            order = list(runners.items())
            if index % 2:
                order.reverse()
            for side_name, side in order:
                elapsed, outcome = await timed(side)
                sides[side_name].append(elapsed)
                outcomes[side_name] = outcome
    result: dict[str, Any] = {
        side: {**summary(samples), "outcome": outcomes[side]}
        for side, samples in sides.items()
        if samples
    }
    if peer and not fail:  # a failing run does different work on each side: no ratio
        for variant in ("deepagents_async", "deepagents_sync"):
            result[f"ratio_{variant}_over_ours"] = round(
                result[variant]["median_ms"] / result["ours"]["median_ms"], 3
            )
    return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spawns", type=int, default=8)
    parser.add_argument("--size-kib", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    peer_reason = None
    try:
        import deepagents  # noqa: F401
    except ImportError as exc:
        peer_reason = f"deepagents is not installed ({exc}); pip install '.[bench]'"
    peer = peer_reason is None

    with tempfile.TemporaryDirectory(prefix="bench-subagents-") as tmp:
        root = Path(tmp)
        shapes = {
            "fanout": await measure(
                "fanout", args.spawns, args.size_kib, args.repeats, False, root, peer
            ),
            "single": await measure("single", 1, args.size_kib, args.repeats, False, root, peer),
            "containment": await measure(
                "containment",
                args.spawns,
                args.size_kib,
                max(1, args.repeats // 2),
                True,
                root,
                peer,
            ),
        }
    containment = shapes["containment"]
    result = {
        "benchmark": "subagents",
        "workload": {"spawns": args.spawns, "size_kib": args.size_kib, "repeats": args.repeats},
        "ours": {shape: data["ours"] for shape, data in shapes.items()},
        "peer": {
            shape: {k: v for k, v in data.items() if k != "ours"} for shape, data in shapes.items()
        }
        if peer
        else None,
        "peer_reason": peer_reason,
        "goals": {
            "siblings_survive_a_failing_sub_agent": containment["ours"]["outcome"]["completed"]
            and containment["ours"]["outcome"]["reports"] == args.spawns - 1,
            "no_workspace_left_behind": all(
                data["ours"]["outcome"]["leftover_workspaces"] == 0 for data in shapes.values()
            ),
            "fanout_faster_than_deepagents_async": None
            if not peer
            else shapes["fanout"]["ratio_deepagents_async_over_ours"] > 1.0,
        },
        "versions": {
            "python": platform.python_version(),
            "atmosphere-harness": version("atmosphere-harness"),
            "deepagents": version("deepagents"),
            "langgraph": version("langgraph"),
        },
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    asyncio.run(main())
