"""The app `inflight.py` serves: one `@agent` with the whole default harness, its model from the
environment (`LLM_RUNTIME=openai`, `LLM_BASE_URL` at the fake model), and, when
`BENCH_STATS_DIR` is set, a monitor of the process's event-loop lag and full GC pauses.

uvicorn builds it with `create_app` (a factory: once per worker process). The monitor appends
to `{BENCH_STATS_DIR}/{pid}.txt` every second: `lag <monotonic ns> <us late>` for each tick of
a 10 ms timer, `gc <monotonic ns> <pause us> <objects collected>` for each generation-2
collection. With `BENCH_HEAP_DIR` set, tracemalloc traces the app from its start-up on (after
the imports) and each SIGUSR1 writes a snapshot to `{BENCH_HEAP_DIR}/{pid}-{n}.snapshot` (what
a run in flight holds: the difference of two, see `inflight.py --heap-at`). With
`BENCH_STATS_DIR` set, each SIGUSR2 writes a census to `{BENCH_STATS_DIR}/{pid}-census-{n}.json`:
how long one full collection (`gc.collect(2)`) took, then every object the collector tracks
(what `gc.freeze()` froze at start-up is out of its view) by type, the closures' cells by the
function that holds them, the coroutines by their code and the bound methods by function (see
`inflight.py --census-at`). Benchmark-only: nothing here is part of the library.
"""

import asyncio
import contextlib
import gc
import json
import os
import signal
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from types import CoroutineType, FunctionType, MethodType
from typing import Any

from fastapi import FastAPI

from atmosphere_harness import StreamingSession, agent, create_harness_router, prompt

AGENT = "bench"
LAG_PERIOD = 0.01


@agent(name=AGENT)
class Bench:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


async def monitor(directory: Path) -> None:
    """Event-loop lag and full GC pauses, appended to `{directory}/{pid}.txt` every second."""
    lines: list[str] = []
    started = [0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            started[0] = time.monotonic_ns()
        else:
            took = (time.monotonic_ns() - started[0]) // 1000
            lines.append(f"gc {time.monotonic_ns()} {took} {info.get('collected', 0)}")

    gc.callbacks.append(on_gc)
    loop = asyncio.get_running_loop()
    flushed = loop.time()
    try:
        with (directory / f"{os.getpid()}.txt").open("a", encoding="ascii") as out:
            while True:
                before = loop.time()
                await asyncio.sleep(LAG_PERIOD)
                late = loop.time() - before - LAG_PERIOD
                lines.append(f"lag {time.monotonic_ns()} {max(0, round(late * 1e6))}")
                if loop.time() - flushed >= 1.0:
                    out.write("\n".join(lines) + "\n")
                    out.flush()
                    lines.clear()
                    flushed = loop.time()
    finally:
        gc.callbacks.remove(on_gc)


def snapshot_on_signal(directory: Path) -> None:
    """SIGUSR1: a tracemalloc snapshot to `directory` (numbered per process)."""
    taken = [0]

    def take() -> None:
        taken[0] += 1
        tracemalloc.take_snapshot().dump(str(directory / f"{os.getpid()}-{taken[0]}.snapshot"))

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, take)


def census() -> dict[str, Any]:
    """One full collection timed, then the tracked objects by type (and where the cells and
    coroutines come from)."""
    started = time.perf_counter()
    gc.collect(2)
    full_gc_ms = (time.perf_counter() - started) * 1000
    types: Counter[str] = Counter()
    cells: Counter[str] = Counter()
    coroutines: Counter[str] = Counter()
    methods: Counter[str] = Counter()
    objects = gc.get_objects()
    for obj in objects:
        kind = type(obj)
        module = kind.__module__
        types[kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"] += 1
        if kind is FunctionType and obj.__closure__:
            cells[f"{obj.__module__}.{obj.__qualname__}"] += len(obj.__closure__)
        elif kind is MethodType:
            methods[f"{obj.__module__}.{obj.__qualname__}"] += 1
        elif kind is CoroutineType:
            code = obj.cr_code
            coroutines[f"{code.co_filename.split('site-packages/')[-1]}:{code.co_qualname}"] += 1
    return {
        "full_gc_ms": round(full_gc_ms, 2),
        "tracked": len(objects),
        "frozen": gc.get_freeze_count(),
        "types": dict(types),
        "cells_by_closure": dict(cells),
        "coroutines": dict(coroutines),
        "methods": dict(methods),
    }


def census_on_signal(directory: Path) -> None:
    """SIGUSR2: a census (`census`) to `directory` (numbered per process)."""
    taken = [0]

    def take() -> None:
        taken[0] += 1
        found = census()
        path = directory / f"{os.getpid()}-census-{taken[0]}.json"
        path.write_text(json.dumps(found), encoding="ascii")

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, take)


@contextlib.asynccontextmanager
async def monitored(app: FastAPI) -> AsyncIterator[None]:
    heap = os.environ.get("BENCH_HEAP_DIR")
    if heap:
        tracemalloc.start()
        snapshot_on_signal(Path(heap))
    stats = os.environ.get("BENCH_STATS_DIR")
    task = asyncio.get_running_loop().create_task(monitor(Path(stats))) if stats else None
    if stats:
        census_on_signal(Path(stats))
    try:
        yield
    finally:
        if task is not None:
            task.cancel()


def create_app() -> FastAPI:
    app = FastAPI(lifespan=monitored)
    app.include_router(create_harness_router(agents=[Bench]))
    return app
