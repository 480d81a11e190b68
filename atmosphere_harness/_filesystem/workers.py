"""The worker threads the workspace's blocking work runs in, and when a small operation may
skip them and run on the event loop.

Every store operation that could wait leaves the event loop for a worker thread (a slow disk
must never stall the loop) and comes back. `run` is `asyncio.to_thread` with only what that hop
needs: one `queue.SimpleQueue` put, the function run in a copy of the caller's context, and one
`call_soon_threadsafe` that settles the asyncio future (no executor lock, semaphore, work item
or chained `concurrent.futures.Future`); on the small writes and edits a turn is made of, that
is a measurable part of each (docs/filesystem-speed.md). Semantics are `asyncio.to_thread`'s:
the caller's context variables are seen by the function, its exception is raised in the caller,
and a cancelled caller does not stop work already begun (it runs to its end; its result is
dropped). Up to `MAX_WORKERS` daemon threads are started as work arrives, so a write still
running when the interpreter exits may be cut short: that leaves at most a temporary file beside
its target (the next walk sweeps it; the target is never torn).

`ON_LOOP` (`LoopBudget`) decides when a small operation (the workspace store's reads, writes and
edits of at most `ON_LOOP_BYTES`) runs on the event loop instead: even this hop costs more than
such an operation's own system calls. What runs on the loop is bounded work in the page cache
that never waits for a lock nor walks a directory; what no rule can bound is the kernel itself
(a busy journal, a page cache full of dirty pages). The budget notices that after the fact: an
on-loop operation that took longer than `SLOW_SECONDS` sends every small operation through the
worker for a cool-down (1 s, doubling up to `COOL_DOWN_SECONDS` while the disk stays slow), so a
slow disk stalls the loop once per cool-down at most. A lone slow operation under
`STALL_SECONDS` is a hiccup: counted, not punished. The time it judges is the wall time less the
time the thread sat runnable waiting for a CPU (on Linux, `/proc/thread-self/schedstat`, read
only after a slow operation): on a busy machine the scheduler preempts the loop's thread in the
middle of any work, which says nothing about the disk.

`later(job)` is for the work an operation leaves behind (closing the file it replaced, making
spare files): it runs in a worker thread after the operation, never inside it. Asked from a
worker thread, the job runs in that thread once the caller has its result; asked from the event
loop, the jobs of the next `LATER_SECONDS` go to one worker together (one wake-up of a thread
per batch instead of one per operation), and a job asked while a batch is being run joins it.
Background work waits while the loop runs small operations back to back or is in the middle of
one (`LoopBudget.busy`, `wait_for_idle`): each system call a worker makes hands the GIL back and
forth with the loop's thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from .._log import get_logger

log = get_logger(__name__)

T = TypeVar("T")

MAX_WORKERS = min(32, (os.cpu_count() or 1) + 4)

ON_LOOP_BYTES = 64 * 1024
"""Largest operation the workspace store runs on the event loop rather than in a worker: a
write of at most this many bytes (a batch's total), a read or an edit of a file of at most this
size. Up to 64 KiB an atomic write's cost hardly depends on its size and stays under a hop's,
so the usual tool call fits; past it the loop would pay for the size."""

SLOW_SECONDS = 0.002
"""An on-loop operation that took longer than this (not counting waits for a CPU) trips the
budget: the disk is slow now, and small operations go through the worker for a cool-down
(`FIRST_COOL_DOWN_SECONDS`, doubling up to `COOL_DOWN_SECONDS`). About ten times an on-loop
operation's usual cost (0.05-0.3 ms), so a normal one does not trip it, and short enough that a
stall is noticed before it matters to other requests."""

FIRST_COOL_DOWN_SECONDS = 1.0
"""How long small operations keep to the worker after a slow one, when none was slow in the
last `COOL_DOWN_SECONDS` (a first slow one alone is a hiccup: `HICCUP_SECONDS`): a short spell
of slowness costs a second of hops, not ten."""

IDLE_SECONDS = 0.002
"""An event loop that ended a small operation within this long is busy (`LoopBudget.busy`):
background work (`later` jobs that loop over system calls) waits for it to pause: each system
call a worker thread makes hands the GIL back and forth with the loop's thread."""

SLICE_SECONDS = 0.001
"""The longest small operations run back to back on the event loop before other tasks get a turn
(`LoopBudget.owes_turn`; a hop, which waits for a worker, is a turn). A turn is a pass of the
event loop (its `epoll` and timers): 10-25 us run cold on a 2-core cloud VM, as much as a small
read, so a lone operation (an edit after a model's reply, or right after a grep) does not pay
one, and a run of hundreds of them still lets other requests in every millisecond."""

IDLE_WAIT_SECONDS = 1.0
"""The longest a background job waits for a pause before it gives up for now (`wait_for_idle`;
it sleeps meanwhile, in steps of `IDLE_SECONDS`): long enough to outlast a burst of operations
(the benchmark's 200 writes, reads and greps take 0.1-0.2 s back to back), short enough that a
loop that never pauses holds one worker thread at most this long per refill."""

LATER_SECONDS = 0.001
"""How long the event loop gathers `later` jobs before one worker thread runs them all: long
enough that a run of operations shares one wake-up of a worker (and that the wake-up falls
after the operation that asked, not inside it), short enough that a replaced file's blocks
are freed and spare files are made again at once."""

HICCUP_SECONDS = 10.0
"""A slow on-loop operation (under `STALL_SECONDS`) that comes this long or more after the
previous slow one is a hiccup: counted (`LoopBudget.hiccups`), logged, and no cool-down; the
second within this long starts one. An ext4 journal commit makes an odd write take 2 ms every
few seconds: without this, each would send the next second's operations through the worker.
A disk that stays slow trips the breaker at its second slow operation instead of its first."""

STALL_SECONDS = 0.01
"""An on-loop operation slower than this starts a cool-down even alone: five times the usual
bound, no hiccup a loop should risk twice."""

COOL_DOWN_SECONDS = 10.0
"""The longest cool-down. Each slow operation that follows the end of the previous cool-down
within this time doubles it (1, 2, 4, 8, 10 s): a stall of the disk lasts seconds (write-back
catching up), so the first operation let back on the loop after a cool-down is a probe, and a
disk that stays slow is probed less and less often, at most once per this long."""

_Job = tuple[
    asyncio.AbstractEventLoop | None,
    "asyncio.Future[Any] | None",
    contextvars.Context,
    Callable[..., Any],
    tuple[Any, ...],
]


def _settle(outcome: list[Any]) -> None:
    """Settle the caller's future from `[future, result, error]`, emptying the list first: the
    worker thread still holds the list, and must not keep the result alive once the caller
    has it (a caller that drops an object and collects garbage expects it gone)."""
    future, result, error = outcome
    outcome.clear()
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _run_jobs(jobs: list[Callable[[], object]]) -> None:
    """Run each of `jobs`; one that fails is logged and the others still run."""
    for job in jobs:
        try:
            job()
        except BaseException:
            log.warning("background workspace work failed", exc_info=True)


_in_worker = threading.local()
"""`_in_worker.after` is the list of `later` jobs of the job a pool worker is running."""


class WorkerPool:
    """Threads that run blocking functions for coroutines on any event loop."""

    def __init__(self, max_workers: int = MAX_WORKERS) -> None:
        if max_workers <= 0:
            raise ValueError("max_workers must be positive")
        self.max_workers = max_workers
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for a job
        self._queued = 0  # jobs put and not yet taken
        self.running = 0
        """Jobs a caller waits for (`run`), running now: background work waits for them."""

    @property
    def threads(self) -> int:
        return self._threads

    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        """`fn(*args)` in a worker thread, awaited (like `asyncio.to_thread`)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._put((loop, future, contextvars.copy_context(), fn, args))
        return await future

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> None:
        """`fn(*args)` in a worker thread, with nobody waiting for it (work made ahead of
        time, such as `spares`); what it raises is logged."""
        self._put((None, None, contextvars.copy_context(), fn, args))

    def _put(self, job: _Job) -> None:
        with self._lock:
            self._queued += 1
            grow = self._queued > self._idle and self._threads < self.max_workers
            if grow:
                self._threads += 1
        self._jobs.put(job)
        if grow:
            threading.Thread(target=self._work, name="atmosphere-fs", daemon=True).start()

    def _work(self) -> None:
        jobs, lock = self._jobs, self._lock
        while True:
            with lock:
                self._idle += 1
            job = jobs.get()
            foreground = job[0] is not None
            with lock:
                self._idle -= 1
                self._queued -= 1
                if foreground:
                    self.running += 1
            loop, future, context, fn, args = job
            del job
            outcome: list[Any] = [future, None, None]
            del future
            after: list[Callable[[], object]] = []
            _in_worker.after = after
            try:
                outcome[1] = context.run(fn, *args)
            except BaseException as exc:
                outcome[2] = exc
            finally:
                _in_worker.after = None
                if foreground:
                    with lock:
                        self.running -= 1
            # Nothing of the job may outlive the caller's wake-up in this thread's frame: the
            # function, its arguments and (through a traceback) its frames' locals.
            del context, fn, args
            if loop is None:  # `submit`: nobody waits
                if outcome[2] is not None:
                    log.warning("background workspace work failed", exc_info=outcome[2])
                del loop, outcome
            else:
                try:
                    loop.call_soon_threadsafe(_settle, outcome)
                except RuntimeError:
                    outcome.clear()  # the caller's loop is closed: nobody is waiting any more
                del loop, outcome
            if after:  # the job's own clean-up, once its caller has the result
                _run_jobs(after)
            if LATER.jobs:  # and any the event loop left for a loop that stopped since
                LATER.run_left()
            del after


class _Schedstat:
    """This thread's `/proc/thread-self/schedstat`, open (closed with the thread's locals)."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.fd = -1

    def __del__(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass


_threads = threading.local()


def cpu_wait() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux's schedstat
    `run_delay`, one `pread`), or 0.0 where the system does not say."""
    stat: _Schedstat | None = getattr(_threads, "schedstat", None)
    if stat is None:
        stat = _threads.schedstat = _Schedstat()
    if stat.fd < 0:
        return 0.0
    try:
        return int(os.pread(stat.fd, 64, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class LoopBudget:
    """Whether a small operation may run on the event loop now (a circuit breaker on time).

    `allows()` is False during a cool-down. `start()` opens one on-loop operation and
    `spent(start, what)` closes it, starting a cool-down if it took longer than `slow` seconds
    of `clock` less the growth of `waited` (the thread's wait for a CPU), unless it is a hiccup:
    under `stall` seconds, with no slow one in the `hiccup` seconds before it nor a cool-down
    in the `longest` seconds before it (the probe after a cool-down is not let pass). A
    cool-down lasts
    `first` seconds, doubled (up to `longest`) when the slow operation came within `longest`
    of the end of the previous one. Used from the event loop's thread only; `clock` and
    `waited` are replaceable (tests).
    """

    def __init__(
        self,
        *,
        slow: float = SLOW_SECONDS,
        first: float = FIRST_COOL_DOWN_SECONDS,
        longest: float = COOL_DOWN_SECONDS,
        hiccup: float = HICCUP_SECONDS,
        stall: float = STALL_SECONDS,
        clock: Callable[[], float] = time.perf_counter,
        waited: Callable[[], float] = cpu_wait,
    ) -> None:
        self.slow = slow
        self.first = first
        self.longest = longest
        self.hiccup = hiccup
        self.stall = stall
        self.clock = clock
        self.waited = waited
        self._until = float("-inf")  # the end of the current (or last) cool-down
        self._length = 0.0  # the length of the last cool-down
        self._last = float("-inf")  # when the last on-loop operation ended (+inf: one runs)
        self._slow_at = float("-inf")  # when the last slow operation ended
        self._turn = float("-inf")  # when other tasks last had a turn (or a run of ops began)
        self.trips = 0
        self.hiccups = 0

    def allows(self) -> bool:
        return self.clock() >= self._until

    def start(self) -> tuple[float, float]:
        now = self.clock()
        if now - self._last >= IDLE_SECONDS:  # not right after another: a new run begins
            self._turn = now
        self._last = float("inf")  # busy until `spent`
        return now, self.waited()

    def owes_turn(self) -> bool:
        """Whether the small operations run back to back on the loop since other tasks last
        had a turn (`turned`) took more than `SLICE_SECONDS`: the one just ended should give
        them one."""
        return self._last - self._turn > SLICE_SECONDS

    def turned(self) -> None:
        """Other tasks had a turn of the loop just now (a yield, or a hop's wait)."""
        self._turn = self.clock()

    def busy(self, within: float = IDLE_SECONDS) -> bool:
        """Whether an on-loop operation is running or ended within the last `within` seconds
        (any thread). Running counts too: a lone operation after a pause (an edit after a
        grep) would otherwise meet background work woken by that pause, each of its system
        calls then handing the GIL to the worker and waiting to get it back."""
        return self.clock() - self._last < within

    def spent(self, start: tuple[float, float], what: str) -> None:
        now = self._last = self.clock()
        took = now - start[0]
        if took <= self.slow:  # (the usual case: no need to read the wait for a CPU again)
            return
        took -= self.waited() - start[1]
        if took <= self.slow:
            return
        still_slow = now - self._until < self.longest
        lone = not still_slow and took <= self.stall and now - self._slow_at >= self.hiccup
        self._slow_at = now
        if lone:
            self.hiccups += 1
            log.debug(
                "a workspace operation on the event loop was slow once; no cool-down yet",
                operation=what,
                took_ms=round(took * 1000, 3),
            )
            return
        self._length = min(self._length * 2, self.longest) if still_slow else self.first
        self._until = now + self._length
        self.trips += 1
        log.debug(
            "a workspace operation on the event loop was slow; small operations use the "
            "worker threads for a while",
            operation=what,
            took_ms=round(took * 1000, 3),
            cool_down_s=self._length,
        )


class Later:
    """The `later` jobs asked from event loops, run by one worker-thread job per batch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.jobs: list[Callable[[], object]] = []
        # The loop whose timer will run the jobs (weakly: a closed loop's timer never fires).
        self._armed: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._running = 0  # batches being run by worker threads now

    def add(self, job: Callable[[], object]) -> None:
        after: list[Callable[[], object]] | None = getattr(_in_worker, "after", None)
        if after is not None:
            after.append(job)
            return
        if self._running:
            with self._lock:
                if self._running:  # a batch is being run: it takes this job next
                    self.jobs.append(job)
                    return
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            self.jobs.append(job)
            armed = self._armed() if self._armed is not None else None
            arm = loop is None or armed is not loop
            if arm and loop is not None:
                self._armed = weakref.ref(loop)
        if not arm:
            return
        if loop is None:
            POOL.submit(self.run)
        else:
            loop.call_later(LATER_SECONDS, self._due, loop)

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            if self._armed is not None and self._armed() is loop:
                self._armed = None
            if not self.jobs:
                return
        POOL.submit(self.run)

    def run_left(self) -> None:
        """Run jobs left behind (asked from a loop that stopped before its timer fired), unless
        a batch being run will take them (in a worker thread, after its own job)."""
        if self.jobs and not self._running:
            self.run()

    def run(self) -> None:
        """Run the jobs gathered so far (in a worker thread), then those added meanwhile: a job
        asked while a batch runs joins it (no timer on the loop, no other worker woken). Such
        jobs wait for a pause of the loop anyway (`wait_for_idle`), so waiting for the batch's
        earlier jobs changes little."""
        with self._lock:
            self._running += 1
        try:
            while True:
                with self._lock:
                    jobs, self.jobs = self.jobs, []
                    if not jobs:
                        self._running -= 1
                        return
                _run_jobs(jobs)
        except BaseException:  # (`_run_jobs` catches what a job raises: only its logging)
            with self._lock:
                self._running -= 1
            raise


POOL = WorkerPool()
"""The process's pool (a forked child starts with a fresh, empty one)."""

LATER = Later()
"""The process's `later` jobs (a forked child starts with none: its parent's are its own)."""

ON_LOOP = LoopBudget()
"""The process's budget for on-loop operations (one disk, one budget)."""


def _forked() -> None:
    global POOL, ON_LOOP, LATER, _threads
    POOL = WorkerPool()
    ON_LOOP = LoopBudget()
    LATER = Later()
    _threads = threading.local()  # the parent's schedstat file is its own thread's


os.register_at_fork(after_in_child=_forked)


async def run(fn: Callable[..., T], /, *args: Any) -> T:
    """`fn(*args)` in one of the process's worker threads (see the module docstring)."""
    try:
        return await POOL.run(fn, *args)
    finally:
        ON_LOOP.turned()  # the loop ran other tasks while it waited


def wait_for_idle(deadline: float, *, operations: bool = True) -> bool:
    """In a worker thread, before a step of background work: wait, without the GIL, while the
    event loop runs small operations back to back (`LoopBudget.busy`) and, with `operations`,
    while a worker thread runs an operation someone waits for (a grep, a batch: the background
    step would take the GIL from it too). False, at once, when still busy at `deadline` (a
    `time.monotonic()`): the caller leaves the rest of its work for later."""
    while ON_LOOP.busy() or (operations and POOL.running):
        if time.monotonic() >= deadline:
            return False
        time.sleep(IDLE_SECONDS)
    return True


def later(job: Callable[[], object]) -> None:
    """Run `job` in a worker thread after the current operation, without making it wait (see
    the module docstring); what it raises is logged. From any thread."""
    LATER.add(job)
