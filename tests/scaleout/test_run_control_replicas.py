"""Run control over two real replicas, on PostgreSQL and on Redis.

A run started in the background on replica A (its tool held by a file, so it is still running)
is read on replica B (`GET P/runs/{runId}`), makes B refuse a `multitask: reject` prompt
(409), is cancelled on B, and stops on A within a second:
A's stream of it ends with a `RunCancelled` error frame. With durable runs on, the cancelled
run is never resumed (A is killed afterwards; B, which takes over expired runs, runs nothing),
and the conversation's history holds no tool call without its result.

Replicas are uvicorn processes of the durable-runs test app (`tests.durable.app`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.durable.app import PATH
from tests.durable.support import ScenarioFiles, read, sse_frames, start_pair, terminal, wait_for

from .postgres_service import create_database, drop_database
from .redis_service import delete_prefix, new_prefix, require_redis, url_for

pytestmark = pytest.mark.services

USER = {"X-User-Id": "alice"}


class Replicas(ScenarioFiles):
    def __init__(self, root: Path, urls: dict[str, str]) -> None:
        super().__init__(root)
        env = {
            **urls,
            "ATMOSPHERE_DURABLE_RUNS_ENABLED": "true",
            "ATMOSPHERE_DURABLE_RUNS_LEASE_SECONDS": "2",
            "ATMOSPHERE_USER_ID_HEADER": "X-User-Id",
        }
        self.a, self.b = start_pair(root, env)


@pytest.fixture(params=["postgres", "redis"])
def replicas(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Replicas]:
    urls: dict[str, str] = {}
    database = prefix = None
    try:
        if request.param == "postgres":
            database = create_database()
            urls["ATMOSPHERE_POSTGRES_URL"] = database
        else:
            require_redis()
            prefix = new_prefix()
            urls["ATMOSPHERE_REDIS_URL"] = url_for(prefix)
        pair = Replicas(tmp_path, urls)
        try:
            yield pair
        finally:
            pair.a.kill()
            pair.b.kill()
    finally:
        if database is not None:
            drop_database(database)
        if prefix is not None:
            delete_prefix(prefix)


def test_a_run_on_a_is_read_and_cancelled_on_b_within_a_second(replicas: Replicas) -> None:
    conversation = "c-cancel"
    replicas.hold(f"{conversation}-tool")
    a = httpx2.Client(base_url=replicas.a.url, timeout=30)
    b = httpx2.Client(base_url=replicas.b.url, timeout=30)
    try:
        started = a.post(
            PATH,
            json={"message": "sleep now", "conversationId": conversation, "background": True},
            headers=USER,
            timeout=10,  # (a server without background runs streams the run instead: fail)
        )
        assert started.status_code == 202, started.text
        run_id = started.json()["runId"]
        wait_for(lambda: replicas.tool_runs(conversation) == ["sleepy"], "the tool to start")

        seen: list[dict[str, Any]] = []
        ended: dict[str, float] = {}

        def follow() -> None:
            with a.stream("GET", f"{PATH}/conversations/{conversation}/events", headers=USER) as r:
                read(sse_frames(r), terminal, seen)
                ended["at"] = time.monotonic()

        reader = threading.Thread(target=follow)
        reader.start()
        wait_for(lambda: any(f["event"] == "tool-start" for f in seen), "the follower")

        on_b = b.get(f"{PATH}/runs/{run_id}", headers=USER)
        assert on_b.status_code == 200, on_b.text
        assert on_b.json()["status"] == "running"
        assert b.get(f"{PATH}/runs/{run_id}", headers={"X-User-Id": "bob"}).status_code == 404

        rejected = b.post(
            PATH,
            json={"message": "followup", "conversationId": conversation, "multitask": "reject"},
            headers=USER,
        )
        assert rejected.status_code == 409, rejected.text

        asked = time.monotonic()
        cancel = b.post(f"{PATH}/runs/{run_id}/cancel", headers=USER)
        assert cancel.status_code == 202, cancel.text
        reader.join(30)
        took = ended["at"] - asked
        assert took < 1.0, took
        assert seen[-1]["event"] == "error"
        assert seen[-1]["data"]["type"] == "RunCancelled"
        wait_for(
            lambda: b.get(f"{PATH}/runs/{run_id}", headers=USER).json()["status"] == "cancelled",
            "the cancelled status on B",
        )

        # Never resumed: with A gone (and its lease run out), B runs nothing of it again.
        replicas.release(f"{conversation}-tool")
        replicas.a.kill()
        time.sleep(5)
        assert replicas.tool_runs(conversation) == ["sleepy"]
        assert replicas.calls(conversation) == {0: 1}

        # No half tool pair in the history (the follow-up is sent the stored history).
        followup = b.post(
            PATH, json={"message": "followup", "conversationId": conversation}, headers=USER
        )
        assert '"event":"complete"' in followup.text
        history = replicas.history(conversation)
        assert [entry[0] for entry in history] == ["user", "user"], history
    finally:
        a.close()
        b.close()


def test_a_prompt_waiting_for_its_conversation_reads_queued_on_b_and_is_cancelled_there(
    replicas: Replicas,
) -> None:
    """A streamed prompt on A that waits behind a run of its conversation: its status record is
    stored by its lock's first try (`queued`), so B reads it and cancels it; the lock's later
    tries never turn the cancelled run back into `running`, and it never runs."""
    conversation = "c-queued"
    replicas.hold(f"{conversation}-tool")
    a = httpx2.Client(base_url=replicas.a.url, timeout=30)
    b = httpx2.Client(base_url=replicas.b.url, timeout=30)
    try:
        first = b.post(
            PATH,
            json={"message": "sleep now", "conversationId": conversation, "background": True},
            headers=USER,
            timeout=10,
        )
        assert first.status_code == 202, first.text
        wait_for(lambda: replicas.tool_runs(conversation) == ["sleepy"], "the tool to start")

        seen: list[dict[str, Any]] = []
        started: dict[str, str] = {}

        def waiting_prompt() -> None:
            body = {"message": "after", "conversationId": conversation}
            with a.stream("POST", PATH, json=body, headers=USER) as response:
                started["run"] = response.headers["X-Run-Id"]
                read(sse_frames(response), terminal, seen)

        prompt = threading.Thread(target=waiting_prompt)
        prompt.start()
        wait_for(lambda: "run" in started, "the waiting prompt's run id")
        run_id = started["run"]
        wait_for(
            lambda: b.get(f"{PATH}/runs/{run_id}", headers=USER).json().get("status") == "queued",
            "the waiting run's queued status on B",
        )
        assert b.post(f"{PATH}/runs/{run_id}/cancel", headers=USER).status_code == 202
        prompt.join(30)
        assert seen[-1]["event"] == "error", seen
        assert seen[-1]["data"]["type"] == "RunCancelled"

        replicas.release(f"{conversation}-tool")
        first_id = first.json()["runId"]
        wait_for(
            lambda: b.get(f"{PATH}/runs/{first_id}", headers=USER).json()["status"] == "completed",
            "the first run to complete",
        )
        assert b.get(f"{PATH}/runs/{run_id}", headers=USER).json()["status"] == "cancelled"
        calls = [e for e in replicas.log("calls.jsonl") if e["conversation"] == conversation]
        assert calls, "the first run's model calls are logged"
        assert "'after'" not in str(calls)  # the cancelled run never reached the model
    finally:
        a.close()
        b.close()
