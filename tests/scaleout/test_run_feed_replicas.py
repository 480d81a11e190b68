"""The run frame feed over two real replicas, durable runs OFF: PostgreSQL, Redis, and both.

With a scale-out backend and durable runs off, a run's frames are still shared (the frame feed,
`kernel.journal`), so `GET P/conversations/{id}/events` on replica B replays and follows a run
replica A executes, resumes from a `Last-Event-ID`, and ends with a terminal `error` frame when
A is SIGKILLed mid-run (once A's lease ran out: `RunFeed.abandon`). Nothing is resumed. Without
a backend, nothing is written to any run store.

Replicas are uvicorn processes of the durable-runs test app (`tests.durable.app`: a scripted
model that counts its calls, a tool the test holds) on one workspace root.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
import redis

from atmosphere_harness._kernel.feed import ABANDONED
from tests.durable.app import PATH
from tests.durable.support import (
    WAIT,
    Frame,
    ScenarioFiles,
    read,
    sse_frames,
    start_pair,
    terminal,
    wait_for,
)
from tests.reliability.server import ServerProcess

from .postgres_service import create_database, drop_database
from .redis_service import HOST, PORT, delete_prefix, new_prefix, require_redis, url_for

pytestmark = pytest.mark.services

LEASE_SECONDS = "2"
"""Short, so a reader learns of a dead replica soon (a hang guard bounds the wait: `WAIT`)."""


class FeedReplicas(ScenarioFiles):
    """Replicas A and B of the durable test app, durable runs off, on one shared backend."""

    def __init__(self, root: Path, urls: dict[str, str]) -> None:
        super().__init__(root)
        env = {
            **urls,
            "ATMOSPHERE_DURABLE_RUNS_ENABLED": "false",
            "ATMOSPHERE_DURABLE_RUNS_LEASE_SECONDS": LEASE_SECONDS,
        }
        self.a, self.b = start_pair(root, env)

    def close(self) -> None:
        self.a.kill()
        self.b.kill()


@pytest.fixture(params=["postgres", "redis", "both"])
def replicas(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FeedReplicas]:
    urls: dict[str, str] = {}
    database = prefix = None
    try:
        if request.param in ("postgres", "both"):
            database = create_database()
            urls["ATMOSPHERE_POSTGRES_URL"] = database
        if request.param in ("redis", "both"):
            require_redis()
            prefix = new_prefix()
            urls["ATMOSPHERE_REDIS_URL"] = url_for(prefix)
        pair = FeedReplicas(tmp_path, urls)
        try:
            yield pair
        finally:
            pair.close()
    finally:
        if database is not None:
            drop_database(database)
        if prefix is not None:
            delete_prefix(prefix)


def follow_url(server: ServerProcess, conversation: str) -> str:
    return f"{server.url}{PATH}/conversations/{conversation}/events"


def follow(server: ServerProcess, conversation: str, last_seq: int) -> list[Frame]:
    seen: list[Frame] = []
    with httpx2.stream(
        "GET",
        follow_url(server, conversation),
        headers={"Last-Event-ID": str(last_seq)},
        timeout=WAIT,
    ) as response:
        assert response.status_code == 200, response.read()
        read(sse_frames(response), terminal, seen)
    return seen


def start_sleeping(
    replicas: FeedReplicas, conversation: str, on_a: list[Frame], stack: contextlib.ExitStack
) -> Iterator[Frame]:
    """`sleep now` posted to A, read until its tool sleeps (held); the rest of A's stream
    (open until `stack` closes)."""
    replicas.hold(f"{conversation}-tool")
    body = {"message": "sleep now", "conversationId": conversation}
    response = stack.enter_context(
        httpx2.stream("POST", replicas.a.url + PATH, json=body, timeout=WAIT)
    )
    assert response.status_code == 200
    stream = sse_frames(response)

    def sleeping(frame: Frame) -> bool:
        if frame["event"] != "tool-start":
            return False
        wait_for(lambda: replicas.tool_runs(conversation) == ["sleepy"], "the tool to start")
        return True

    read(stream, sleeping, on_a)
    return stream


def test_b_replays_and_follows_a_run_on_a_and_resumes_by_last_event_id(
    replicas: FeedReplicas,
) -> None:
    for server in (replicas.a, replicas.b):
        info = httpx2.get(server.url + "/api/console/info", timeout=WAIT).json()
        assert info["harness"]["durable-runs"] == "INACTIVE(disabled)"

    on_a: list[Frame] = []
    with contextlib.ExitStack() as stack:
        stream_a = start_sleeping(replicas, "live", on_a, stack)
        whole = stack.enter_context(
            httpx2.stream(
                "GET", follow_url(replicas.b, "live"), headers={"Last-Event-ID": "0"}, timeout=WAIT
            )
        )
        # Resumed after the last frame A sent before its tool sleeps.
        resumed = stack.enter_context(
            httpx2.stream(
                "GET",
                follow_url(replicas.b, "live"),
                headers={"Last-Event-ID": str(on_a[-1]["seq"])},
                timeout=WAIT,
            )
        )
        assert whole.status_code == 200, whole.read()
        assert resumed.status_code == 200, resumed.read()
        from_start, from_id = sse_frames(whole), sse_frames(resumed)
        seen_whole: list[Frame] = []
        seen_resumed: list[Frame] = []
        # B does not run it: it replays what A shared so far...
        read(from_start, lambda f: f["seq"] == on_a[-1]["seq"], seen_whole)
        assert seen_whole == on_a
        sent_before = len(on_a)
        # ... and follows it live once the tool returns on A.
        replicas.release("live-tool")
        read(stream_a, terminal, on_a)
        read(from_start, terminal, seen_whole)
        read(from_id, terminal, seen_resumed)
    assert on_a[-1]["event"] == "complete", on_a[-3:]
    assert seen_whole == on_a
    assert seen_resumed == on_a[sent_before:]
    assert len(seen_resumed) >= 2  # the tool's result, ..., the `complete` frame

    # After its end, its frames stay a little for late readers on other replicas.
    assert follow(replicas.b, "live", on_a[1]["seq"]) == on_a[2:]
    assert replicas.calls("live") == {0: 1, 1: 1}


def test_a_reader_on_b_of_a_run_on_killed_a_gets_a_terminal_error(
    replicas: FeedReplicas,
) -> None:
    on_a: list[Frame] = []
    seen: list[Frame] = []
    with contextlib.ExitStack() as stack:
        # Kept: dropping A's stream would close it, and a run whose client left is stopped.
        stream_a = start_sleeping(replicas, "cut", on_a, stack)
        followed = stack.enter_context(
            httpx2.stream(
                "GET", follow_url(replicas.b, "cut"), headers={"Last-Event-ID": "0"}, timeout=WAIT
            )
        )
        assert followed.status_code == 200, followed.read()
        from_b = sse_frames(followed)
        read(from_b, lambda f: f["seq"] == on_a[-1]["seq"], seen)
        replicas.a.kill()  # SIGKILL, inside the sleeping tool
        # B's upkeep ends the run once A's lease ran out: its reader gets a terminal frame.
        read(from_b, terminal, seen)
        del stream_a
    replicas.release("cut-tool")
    assert seen[:-1] == on_a
    last = seen[-1]
    assert last["event"] == "error"
    assert last["data"] == {"message": ABANDONED, "type": "ServerLost"}
    assert last["seq"] == on_a[-1]["seq"] + 1
    assert last["sessionId"] == on_a[0]["sessionId"]
    # A late reader gets the same end; and the run was not run again anywhere.
    assert follow(replicas.b, "cut", on_a[-1]["seq"]) == [last]
    assert replicas.calls("cut") == {0: 1}


def test_without_a_backend_no_run_store_is_written(tmp_path: Path) -> None:
    files = ScenarioFiles(tmp_path)
    env = {"ATMOSPHERE_DURABLE_RUNS_ENABLED": "false", "DURABLE_TEST_DIR": str(tmp_path)}
    server = ServerProcess(
        "durable", tmp_path / "workspace", tmp_path / "a.log", env, module="tests.durable.app"
    ).start()
    try:
        frames: list[Frame] = []
        body = {"message": "stream now", "conversationId": "solo"}
        with httpx2.stream("POST", server.url + PATH, json=body, timeout=WAIT) as response:
            read(sse_frames(response), terminal, frames)
        assert frames[-1]["event"] == "complete"
        # Re-attaching works on the replica that ran it (its memory)...
        assert follow(server, "solo", 0) == frames
    finally:
        server.kill()
    assert files.calls("solo") == {0: 1}
    # ... and no run journal table was even created in the embedded database.
    database = tmp_path / "workspace" / "atmosphere.db"
    with sqlite3.connect(database) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
    assert "durable_runs" not in tables
    assert "durable_run_frames" not in tables


def followers(prefix: str) -> dict[str, int]:
    """The subscribers of each run's notice channel under `prefix` (on the Redis server)."""
    client = redis.Redis(host=HOST, port=PORT, decode_responses=True)
    try:
        channels = client.pubsub_channels(f"{prefix}runs:frames:*")
        return {str(name): int(count) for name, count in client.pubsub_numsub(*channels)}
    finally:
        client.close()


def known(server: ServerProcess, conversation: str) -> bool:
    """`server` finds the conversation's run (it answers 404 before the feed's first write)."""
    with httpx2.stream(
        "GET", follow_url(server, conversation), headers={"Last-Event-ID": "0"}, timeout=WAIT
    ) as response:
        return response.status_code == 200


def test_only_a_replica_following_a_run_hears_its_notices(tmp_path: Path) -> None:
    """Redis: A's run publishes on its own channel; nobody subscribes until B follows it, B
    alone then, and B unsubscribes once its reader is gone."""
    require_redis()
    prefix = new_prefix()
    pair = FeedReplicas(tmp_path, {"ATMOSPHERE_REDIS_URL": url_for(prefix)})
    try:
        on_a: list[Frame] = []
        seen: list[Frame] = []
        with contextlib.ExitStack() as stack:
            stream_a = start_sleeping(pair, "heard", on_a, stack)
            assert followers(prefix) == {}  # A runs it and reads it itself: no notice needed
            wait_for(lambda: known(pair.b, "heard"), "B to find the run (the feed's first write)")
            with httpx2.stream(
                "GET", follow_url(pair.b, "heard"), headers={"Last-Event-ID": "0"}, timeout=WAIT
            ) as followed:
                assert followed.status_code == 200, followed.read()
                from_b = sse_frames(followed)
                read(from_b, lambda f: f["seq"] == on_a[-1]["seq"], seen)
                wait_for(lambda: list(followers(prefix).values()) == [1], "B to subscribe")
                pair.release("heard-tool")
                read(stream_a, terminal, on_a)
                read(from_b, terminal, seen)
            assert seen == on_a
            wait_for(lambda: followers(prefix) == {}, "B to unsubscribe once its reader left")
    finally:
        pair.close()
        delete_prefix(prefix)
