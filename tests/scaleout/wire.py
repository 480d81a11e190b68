"""`WireCounter`: a loopback TCP proxy that counts round trips to PostgreSQL or Redis.

A server under test connects to the proxy's port instead of the service's; the proxy forwards
bytes both ways and records, per client connection, every **round trip**: the client's bytes
sent since the service last answered (one burst = the client waited once). It decodes what each
burst asks for, so a count comes with its purpose:

- PostgreSQL (frontend protocol v3): the text of each `Query` and of each prepared statement a
  `Bind` executes (asyncpg's cached statements are named; the proxy remembers their `Parse`);
- Redis (RESP): each command of the burst, `EVALSHA` named by the script it runs (`scripts=`
  maps a SHA-1 to a name).

Connection set-up (SSL negotiation, start-up, `HELLO`/`CLIENT SETINFO`, and asyncpg's
`Parse` of a statement the connection has not prepared yet, once per statement and connection)
is recorded too, marked `setup`, so a test can leave it out. Used by
`tests/scaleout/test_round_trips.py` (a turn makes exactly N round trips) and by the two backend
benchmarks (the list in `docs/scale-out*.md`). `hold(text)` holds back the requests holding
`text` until told to let them go (a test that a client does not wait for one).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import statistics
import struct
import time
import types
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

SSL_REQUEST = 80877103
GSS_REQUEST = 80877104


@dataclass
class Burst:
    """One round trip: what the client asked for before the service answered."""

    connection: int
    items: list[str]
    setup: bool = False
    sent: float = 0.0
    """`time.perf_counter()` when its first byte reached the proxy."""
    answered: float | None = None
    """When the service's first byte of the answer reached the proxy (`None`: not yet)."""

    @property
    def wait_ms(self) -> float | None:
        """The service's time for this round trip (loopback plus the work), as the proxy saw it."""
        return None if self.answered is None else (self.answered - self.sent) * 1000

    @property
    def label(self) -> str:
        return " ; ".join(self.items) if self.items else "(no request)"


@dataclass
class _Link:
    number: int
    parser: _Parser
    bursts: list[Burst] = field(default_factory=list)
    current: Burst | None = None


class _Parser:
    def feed(self, data: bytes) -> tuple[list[str], bool]:
        """The requests `data` completes, and whether they are connection set-up."""
        raise NotImplementedError


class _PostgresParser(_Parser):
    def __init__(self) -> None:
        self.buffer = b""
        self.started = False
        self.statements: dict[str, str] = {}

    def feed(self, data: bytes) -> tuple[list[str], bool]:
        self.buffer += data
        items: list[str] = []
        setup = not self.started
        while True:
            if not self.started:
                if len(self.buffer) < 8:
                    break
                length, code = struct.unpack("!ii", self.buffer[:8])
                if len(self.buffer) < length:
                    break
                self.buffer = self.buffer[length:]
                if code not in (SSL_REQUEST, GSS_REQUEST):
                    self.started = True
                items.append("startup")
                continue
            if len(self.buffer) < 5:
                break
            kind = self.buffer[:1]
            (length,) = struct.unpack("!i", self.buffer[1:5])
            if len(self.buffer) < 1 + length:
                break
            body = self.buffer[5 : 1 + length]
            self.buffer = self.buffer[1 + length :]
            if kind == b"Q":
                items.append(_squash(body.split(b"\0", 1)[0].decode()))
            elif kind == b"P":
                name, rest = body.split(b"\0", 1)
                query = _squash(rest.split(b"\0", 1)[0].decode())
                self.statements[name.decode()] = query
                if name:
                    # asyncpg prepares a statement once per connection (its statement cache),
                    # in a round trip of its own: connection warm-up, not a turn's work.
                    items.append(f"prepare {query}")
                    setup = True
                else:
                    items.append(query)
            elif kind == b"B":
                _portal, rest = body.split(b"\0", 1)
                statement = rest.split(b"\0", 1)[0].decode()
                if statement:
                    items.append(self.statements.get(statement, f"<{statement}>"))
            elif kind in (b"p", b"F"):
                setup = True
            elif kind == b"X":
                items.append("terminate")
                setup = True  # closing a connection: no answer is awaited
        return items, setup


class _RedisParser(_Parser):
    def __init__(self, scripts: Mapping[str, str]) -> None:
        self.buffer = b""
        self.scripts = scripts

    def feed(self, data: bytes) -> tuple[list[str], bool]:
        self.buffer += data
        items: list[str] = []
        setup = False
        while True:
            command = self._one()
            if command is None:
                break
            name = command[0].upper() if command else ""
            if name in ("HELLO", "CLIENT", "SELECT", "AUTH"):
                setup = True
                items.append(name)
            elif name in ("EVALSHA", "EVAL") and len(command) > 1:
                script = command[1]
                sha = script if name == "EVALSHA" else hashlib.sha1(script.encode()).hexdigest()
                items.append(f"{name} {self.scripts.get(sha, sha[:8])}")
            else:
                items.append(name)
        return items, setup

    def _one(self) -> list[str] | None:
        buffer = self.buffer
        if not buffer.startswith(b"*"):
            if b"\r\n" not in buffer:
                return None
            line, self.buffer = buffer.split(b"\r\n", 1)  # inline command
            return line.decode(errors="replace").split()
        end = buffer.find(b"\r\n")
        if end < 0:
            return None
        count = int(buffer[1:end])
        position = end + 2
        parts: list[str] = []
        for _ in range(count):
            end = buffer.find(b"\r\n", position)
            if end < 0:
                return None
            size = int(buffer[position + 1 : end])
            start = end + 2
            if len(buffer) < start + size + 2:
                return None
            parts.append(buffer[start : start + size].decode(errors="replace"))
            position = start + size + 2
        self.buffer = buffer[position:]
        return parts


def _squash(text: str) -> str:
    return " ".join(text.split())


def script_names(module: types.ModuleType) -> dict[str, str]:
    """SHA-1 -> name of every Lua script (a module-level `str` starting with `_`) in `module`."""
    names: dict[str, str] = {}
    for name, value in vars(module).items():
        if isinstance(value, str) and name.startswith("_") and "redis.call" in value:
            names[hashlib.sha1(value.encode()).hexdigest()] = f"{module.__name__}.{name}"
    return names


class WireCounter:
    """A proxy on 127.0.0.1 (`port`) to `target`; `bursts()` lists the round trips seen."""

    def __init__(
        self, target_host: str, target_port: int, *, redis_scripts: Mapping[str, str] | None = None
    ) -> None:
        self.target = (target_host, target_port)
        self.redis_scripts = redis_scripts
        self.port = 0
        self._links: list[_Link] = []
        self._numbers = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._held: tuple[str, asyncio.Event] | None = None
        self.holding = 0
        """Requests held back right now (`hold`)."""

    def hold(self, text: str) -> asyncio.Event:
        """Hold back every request whose statement holds `text` (the service does not see it)
        until the event returned is set."""
        gate = asyncio.Event()
        self._held = (text, gate)
        return gate

    async def __aenter__(self) -> WireCounter:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    def mark(self) -> int:
        """A position to count from (`bursts(since=...)`)."""
        return sum(len(link.bursts) for link in self._links)

    def bursts(self, *, include_setup: bool = False) -> list[Burst]:
        found = [burst for link in self._links for burst in link.bursts]
        return [burst for burst in found if include_setup or not burst.setup]

    def reset(self) -> None:
        for link in self._links:
            link.bursts.clear()

    def summary(self, turns: int, *, ignore: tuple[str, ...] = ()) -> dict[str, object]:
        """Round trips per turn and by purpose, leaving out bursts labelled one of `ignore`."""
        counted = [burst for burst in self.bursts() if burst.label not in ignore]
        labels = Counter(burst.label for burst in counted)
        waits: dict[str, list[float]] = {}
        for burst in counted:
            if burst.wait_ms is not None:
                waits.setdefault(burst.label, []).append(burst.wait_ms)
        return {
            "round_trips_per_turn": round(len(counted) / max(turns, 1), 3),
            "by_purpose_per_turn": {
                label: {
                    "count": round(count / max(turns, 1), 3),
                    "service_median_ms": round(statistics.median(waits[label]), 3)
                    if waits.get(label)
                    else None,
                }
                for label, count in labels.most_common()
            },
        }

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser: _Parser = (
            _RedisParser(self.redis_scripts)
            if self.redis_scripts is not None
            else _PostgresParser()
        )
        link = _Link(next(self._numbers), parser)
        self._links.append(link)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        back = asyncio.create_task(self._answer(link, upstream_reader, writer))
        self._tasks.add(back)
        try:
            while data := await reader.read(65536):
                items, setup = link.parser.feed(data)
                if link.current is None:
                    link.current = Burst(link.number, [], setup, time.perf_counter())
                    link.bursts.append(link.current)
                link.current.items.extend(items)
                link.current.setup = link.current.setup or setup
                held = self._held
                if held is not None and any(held[0] in item for item in items):
                    self.holding += 1
                    try:
                        await held[1].wait()
                    finally:
                        self.holding -= 1
                upstream_writer.write(data)
                await upstream_writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            upstream_writer.close()
            back.cancel()
            self._tasks.discard(task)

    async def _answer(
        self, link: _Link, upstream: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while data := await upstream.read(65536):
                if link.current is not None and link.current.answered is None:
                    link.current.answered = time.perf_counter()
                link.current = None  # the service answered: the next client bytes are a new trip
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            current = asyncio.current_task()
            if current is not None:
                self._tasks.discard(current)
