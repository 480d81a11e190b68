"""Redis for the scale-out tests: the shared server on 127.0.0.1:6379, and a private one.

Tests use database 13 of the shared server, each under its own random key prefix
(`?key_prefix=` in the URL), and delete every key under that prefix when they end, so test runs
can share the server (with each other and with other projects' tests). A test that must take
Redis *down* starts a private `redis-server` on a free port instead (`PrivateRedis`), so it never
disturbs anyone else.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from atmosphere_harness._backends.redis import RedisConnection
from tests.support import require_service

HOST = "127.0.0.1"
PORT = 6379
TEST_DB = 13


def _reason() -> str | None:
    try:
        client = redis.Redis(host=HOST, port=PORT, db=TEST_DB, socket_connect_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"no Redis at {HOST}:{PORT} ({exc})"
    return None


def require_redis() -> None:
    reason = _reason()
    if reason is not None:
        require_service("Redis", reason)


def url_for(prefix: str, *, port: int = PORT, db: int = TEST_DB) -> str:
    return f"redis://{HOST}:{port}/{db}?key_prefix={prefix}"


def new_prefix() -> str:
    return f"atmtest-{uuid.uuid4().hex[:12]}:"


def delete_prefix(prefix: str, *, port: int = PORT, db: int = TEST_DB) -> None:
    """Remove every key under `prefix` (a test's cleanup)."""
    client = redis.Redis(host=HOST, port=port, db=db)
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=prefix + "*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.unlink(*batch)
                batch.clear()
        if batch:
            client.unlink(*batch)
    finally:
        client.close()


def keys_under(prefix: str) -> list[str]:
    client = redis.Redis(host=HOST, port=PORT, db=TEST_DB, decode_responses=True)
    try:
        return sorted(client.scan_iter(match=prefix + "*", count=1000))
    finally:
        client.close()


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A fresh key prefix on the test database, deleted afterwards."""
    require_redis()
    prefix = new_prefix()
    try:
        yield prefix
    finally:
        delete_prefix(prefix)


@pytest.fixture
async def connection(redis_prefix: str) -> AsyncIterator[RedisConnection]:
    """An open `RedisConnection` under the test's prefix (one replica)."""
    opened = RedisConnection(url_for(redis_prefix))
    await opened.open()
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def other_connection(redis_prefix: str) -> AsyncIterator[RedisConnection]:
    """A second connection on the same prefix: what another replica would hold."""
    opened = RedisConnection(url_for(redis_prefix))
    await opened.open()
    try:
        yield opened
    finally:
        await opened.aclose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A `redis-server` of the test's own on a free port, which the test may stop and restart
    (append-only file, fsync always: what was acknowledged survives the restart)."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            require_service("redis-server", "not on PATH (needed for a private server)")
        assert binary is not None
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, prefix: str = "t:") -> str:
        return url_for(prefix, port=self.port, db=0)

    def start(self) -> PrivateRedis:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                HOST,
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                client = redis.Redis(host=HOST, port=self.port, socket_connect_timeout=1)
                try:
                    if client.ping():
                        return self
                finally:
                    client.close()
            time.sleep(0.05)
        raise RuntimeError("the private redis-server did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)
        self.process = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()
