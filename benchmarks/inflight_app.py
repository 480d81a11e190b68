"""The app `inflight.py` serves: one `@agent` with the whole default harness, its model from the
environment (`LLM_RUNTIME=openai`, `LLM_BASE_URL` at the fake model), and, when
`BENCH_STATS_DIR` is set, a monitor of the process's event-loop lag and full GC pauses.

uvicorn builds it with `create_app` (a factory: once per worker process). The monitor appends
to `{BENCH_STATS_DIR}/{pid}.txt` every second: `lag <monotonic ns> <us late>` for each tick of
a 10 ms timer, `gc <monotonic ns> <pause us> <objects collected>` for each generation-2
collection. With `BENCH_HEAP_DIR` set, tracemalloc traces the app from its start-up on (after
the imports) and each SIGUSR1 writes a snapshot to `{BENCH_HEAP_DIR}/{pid}-{n}.snapshot` (what
a run in flight holds: the difference of two, see `inflight.py --heap-at`). Benchmark-only:
nothing here is part of the library.
"""

import asyncio
import contextlib
import gc
import os
import signal
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
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


@contextlib.asynccontextmanager
async def monitored(app: FastAPI) -> AsyncIterator[None]:
    heap = os.environ.get("BENCH_HEAP_DIR")
    if heap:
        tracemalloc.start()
        snapshot_on_signal(Path(heap))
    stats = os.environ.get("BENCH_STATS_DIR")
    task = asyncio.get_running_loop().create_task(monitor(Path(stats))) if stats else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()


def create_app() -> FastAPI:
    app = FastAPI(lifespan=monitored)
    app.include_router(create_harness_router(agents=[Bench]))
    return app
