"""The workspace's worker threads behave as `asyncio.to_thread`: context, errors, cancellation,
concurrency, and any event loop."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import time
import weakref

import pytest

from atmosphere_harness._filesystem.workers import WorkerPool

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


async def test_runs_off_the_loop_in_the_callers_context_and_raises_its_errors() -> None:
    pool = WorkerPool(2)
    WHO.set("caller")
    here = threading.get_ident()
    assert await pool.run(lambda: (threading.get_ident() != here, WHO.get())) == (True, "caller")

    def fail() -> None:
        raise KeyError("gone")

    with pytest.raises(KeyError, match="gone"):
        await pool.run(fail)
    assert await pool.run(lambda a, b: a + b, 2, 3) == 5


async def test_blocking_jobs_run_side_by_side_up_to_the_bound() -> None:
    pool = WorkerPool(3)
    started = time.monotonic()
    await asyncio.gather(*(pool.run(time.sleep, 0.3) for _ in range(3)))
    assert time.monotonic() - started < 0.85, "three workers: the sleeps overlap"
    assert pool.threads == 3
    await asyncio.gather(*(pool.run(time.sleep, 0.01) for _ in range(10)))
    assert pool.threads == 3, "never more than the bound"


async def test_a_cancelled_caller_lets_the_work_finish_and_drops_its_result() -> None:
    pool = WorkerPool(1)
    finished = threading.Event()

    def slow() -> str:
        time.sleep(0.2)
        finished.set()
        return "done"

    task = asyncio.create_task(pool.run(slow))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(finished.wait, 5)
    assert await pool.run(lambda: "next") == "next", "the worker is free again"


def test_one_pool_serves_several_event_loops_one_after_another() -> None:
    pool = WorkerPool(2)
    for n in range(3):
        assert asyncio.run(pool.run(lambda n=n: n * 2)) == n * 2


def test_a_result_for_a_closed_loop_is_dropped() -> None:
    pool = WorkerPool(1)
    gate = threading.Event()
    loop = asyncio.new_event_loop()
    task = loop.create_task(pool.run(gate.wait, 5))
    loop.call_soon(loop.stop)
    loop.run_forever()  # the job is queued; its loop then closes before the result
    loop.close()
    gate.set()
    time.sleep(0.1)
    assert asyncio.run(pool.run(lambda: "alive")) == "alive"
    del task


class _Thing:
    def returns(self) -> str:
        return "done"

    def raises(self) -> None:
        raise OSError("no such file")


class _SlowWakingLoop(asyncio.SelectorEventLoop):
    """Holds a worker thread just after it has woken the caller: what a busy machine does when
    the worker loses the CPU (or the GIL, in the wake-up's `send`) at that point."""

    def __init__(self) -> None:
        super().__init__()
        self.checked = threading.Event()

    def call_soon_threadsafe(self, callback, *args, context=None):  # type: ignore[no-untyped-def,override]
        handle = super().call_soon_threadsafe(callback, *args, context=context)
        self.checked.wait(5)
        return handle


@pytest.mark.parametrize("method", ["returns", "raises"])
def test_the_worker_keeps_nothing_of_a_job_once_its_caller_has_woken(method: str) -> None:
    """A caller that drops the last reference to an object after its job (and collects) must
    find it gone, however late the worker thread runs again: a workspace's liveness file is
    removed when the workspace is collected (the flaky sweep test that found this)."""
    pool = WorkerPool(1)
    loop = _SlowWakingLoop()

    async def main() -> bool:
        thing = _Thing()
        alive = weakref.ref(thing)
        try:
            await pool.run(getattr(thing, method))
        except OSError:
            pass
        # The loop's own handle of this step holds the failed future until the step ends.
        await asyncio.sleep(0)
        del thing
        gc.collect()
        loop.checked.set()
        return alive() is not None

    try:
        assert loop.run_until_complete(main()) is False
    finally:
        loop.checked.set()
        loop.close()
