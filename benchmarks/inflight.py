"""Long runs in flight: how many slow-streaming runs one replica holds at p99 frame delay < 100 ms.

    python benchmarks/inflight.py [--levels 100,200,400,...] [--variants embedded,postgres,...]
        [--tokens-per-s 20] [--seconds 30] [--tool-call] [--threshold-ms 100]
        [--profile-at N] [--heap-at N] [--census-at N] [--server-env KEY=VALUE ...] [--pin]
        [--smoke]

Three kinds of process on loopback, so no side's CPU is counted as another's:

- **the model**: a fake OpenAI-compatible server (`--fake`, raw asyncio, uvloop when installed)
  that streams each answer slowly, `--tokens-per-s` tokens for `--seconds` (default 20/s for
  30 s: 600 tokens), every token's text `~T<monotonic ns>~ ` stamped as it is written to the
  socket. With `--tool-call` the first answer stops half-way with a call of `ls`, and the answer
  to the tool result streams the other half. Streams are spread over a 5 ms wheel, so the model
  sends its tokens evenly, not in bursts;
- **the server**: the harness app (`create_app`: one `@agent`, the whole default harness) under
  uvicorn, its model `LLM_RUNTIME=openai` pointed at the fake (the real `openai` SDK, as a user
  configures it from the environment). By default one process on asyncio + h11 (what a plain
  `pip install uvicorn` serves); variants add PostgreSQL or Redis (each on its own fresh
  database or key prefix), durable runs, several uvicorn worker processes (`--workers`, the
  state shared through the backend) and uvloop + httptools. Inside, a timer every 10 ms records
  how late it fires (event-loop lag) and `gc.callbacks` the full collections' pauses, into a file
  per process the benchmark reads;
- **the clients**: `--clients` processes (raw asyncio sockets, uvloop when installed) that open
  N runs (`POST P`, SSE) spread over the first `--ramp-seconds`, and for every `text` frame
  record the delay from the model's stamp to the frame's arrival (CLOCK_MONOTONIC is one clock
  for every process on Linux).

For each level N (a fresh server each, after a warm-up), measured over the steady window (every run
streaming: from the end of the ramp to the first run's last token): frame delay p50/p99/max, the
server's CPU per streamed token (and the kernel's part of it: the sockets' system calls) and share
of a core (`/proc/<pid>/stat` of every server process), resident memory added per run in flight
(`VmRSS`, every server process, against the same server before the level), event-loop lag
p50/p99/max and full GC pauses, errors (runs that ended in an `error` frame, broke off, or never
finished), and the load generators' own CPU (the model's and the clients': they must not be the
bottleneck). A variant's ramp stops at the first level whose p99 passes `--threshold-ms` or that
has errors; `held` is the largest level before.

`--profile-at N` records the server with py-spy (installed in the running Python's environment,
`pip install py-spy`) during the steady window of level N of the first variant: the raw stacks go
to `--profile-out` and the JSON gives where the CPU went (by the package of the innermost frame,
and the share of samples with each package anywhere on the stack).

`--heap-at N` runs level N of the first variant with tracemalloc on in the server (from the
app's start-up; slower: its delays mean nothing) and takes a snapshot before the runs
start and one in the middle of the window; the JSON gives what was added per run in flight, by
the source line that allocated it (the largest first).

`--census-at N` counts, at level N of the first variant, the objects the server's garbage
collector tracks (what `gc.freeze()` froze at start-up is out of its view) before the runs start
and in the middle of the window, each after one full collection (`gc.collect(2)`) it times: the
JSON gives `tracked_objects_per_run` (the difference over N), the types that grew most per run,
the closures' cells and the coroutines per run by where they come from, and `full_gc_ms` (that
one collection, with N runs in flight). Counts: the machine's load does not move them.

`--pin` gives the server one core of its own: every server process (all its threads, every
worker) runs on the first CPU this process may use, the model and the clients on the others
(`sched_setaffinity`), so the server's CPU a token and the runs one server core holds are
measured without the load generators competing for that core (other processes of the machine
still may). The JSON then says which cores, and each level gives `runs_a_core_at_this_cost`: the
runs one core would hold at that level's CPU a token if it did nothing else.

`--smoke` is a quick check that everything runs (tiny levels, short streams); its figures mean
nothing. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parent
AGENT = "bench"
PATH = f"/atmosphere/agent/{AGENT}"
PG = "postgresql://postgres@127.0.0.1:5432"
REDIS = "redis://127.0.0.1:6379/15"
STAMP = re.compile(rb"~T(\d+)~")
TICK = 0.005
"""The fake model's wheel: every 5 ms it writes the tokens due (streams spread over its slots)."""
LAG_PERIOD = 0.01
"""The server's lag timer: it sleeps 10 ms and records how much later than that it woke."""


def raise_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the `finally` blocks stop the servers this started."""

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)


def fast_loop() -> None:
    """uvloop for the load generators (the model and the clients) when it is installed."""
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def now_ns() -> int:
    return time.monotonic_ns()


# --- the fake model ---------------------------------------------------------------------------

CHUNK = (
    'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,'
    '"model":"fake","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}\n\n'
)
USAGE = (
    'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,"model":"fake",'
    '"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":%d,"total_tokens":%d}}\n\n'
    "data: [DONE]\n\n"
)
RESPONSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n"
)


def http_chunk(text: str) -> bytes:
    data = text.encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass
class Answer:
    """One streamed answer: `tokens` stamped tokens, then a stop (or a call of `ls`)."""

    transport: asyncio.Transport
    tokens: int
    tool_call: bool
    sent: int = 0

    def emit(self) -> bool:
        """Write the next token; False once the answer is complete (or its reader is gone)."""
        if self.transport.is_closing():
            return False
        if self.sent < self.tokens:
            role = '"role":"assistant",' if self.sent == 0 else ""
            delta = f'{{{role}"content":"~T{now_ns()}~ "}}'
            self.transport.write(http_chunk(CHUNK % (delta, "null")))
            self.sent += 1
            return True
        if self.tool_call:
            call = json.dumps(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_" + uuid.uuid4().hex[:12],
                            "type": "function",
                            "function": {"name": "ls", "arguments": '{"path": "/"}'},
                        }
                    ]
                }
            )
            end = CHUNK % (call, "null") + CHUNK % ("{}", '"tool_calls"')
        else:
            end = CHUNK % ("{}", '"stop"')
        end += USAGE % (self.sent, self.sent + 100)
        self.transport.write(http_chunk(end) + b"0\r\n\r\n")
        return False


class Wheel:
    """Answers spread over the slots of one token interval; a 5 ms tick writes one slot's."""

    def __init__(self, tokens_per_s: float) -> None:
        self.slots: list[list[Answer]] = [[] for _ in range(max(1, round(1 / tokens_per_s / TICK)))]
        self.index = 0
        self.written = 0

    def add(self, answer: Answer) -> None:
        # The slot after the current one: the first token leaves within a tick.
        self.slots[(self.index + 1) % len(self.slots)].append(answer)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due += TICK
            await asyncio.sleep(max(0.0, due - loop.time()))
            # Late ticks catch up: every slot whose time has come is written, in order.
            while True:
                self.index = (self.index + 1) % len(self.slots)
                slot = self.slots[self.index]
                if slot:
                    kept = [answer for answer in slot if answer.emit()]
                    self.written += len(slot)
                    self.slots[self.index] = kept
                if loop.time() < due + TICK:
                    break
                due += TICK


class FakeModel(asyncio.Protocol):
    """`POST /v1/chat/completions` over HTTP/1.1 keep-alive, answered on the wheel."""

    def __init__(self, wheel: Wheel, tokens: int, tool_call: bool) -> None:
        self.wheel = wheel
        self.tokens = tokens
        self.tool_call = tool_call
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).lower()
            match = re.search(rb"content-length:\s*(\d+)", head)
            length = int(match.group(1)) if match else 0
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            self.answer(json.loads(body) if body else {})

    def answer(self, request: dict[str, Any]) -> None:
        assert self.transport is not None
        self.transport.write(RESPONSE_HEAD)
        messages = request.get("messages") or []
        last_user = next(
            (m.get("content") for m in reversed(messages) if m.get("role") == "user"), ""
        )
        if str(last_user).startswith("now"):
            # A short run measured for its latency: the whole answer in one write, at once; a
            # `now tool` prompt's first answer is the call of `ls`.
            wants_call = "tool" in str(last_user) and not any(
                m.get("role") == "tool" for m in messages
            )
            answer = Answer(self.transport, 0 if wants_call else 3, wants_call)
            while answer.emit():
                pass
            return
        if not request.get("tools") or str(last_user).startswith("short"):
            # Memory extraction (no tools) or a warm-up prompt: a few tokens, no call.
            self.wheel.add(Answer(self.transport, 3, False))
            return
        if self.tool_call:
            after_tool = any(m.get("role") == "tool" for m in messages)
            half = self.tokens // 2
            if after_tool:
                self.wheel.add(Answer(self.transport, self.tokens - half, False))
            else:
                self.wheel.add(Answer(self.transport, half, True))
            return
        self.wheel.add(Answer(self.transport, self.tokens, False))


def serve_fake(port: int, tokens_per_s: float, seconds: float, tool_call: bool) -> None:
    raise_file_limit()
    fast_loop()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        wheel = Wheel(tokens_per_s)
        tokens = max(1, round(tokens_per_s * seconds))
        server = await loop.create_server(
            lambda: FakeModel(wheel, tokens, tool_call), "127.0.0.1", port, backlog=4096
        )
        print("READY", flush=True)
        async with server:
            await wheel.run()

    asyncio.run(main())


# --- the server -------------------------------------------------------------------------------


def serve(port: int, workers: int, fast: bool) -> None:
    import uvicorn

    raise_file_limit()
    uvicorn.run(
        "inflight_app:create_app",
        factory=True,
        app_dir=str(HERE),
        host="127.0.0.1",
        port=port,
        workers=workers if workers > 1 else None,
        loop="uvloop" if fast else "asyncio",
        http="httptools" if fast else "h11",
        log_level="warning",
        access_log=False,
        backlog=4096,
        timeout_keep_alive=60,
    )


# --- the clients ------------------------------------------------------------------------------


class Stream(asyncio.Protocol):
    """One run: `POST P` over a fresh connection, the chunked SSE body read as it comes."""

    def __init__(
        self,
        request: bytes,
        done: asyncio.Future[str],
        delays: array.array[int] | None = None,
        steady: tuple[array.array[int], int, int] | None = None,
        from_open: array.array[int] | None = None,
        peer: bool = False,
    ) -> None:
        self.request = request
        self.delays = delays if delays is not None else array.array("q")
        self.steady = steady
        """The delays of frames the model stamped inside the window (start, end ns)."""
        self.from_open = from_open
        """The delays of frames the model stamped after the response's head arrived (a
        follower's, without the replay of what was sent before it attached)."""
        self.opened = 0
        self.peer = peer
        """A LangGraph API stream: tokens in `messages` events, the run's end is the body's."""
        self.newest = 0
        self.done = done
        self.raw = bytearray()
        self.body = bytearray()
        self.state = "head"
        self.size = 0
        self.frames = 0
        self.sep = b"\r\n\r\n"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result("broken")

    def data_received(self, data: bytes) -> None:
        arrived = now_ns()
        self.raw += data
        raw = self.raw
        while True:
            if self.state == "head":
                end = raw.find(b"\r\n\r\n")
                if end < 0:
                    return
                status = bytes(raw[: raw.find(b"\r\n")])
                if b" 200 " not in status:
                    self.finish(f"http {status.decode(errors='replace')}")
                    return
                del raw[: end + 4]
                self.opened = arrived
                self.state = "size"
            elif self.state == "size":
                end = raw.find(b"\r\n")
                if end < 0:
                    return
                self.size = int(bytes(raw[:end]).split(b";")[0], 16)
                del raw[: end + 2]
                if self.size == 0:
                    self.finish("complete" if self.peer else "ended")
                    return
                self.state = "data"
            else:
                if len(raw) < self.size + 2:
                    return
                self.body += raw[: self.size]
                del raw[: self.size + 2]
                self.state = "size"
                self.events(arrived)

    def events(self, arrived: int) -> None:
        body = self.body
        while True:
            end = body.find(self.sep)
            if end < 0:
                if self.sep == b"\r\n\r\n" and body.find(b"\n\n") >= 0:
                    self.sep = b"\n\n"
                    continue
                return
            event = bytes(body[:end])
            del body[: end + len(self.sep)]
            head = event[:40]  # `id: <seq>` then `event: <type>`
            if self.peer:
                if b"event: error" in event[:60]:
                    self.finish("error: " + event[-200:].decode(errors="replace"))
                    return
                # The newest stamp of an event is its token (a peer may repeat the message).
                stamps = STAMP.findall(event)
                newest = max((int(stamp) for stamp in stamps), default=0)
                if newest > self.newest:
                    self.newest = newest
                    self.record(arrived, newest)
            elif b"event: text" in head:
                match = STAMP.search(event)
                if match:
                    self.record(arrived, int(match.group(1)))
            elif b"event: complete" in head:
                self.finish("complete")
                return
            elif b"event: error" in head:
                self.finish("error: " + event[-200:].decode(errors="replace"))
                return

    def record(self, arrived: int, stamp: int) -> None:
        delay = (arrived - stamp) // 1000
        self.delays.append(delay)
        if self.steady is not None and self.steady[1] <= stamp <= self.steady[2]:
            self.steady[0].append(delay)
        if self.from_open is not None and stamp >= self.opened:
            self.from_open.append(delay)
        self.frames += 1

    def finish(self, outcome: str) -> None:
        if not self.done.done():
            self.done.set_result(outcome)
        self.transport.close()


def follow_bytes(port: int, path: str, conversation: str) -> bytes:
    """`GET P/conversations/{id}/events`: follow a conversation's run (on any replica)."""
    return (
        f"GET {path}/conversations/{conversation}/events HTTP/1.1\r\n"
        f"host: 127.0.0.1:{port}\r\naccept: text/event-stream\r\nconnection: close\r\n\r\n"
    ).encode()


def request_bytes(port: int, path: str, message: str, conversation: str) -> bytes:
    body = json.dumps({"message": message, "conversationId": conversation}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"accept: text/event-stream\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def request_for(protocol: str, port: int, message: str) -> bytes:
    """A run on a new conversation: ours (`POST P`) or a peer's (LangGraph API)."""
    if protocol == "ours":
        return request_bytes(port, PATH, message, f"run-{uuid.uuid4().hex[:12]}")
    from peers import agent_protocol_request

    return agent_protocol_request(port, message, str(uuid.uuid4()))


def run_client(spec_path: str) -> None:
    """One client process: its share of the level's runs, results to the spec's `out`."""
    raise_file_limit()
    fast_loop()
    spec = json.loads(Path(spec_path).read_text())
    delays: array.array[int] = array.array("q")
    steady: array.array[int] = array.array("q")
    window = (steady, spec["window"][0], spec["window"][1])

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        outcomes: dict[str, int] = {}
        lag_max = [0.0]

        async def lag() -> None:
            while True:
                before = loop.time()
                await asyncio.sleep(LAG_PERIOD)
                lag_max[0] = max(lag_max[0], loop.time() - before - LAG_PERIOD)

        async def one(index: int) -> None:
            start = spec["t0"] + index * spec["spacing_ns"]
            await asyncio.sleep(max(0.0, (start - now_ns()) / 1e9))
            done: asyncio.Future[str] = loop.create_future()
            peer = spec["protocol"] != "ours"
            data = request_for(spec["protocol"], spec["port"], spec["message"])
            try:
                await loop.create_connection(
                    lambda: Stream(data, done, delays, window, peer=peer),
                    "127.0.0.1",
                    spec["port"],
                )
                left = max(1.0, (spec["deadline"] - now_ns()) / 1e9)
                outcome = await asyncio.wait_for(done, left)
            except TimeoutError:
                outcome = "unfinished"
            except OSError as exc:
                outcome = f"connect: {exc.__class__.__name__}"
            key = outcome.split(":")[0]
            outcomes[key] = outcomes.get(key, 0) + 1
            if key != "complete" and len(spec.setdefault("samples", [])) < 3:
                spec["samples"].append(outcome[:300])

        watcher = loop.create_task(lag())
        await asyncio.gather(*(one(index) for index in spec["indices"]))
        watcher.cancel()
        return {
            "outcomes": outcomes,
            "samples": spec.get("samples", []),
            "lag_max_ms": round(lag_max[0] * 1000, 1),
        }

    result = asyncio.run(main())
    with open(spec["out"] + ".delays", "wb") as out:
        delays.tofile(out)
    with open(spec["out"] + ".window", "wb") as out:
        steady.tofile(out)
    Path(spec["out"]).write_text(json.dumps(result))


# --- measuring --------------------------------------------------------------------------------


def cpu_ticks(pid: int, *, kernel_only: bool = False) -> int:
    """utime + stime of `pid` (clock ticks; only stime, the kernel's part, with
    `kernel_only`), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[12]) + (0 if kernel_only else int(fields[11]))


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def tree(pid: int) -> list[int]:
    pids = [pid]
    for child in children(pid):
        pids += tree(child)
    return pids


def pin(pid: int, cores: set[int] | None) -> None:
    """Every thread of `pid` and of its children on `cores` (threads made later inherit it)."""
    if not cores:
        return
    for each in tree(pid):
        with contextlib.suppress(OSError):
            for thread in Path(f"/proc/{each}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(thread.name), cores)


def split_cores() -> tuple[set[int], set[int]]:
    """`--pin`: the first CPU this process may use for the server, the others for the load."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise SystemExit("--pin needs at least two CPUs")
    return {allowed[0]}, set(allowed[1:])


def machine_idle() -> tuple[int, int]:
    """(idle, total) jiffies of every core, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return values[3] + values[4], sum(values)


TICKS = os.sysconf("SC_CLK_TCK")


def percentile(ordered: Any, q: float) -> float:
    if not len(ordered):
        return math.nan
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> dict[str, float | None]:
    ordered = sorted(values)
    if not ordered:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    return {
        "p50": round(percentile(ordered, 0.5) / scale, digits),
        "p99": round(percentile(ordered, 0.99) / scale, digits),
        "max": round(ordered[-1] / scale, digits),
        "n": len(ordered),
    }


def read_monitor(directory: Path, start: int, end: int) -> dict[str, Any]:
    lags: list[float] = []
    pauses: list[tuple[int, int]] = []
    for path in directory.glob("*.txt"):
        for line in path.read_text(encoding="ascii").splitlines():
            parts = line.split()
            if len(parts) < 3 or not start <= int(parts[1]) <= end:
                continue
            if parts[0] == "lag":
                lags.append(float(parts[2]))
            elif parts[0] == "gc":
                pauses.append((int(parts[2]), int(parts[3])))
    return {
        "loop_lag_ms": spread(lags, 1000.0),
        "gc_full": {
            "count": len(pauses),
            "max_ms": round(max((p for p, _ in pauses), default=0) / 1000, 1),
            "total_ms": round(sum(p for p, _ in pauses) / 1000, 1),
            "collected": sum(c for _, c in pauses),
        },
    }


# --- processes --------------------------------------------------------------------------------


def environment(extra: dict[str, str]) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ATMOSPHERE_", "LLM_", "OPENAI_", "BENCH_"))
    }
    path = os.pathsep.join(filter(None, [str(HERE), str(HERE.parent), env.get("PYTHONPATH")]))
    return {**env, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the process serving port {port} exited ({process.returncode})")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(15)


@dataclass
class Variant:
    name: str
    backend: str = "embedded"  # embedded | postgres | redis | aegra | aegra_redis
    durable: bool = False
    workers: int = 1
    fast: bool = False
    tool_call: bool = False


VARIANTS = {
    variant.name: variant
    for variant in (
        Variant("embedded"),
        Variant("embedded_durable", durable=True),
        Variant("postgres", "postgres"),
        Variant("postgres_durable", "postgres", durable=True),
        Variant("redis", "redis"),
        Variant("redis_durable", "redis", durable=True),
        Variant("postgres_2_workers", "postgres", workers=2),
        Variant("redis_2_workers", "redis", workers=2),
        Variant("embedded_uvloop_httptools", fast=True),
        # The recommended serving: uvloop + httptools, a worker per core, the state shared.
        Variant("postgres_2_workers_uvloop_httptools", "postgres", workers=2, fast=True),
        Variant("redis_2_workers_uvloop_httptools", "redis", workers=2, fast=True),
        Variant("embedded_tool_call", tool_call=True),
        # The peer on the same workload: Aegra on PostgreSQL, and with its Redis broker.
        Variant("aegra", "aegra"),
        Variant("aegra_redis", "aegra_redis"),
    )
}


@dataclass
class Backend:
    """A fresh PostgreSQL database and/or Redis key prefix for one variant (dropped afterwards).

    `kind`: `embedded` (nothing), `postgres`, `redis`, or a peer's (`aegra`: a database;
    `aegra_redis`: a database and a Redis prefix)."""

    kind: str
    env: dict[str, str] = field(default_factory=dict)
    name: str = ""
    database_url: str = ""
    redis_url: str | None = None

    @property
    def uses_postgres(self) -> bool:
        return self.kind in ("postgres", "aegra", "aegra_redis")

    @property
    def uses_redis(self) -> bool:
        return self.kind in ("redis", "aegra_redis")

    def __enter__(self) -> Backend:
        self.name = f"atmo_inflight_{uuid.uuid4().hex[:10]}"
        if self.uses_postgres:
            admin(f'CREATE DATABASE "{self.name}"')
            self.database_url = f"{PG}/{self.name}"
            self.env["ATMOSPHERE_POSTGRES_URL"] = self.database_url
        if self.uses_redis:
            self.redis_url = REDIS
            self.env["ATMOSPHERE_REDIS_URL"] = f"{REDIS}?key_prefix={self.name}:"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.uses_postgres:
            admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        if self.uses_redis:
            import redis

            client = redis.Redis.from_url(REDIS)
            try:
                for key in client.scan_iter(match=self.name + ":*", count=1000):
                    client.unlink(key)
            finally:
                client.close()


def admin(statement: str) -> None:
    import asyncpg

    async def run() -> None:
        connection = await asyncpg.connect(f"{PG}/test", timeout=5)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(run())


class Served:
    """A server process and its children: their CPU and memory, and a stop."""

    process: subprocess.Popen[bytes]
    log: Any

    def pids(self) -> list[int]:
        return tree(self.process.pid)

    def cpu(self, *, kernel_only: bool = False) -> int:
        """CPU clock ticks of every process of the server so far (`cpu_ticks`)."""
        return sum(cpu_ticks(pid, kernel_only=kernel_only) for pid in self.pids())

    def rss(self) -> int:
        return sum(rss_bytes(pid) for pid in self.pids())

    def close(self) -> None:
        stop(self.process)
        self.log.close()


class Server(Served):
    """The harness app under uvicorn (one process or a master and its workers)."""

    protocol = "ours"

    def __init__(self, variant: Variant, model_port: int, env: dict[str, str], root: Path) -> None:
        self.port = free_port()
        self.stats = root / f"stats-{uuid.uuid4().hex[:6]}"
        self.stats.mkdir(parents=True)
        workspace = root / "workspace"
        workspace.mkdir(exist_ok=True)
        self.log = (root / "server.log").open("ab")
        env = environment(
            {
                **env,
                "ATMOSPHERE_WORKSPACE_ROOT": str(workspace),
                "ATMOSPHERE_AI_CONVERSATION_IDLE_TIMEOUT": "0",
                "ATMOSPHERE_DURABLE_RUNS_ENABLED": "true" if variant.durable else "false",
                "LLM_RUNTIME": "openai",
                "LLM_MODEL": "fake",
                "LLM_BASE_URL": f"http://127.0.0.1:{model_port}/v1",
                "LLM_API_KEY": "unused",
                "BENCH_STATS_DIR": str(self.stats),
            }
        )
        command = [
            sys.executable,
            __file__,
            "--serve",
            str(self.port),
            str(variant.workers),
            "fast" if variant.fast else "plain",
        ]
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=self.log)
        self.workers = variant.workers
        try:
            wait_for_port(self.port, self.process)
            self.wait_for_workers()
        except BaseException:
            self.close()
            raise

    def wait_for_workers(self, timeout: float = 60.0) -> None:
        """Every worker has started its monitor (its first lines written)."""
        deadline = time.monotonic() + timeout
        while len(list(self.stats.glob("*.txt"))) < self.workers:
            if time.monotonic() > deadline:
                raise RuntimeError("the server's workers did not start")
            time.sleep(0.1)


def warm_up(port: int, protocol: str = "ours") -> None:
    """A few short runs (imports, first connections, prepared statements) before a level."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for index in range(6):
            done: asyncio.Future[str] = loop.create_future()
            data = request_for(protocol, port, "short warm-up")
            await loop.create_connection(
                lambda d=data, f=done: Stream(d, f, peer=protocol != "ours"), "127.0.0.1", port
            )
            outcome = await asyncio.wait_for(done, 60)
            if outcome != "complete":
                raise RuntimeError(f"warm-up run {index} did not complete: {outcome}")

    asyncio.run(run())


@dataclass
class Settings:
    tokens_per_s: float
    seconds: float
    ramp_seconds: float
    threshold_ms: float
    clients: int
    per_client: int
    root: Path
    server_env: dict[str, str] = field(default_factory=dict)
    server_cores: set[int] | None = None
    load_cores: set[int] | None = None


def measure_level(
    n: int,
    server: Any,
    model: subprocess.Popen[bytes],
    settings: Settings,
    profile: Path | None = None,
    heap: Path | None = None,
    census: bool = False,
) -> dict[str, Any]:
    """N runs at once on `server`; the steady window's figures."""
    clients = max(1, min(settings.clients, math.ceil(n / settings.per_client)))
    t0 = now_ns() + 1_500_000_000  # the clients have started by then
    ramp_ns = int(settings.ramp_seconds * 1e9)
    spacing = ramp_ns // max(1, n)
    stream_ns = int(settings.seconds * 1e9)
    window = (t0 + ramp_ns + 1_000_000_000, t0 + stream_ns)
    if window[1] - window[0] < 1_000_000_000:
        window = (t0 + ramp_ns, t0 + ramp_ns + stream_ns)
    deadline = t0 + ramp_ns + 3 * stream_ns + 30_000_000_000
    tag = uuid.uuid4().hex[:8]
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    for index in range(clients):
        out = settings.root / f"client-{tag}-{index}.json"
        spec = {
            "port": server.port,
            "protocol": server.protocol,
            "message": "stream please",
            "tag": f"{tag}-{index}",
            "t0": t0,
            "spacing_ns": spacing,
            "deadline": deadline,
            "window": list(window),
            "indices": list(range(index, n, clients)),
            "out": str(out),
        }
        spec_path = settings.root / f"spec-{tag}-{index}.json"
        spec_path.write_text(json.dumps(spec))
        command = [sys.executable, __file__, "--client", str(spec_path)]
        client = subprocess.Popen(command, env=environment({}), stdout=subprocess.DEVNULL)
        pin(client.pid, settings.load_cores)
        procs.append((client, out))
    rss_before = server.rss()
    if heap is not None:
        os.kill(server.process.pid, signal.SIGUSR1)
    if census:
        take_census(server)
    # Wait for the window to open, then sample.
    time.sleep(max(0.0, (window[0] - now_ns()) / 1e9))
    load_pids = [model.pid] + [p.pid for p, _ in procs]
    cpu0, load0, idle0 = server.cpu(), sum(cpu_ticks(p) for p in load_pids), machine_idle()
    kernel0 = server.cpu(kernel_only=True)
    w0 = now_ns()
    spy = None
    if profile is not None:
        spy = start_profile(
            server.process.pid if server.workers == 1 else server.pids()[-1],
            profile,
            (window[1] - w0) / 1e9,
        )
    time.sleep(max(0.0, (window[0] + window[1]) / 2e9 - now_ns() / 1e9))
    rss_mid = server.rss()
    if heap is not None:
        os.kill(server.process.pid, signal.SIGUSR1)
    if census:
        take_census(server)
    time.sleep(max(0.0, (window[1] - now_ns()) / 1e9))
    cpu1, load1, idle1 = server.cpu(), sum(cpu_ticks(p) for p in load_pids), machine_idle()
    kernel1 = server.cpu(kernel_only=True)
    w1 = now_ns()
    if spy is not None:
        spy.wait(120)
    outcomes: dict[str, int] = {}
    samples: list[str] = []
    client_lag = 0.0
    delays_all = array.array("q")
    for process, out in procs:
        process.wait(max(60.0, (deadline - now_ns()) / 1e9 + 60))
        result = json.loads(out.read_text())
        for key, value in result["outcomes"].items():
            outcomes[key] = outcomes.get(key, 0) + value
        samples += result["samples"]
        client_lag = max(client_lag, result["lag_max_ms"])
        with open(str(out) + ".delays", "rb") as raw:
            delays_all.frombytes(raw.read())
    seconds = (w1 - w0) / 1e9
    ordered = sorted(delays_all)
    steady = window_delays(procs)
    tokens = len(steady)
    cpu_s = (cpu1 - cpu0) / TICKS
    per_token_us = cpu_s * 1e6 / tokens if tokens else None
    idle = (idle1[0] - idle0[0]) / max(1, idle1[1] - idle0[1])
    errors = sum(v for k, v in outcomes.items() if k != "complete")
    return {
        "runs": n,
        "clients": clients,
        "frame_delay_ms": spread(sorted(steady), 1000.0),
        "frame_delay_ms_whole_run": spread(ordered, 1000.0),
        "server_cpu_us_per_token": round(per_token_us, 1) if per_token_us else None,
        "server_kernel_cpu_us_per_token": (
            round((kernel1 - kernel0) / TICKS * 1e6 / tokens, 1) if tokens else None
        ),
        "runs_a_core_at_this_cost": (
            round(1e6 / per_token_us / settings.tokens_per_s) if per_token_us else None
        ),
        "server_cpu_cores": round(cpu_s / seconds, 2),
        "tokens_per_s_delivered": round(tokens / seconds),
        "rss_kib_per_run": round((rss_mid - rss_before) / 1024 / n, 1),
        "rss_mib_server": round(rss_mid / 2**20, 1),
        **(read_monitor(server.stats, w0, w1) if hasattr(server, "stats") else {}),
        "load_generators_cpu_cores": round((load1 - load0) / TICKS / seconds, 2),
        "client_loop_lag_max_ms": client_lag,
        "machine_idle_pct": round(idle * 100, 1),
        "outcomes": outcomes,
        "errors": errors,
        "error_samples": samples[:3],
        **({"heap": heap_added(heap, n)} if heap is not None else {}),
        **({"census": census_added(server.stats, n)} if census else {}),
    }


def app_pids(server: Any) -> list[int]:
    """The processes serving the app (each writes its monitor's `{pid}.txt`; a master does not)."""
    return [int(path.stem) for path in server.stats.glob("*.txt")]


def take_census(server: Any) -> None:
    """SIGUSR2 to every app process: each writes its next census (`inflight_app.census`)."""
    for pid in app_pids(server):
        before = len(list(server.stats.glob(f"{pid}-census-*.json")))
        os.kill(pid, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while len(list(server.stats.glob(f"{pid}-census-*.json"))) == before:
            if time.monotonic() > deadline:
                raise RuntimeError(f"server process {pid} wrote no census")
            time.sleep(0.05)


def census_added(directory: Path, n: int, top: int = 15) -> dict[str, Any]:
    """What the census in the window counts more than the one before the runs, per run (every
    app process summed), and the full collection's pause at N (the slowest process's)."""
    pids = {path.name.split("-")[0] for path in directory.glob("*-census-*.json")}
    pairs = [
        [json.loads((directory / f"{pid}-census-{i}.json").read_text()) for i in (1, 2)]
        for pid in pids
    ]
    added = sum(during["tracked"] - before["tracked"] for before, during in pairs)
    found: dict[str, Any] = {
        "tracked_objects_per_run": round(added / n, 1),
        "full_gc_ms": max(during["full_gc_ms"] for _, during in pairs),
        "full_gc_ms_at_0": max(before["full_gc_ms"] for before, _ in pairs),
        "tracked_at_n": sum(during["tracked"] for _, during in pairs),
    }
    for part in ("types", "cells_by_closure", "coroutines", "methods"):
        grown: dict[str, int] = {}
        for before, during in pairs:
            for name, count in during[part].items():
                grown[name] = grown.get(name, 0) + count - before[part].get(name, 0)
        ranked = sorted(grown.items(), key=lambda item: -item[1])[:top]
        found[f"{part}_per_run"] = {name: round(count / n, 1) for name, count in ranked}
    return found


def heap_added(directory: Path, n: int, top: int = 30) -> dict[str, Any]:
    """What the mid-window snapshot holds more than the one before the runs, per run, by the
    line that allocated it (tracemalloc, the server's own allocations only)."""
    import tracemalloc

    deadline = time.monotonic() + 60
    while len(list(directory.glob("*.snapshot"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    paths = sorted(directory.glob("*.snapshot"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    if len(paths) < 2:
        return {"skipped": "the server wrote no snapshots"}
    before, during = (tracemalloc.Snapshot.load(str(path)) for path in paths[:2])
    by_line = during.compare_to(before, "lineno")
    total = sum(stat.size_diff for stat in by_line)
    return {
        "traced_kib_per_run": round(total / 1024 / n, 1),
        "top_bytes_per_run": {
            f"{stat.traceback[0].filename.split('site-packages/')[-1]}:"
            f"{stat.traceback[0].lineno}": round(stat.size_diff / n)
            for stat in by_line[:top]
        },
    }


def window_delays(procs: list[tuple[subprocess.Popen[bytes], Path]]) -> list[int]:
    """The delays of the frames the model stamped inside the window (the clients' files)."""
    kept: list[int] = []
    for _, out in procs:
        path = Path(str(out) + ".window")
        if path.exists():
            values = array.array("q")
            values.frombytes(path.read_bytes())
            kept += values.tolist()
    return kept


def start_profile(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("py-spy is not installed (pip install py-spy): no profile", file=sys.stderr)
        return None
    command = [
        spy,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(max(1, int(seconds))),
        "--rate",
        "200",
        "--format",
        "raw",
        "--output",
        str(out),
        "--nonblocking",
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


IDLE_FRAMES = ("EpollSelector.select", "select (selectors.py", "Loop.run_forever (uvloop")
"""Innermost frames of a loop waiting for I/O: idle time, not CPU (left out of the shares)."""


def package_of(frame: str) -> str:
    """`function (path:line)` -> a short package name (what the CPU is spent in).

    py-spy shortens a path to its package part (`anyio/_backends/_asyncio.py`,
    `atmosphere_harness/_kernel/journal.py`, `selectors.py`)."""
    match = re.search(r"\((.*?):\d+\)$", frame)
    path = match.group(1) if match else frame
    parts = path.split("/")
    if parts[0] == "atmosphere_harness" and len(parts) > 2:
        return "atmosphere_harness." + parts[1]
    if len(parts) > 1:
        return parts[0]
    return parts[0].removesuffix(".py")


STAGES = (
    ("reading the model stream (openai SDK, HTTP client)", {"openai", "httpx2", "httpcore2"}),
    ("serving HTTP and writing SSE", {"sse_starlette", "starlette", "fastapi", "uvicorn", "h11"}),
    ("harness", {"atmosphere_harness"}),
)


def stage_of(frames: list[str]) -> str:
    """Which part of the work a sample is in: the frames of the task (or callback) it runs,
    i.e. those after the event loop's last `Handle._run`, matched in `STAGES` order."""
    start = 0
    for index, frame in enumerate(frames):
        if frame.startswith("Handle._run"):
            start = index + 1
    packages = {package_of(frame).split(".")[0] for frame in frames[start:]}
    for name, wanted in STAGES:
        if packages & wanted:
            return name
    return "event loop and the rest"


def summarise_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """py-spy's raw (collapsed) stacks -> self and inclusive shares of the busy samples."""
    own: dict[str, int] = {}
    anywhere: dict[str, int] = {}
    functions: dict[str, int] = {}
    stages: dict[str, int] = {}
    total = idle = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        samples = int(count)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        if frames[-1].startswith(IDLE_FRAMES):
            idle += samples
            continue
        total += samples
        stage = stage_of(frames)
        stages[stage] = stages.get(stage, 0) + samples
        leaf = package_of(frames[-1])
        own[leaf] = own.get(leaf, 0) + samples
        functions[frames[-1]] = functions.get(frames[-1], 0) + samples
        for package in {package_of(f) for f in frames}:
            anywhere[package] = anywhere.get(package, 0) + samples

    def shares(counts: dict[str, int]) -> dict[str, float]:
        ranked = sorted(counts.items(), key=lambda item: -item[1])[:top]
        return {name: round(100 * value / max(total, 1), 1) for name, value in ranked}

    return {
        "busy_samples": total,
        "idle_pct": round(100 * idle / max(total + idle, 1), 1),
        "pct_by_stage": shares(stages),
        "self_pct_by_package": shares(own),
        "inclusive_pct_by_package": shares(anywhere),
        "self_pct_by_function": shares(functions),
    }


def ramp(
    variant: Variant,
    levels: list[int],
    settings: Settings,
    profile_at: int | None,
    profile_out: Path,
    heap_at: int | None = None,
    census_at: int | None = None,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"inflight-{variant.name}-", dir=settings.root))
    model_port = free_port()
    model = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--fake",
            str(model_port),
            str(settings.tokens_per_s),
            str(settings.seconds),
            "tool" if variant.tool_call else "text",
        ],
        env=environment({}),
        stdout=subprocess.DEVNULL,
    )
    found: dict[str, Any] = {"levels": {}, "held": 0}
    try:
        wait_for_port(model_port, model)
        pin(model.pid, settings.load_cores)
        venv = None
        if variant.backend.startswith("aegra"):
            from peers import install

            venv, why = install("aegra")
            if venv is None:
                return {"skipped": why, "held": None}
        with Backend(variant.backend) as backend:
            for n in levels:
                server: Any
                heap = None
                if venv is not None:
                    from peers import aegra

                    server = aegra(
                        venv,
                        root / "aegra",
                        model_port,
                        backend.database_url,
                        backend.redis_url,
                        backend.name + ":",
                    )
                else:
                    server_env = {**backend.env, **settings.server_env}
                    heap = root / f"heap-{n}" if heap_at == n else None
                    if heap is not None:
                        heap.mkdir()
                        server_env |= {"BENCH_HEAP_DIR": str(heap)}
                    server = Server(variant, model_port, server_env, root)
                pin(server.process.pid, settings.server_cores)
                try:
                    warm_up(server.port, server.protocol)
                    profile = profile_out if profile_at == n else None
                    here = Settings(**{**settings.__dict__, "root": root})
                    census = census_at == n and venv is None
                    level = measure_level(n, server, model, here, profile, heap, census)
                finally:
                    server.close()
                if profile is not None and profile.exists():
                    level["profile"] = summarise_profile(profile)
                    level["profile"]["raw"] = str(profile)
                found["levels"][str(n)] = level
                p99 = level["frame_delay_ms"]["p99"]
                print(
                    f"inflight {variant.name} N={n}: frame delay p50 "
                    f"{level['frame_delay_ms']['p50']} / p99 {p99} ms, "
                    f"{level['server_cpu_us_per_token']} us CPU/token "
                    f"({level['server_cpu_cores']} cores), {level['rss_kib_per_run']} KiB/run, "
                    f"loop lag p99 {level.get('loop_lag_ms', {}).get('p99')} ms, "
                    f"{level.get('gc_full', {}).get('count')} full GCs, errors {level['errors']}, "
                    f"machine idle {level['machine_idle_pct']} %",
                    file=sys.stderr,
                )
                if p99 is None or p99 > settings.threshold_ms or level["errors"]:
                    break
                found["held"] = n
    finally:
        stop(model)
        shutil.rmtree(root, ignore_errors=True)
    return found


def machine() -> dict[str, Any]:
    import platform

    from common import version

    return {
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "atmosphere-harness": version("atmosphere-harness"),
        "openai": version("openai"),
        "uvicorn": version("uvicorn"),
        "uvloop_for_load_generators": version("uvloop"),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    names = [name for name in args.variants.split(",") if name]
    unknown = set(names) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants: {sorted(unknown)}; known: {sorted(VARIANTS)}")
    levels = [int(level) for level in args.levels.split(",") if level]
    root = Path(tempfile.mkdtemp(prefix="bench-inflight-"))
    settings = Settings(
        tokens_per_s=args.tokens_per_s,
        seconds=args.seconds,
        ramp_seconds=args.ramp_seconds,
        threshold_ms=args.threshold_ms,
        clients=args.clients,
        per_client=args.per_client,
        root=root,
        server_env=dict(item.split("=", 1) for item in args.server_env),
    )
    if args.pin:
        settings.server_cores, settings.load_cores = split_cores()
    document: dict[str, Any] = {
        "benchmark": "inflight",
        "workload": {
            "tokens_per_s": args.tokens_per_s,
            "seconds": args.seconds,
            "tokens_per_run": round(args.tokens_per_s * args.seconds),
            "ramp_seconds": args.ramp_seconds,
            "threshold_ms": args.threshold_ms,
            "levels": levels,
            "server_env": args.server_env,
            "pinned": {
                "server_cores": sorted(settings.server_cores),
                "load_cores": sorted(settings.load_cores or ()),
            }
            if settings.server_cores
            else None,
        },
        "variants": {},
        "machine": machine(),
    }
    try:
        for index, name in enumerate(names):
            profile_at = args.profile_at if index == 0 else None
            heap_at = args.heap_at if index == 0 else None
            census_at = args.census_at if index == 0 else None
            document["variants"][name] = ramp(
                VARIANTS[name], levels, settings, profile_at, args.profile_out, heap_at, census_at
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    document["held"] = {name: found["held"] for name, found in document["variants"].items()}
    document["vs_aegra"] = against_peer(document["variants"])
    return document


def against_peer(variants: dict[str, Any]) -> dict[str, Any]:
    """Ours over Aegra's: runs held (ours / peer), and at the largest level both measured CPU
    per token and memory per run (peer / ours): above 1, ours is better."""
    found: dict[str, Any] = {}
    for peer in ("aegra", "aegra_redis"):
        theirs = variants.get(peer)
        if not theirs or "levels" not in theirs:
            continue
        for name, ours in variants.items():
            if name.startswith("aegra") or "levels" not in ours:
                continue
            common = [n for n in ours["levels"] if n in theirs["levels"]]
            entry: dict[str, Any] = {
                "held_x": round(ours["held"] / theirs["held"], 2) if theirs["held"] else None
            }
            if common:
                level = max(common, key=int)
                mine, their = ours["levels"][level], theirs["levels"][level]
                entry["at_level"] = int(level)
                for key in ("server_cpu_us_per_token", "rss_kib_per_run"):
                    if mine[key] and their[key]:
                        entry[key + "_x"] = round(their[key] / mine[key], 2)
            found.setdefault(name, {})[peer] = entry
    return found


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--fake":
        serve_fake(int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "tool")
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "fast")
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        run_client(sys.argv[2])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="100,200,400,800,1200,1600,2000,2500,3000")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--tokens-per-s", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--ramp-seconds", type=float, default=5.0)
    parser.add_argument("--threshold-ms", type=float, default=100.0)
    parser.add_argument("--clients", type=int, default=4, help="client processes at most")
    parser.add_argument("--per-client", type=int, default=400, help="runs per client process")
    parser.add_argument("--profile-at", type=int, default=None, help="py-spy at this level")
    parser.add_argument(
        "--heap-at", type=int, default=None, help="tracemalloc snapshots at this level"
    )
    parser.add_argument(
        "--census-at", type=int, default=None, help="tracked objects a run at this level"
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set in our server's environment, e.g. ATMOSPHERE_GC_FULL_THRESHOLD=100",
    )
    parser.add_argument(
        "--profile-out", type=Path, default=HERE / "results" / "inflight-profile.txt"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the server on one core, the model and the clients on the others",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny levels: a check, not figures")
    parsed = parser.parse_args()
    if parsed.smoke:
        if parsed.levels == parser.get_default("levels"):
            parsed.levels = "4,8"
        parsed.seconds, parsed.ramp_seconds = 2.0, 0.5
    parsed.profile_out.parent.mkdir(parents=True, exist_ok=True)
    raise_file_limit()
    exit_on_sigterm()
    print(json.dumps(main(parsed), indent=1))
