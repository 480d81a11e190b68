"""Durable runs on PostgreSQL over two real replicas: replica A is SIGKILLed mid-run and replica
B, on its own, takes the run over once A's lease ran out and completes it, within 1.5 leases of
the kill (`TAKEOVER_LEASES`).

Both replicas are uvicorn processes of the durable-runs test app (`tests.durable.app`: a
scripted model that counts its calls in a file, tools the test can hold) on one workspace root
and one fresh database, with a short lease (`ATMOSPHERE_DURABLE_RUNS_LEASE_SECONDS`). Replica
B is never restarted: it notices the expired lease in its own upkeep loop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.durable.app import PATH
from tests.durable.support import (
    INTERRUPTED,
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

pytestmark = pytest.mark.services

LEASE_SECONDS = "2"
TAKEOVER_LEASES = 1.5
"""The bound on a takeover, in leases, from the SIGKILL to the model asked on B: the run's lease
runs out at most a lease after the kill (renewed every third of it), B's upkeep claims it at most
a third of a lease later, and the conversation's lock is free by then (PostgreSQL drops a dead
connection's locks; on Redis the lock's TTL is the lease)."""


class Replicas(ScenarioFiles):
    """Replicas A and B of the durable test app on one database, and the files they write."""

    def __init__(self, root: Path, url: str, backend: str = "postgres") -> None:
        super().__init__(root)
        self.backend = backend
        """The store the replicas share: `postgres` or `redis` (`test_redis_durable_replicas`)."""
        env = {
            f"ATMOSPHERE_{backend.upper()}_URL": url,
            "ATMOSPHERE_DURABLE_RUNS_ENABLED": "true",
            "ATMOSPHERE_DURABLE_RUNS_LEASE_SECONDS": LEASE_SECONDS,
        }
        self.a, self.b = start_pair(root, env)

    def close(self) -> None:
        self.a.kill()
        self.b.kill()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Replicas]:
    url = create_database()
    try:
        pair = Replicas(tmp_path, url)
        try:
            yield pair
        finally:
            pair.close()
    finally:
        drop_database(url)


def prompt(server: ServerProcess, conversation: str, message: str) -> list[Frame]:
    seen: list[Frame] = []
    body = {"message": message, "conversationId": conversation}
    with httpx2.stream("POST", server.url + PATH, json=body, timeout=WAIT) as response:
        assert response.status_code == 200
        read(sse_frames(response), terminal, seen)
    assert seen[-1]["event"] == "complete", seen[-3:]
    return seen


def follow(
    server: ServerProcess, conversation: str, last_seq: int, session_id: str | None = None
) -> list[Frame]:
    """Re-attach after `last_seq`; to the run `session_id` names, if given (else the route
    picks the conversation's oldest unfinished run, or its newest)."""
    seen: list[Frame] = []
    with httpx2.stream(
        "GET",
        f"{server.url}{PATH}/conversations/{conversation}/events",
        params={"sessionId": session_id} if session_id is not None else None,
        headers={"Last-Event-ID": str(last_seq)},
        timeout=WAIT,
    ) as response:
        assert response.status_code == 200, response.read()
        read(sse_frames(response), terminal, seen)
    return seen


def killed_in_the_tool(
    replicas: Replicas, conversation: str, message: str
) -> tuple[list[Frame], float]:
    """Replica A runs `message` (a `sleep` scenario) and is SIGKILLed while its tool sleeps:
    the frames its client got, and when it was killed (epoch seconds)."""
    replicas.hold(f"{conversation}-tool")
    before: list[Frame] = []
    body = {"message": message, "conversationId": conversation}
    with httpx2.stream("POST", replicas.a.url + PATH, json=body, timeout=WAIT) as response:

        def sleeping(frame: Frame) -> bool:
            if frame["event"] != "tool-start":
                return False
            wait_for(lambda: replicas.tool_runs(conversation) == ["sleepy"], "the tool to start")
            return True

        # Held until the kill: a generator dropped here would close the connection first, and
        # A, if it ran before the SIGKILL landed, would stop the run as one its client left
        # (journalled as ended, which B rightly does not resume).
        stream = sse_frames(response)
        read(stream, sleeping, before)
        killed = time.time()
        replicas.a.kill()
        stream.close()
    replicas.release(f"{conversation}-tool")
    return before, killed


def test_replica_b_takes_over_a_run_of_killed_replica_a(replicas: Replicas) -> None:
    for server in (replicas.a, replicas.b):
        info = httpx2.get(server.url + "/api/console/info", timeout=WAIT).json()
        assert info["harness"]["durable-runs"] == f"ACTIVE({replicas.backend})"
        assert info["backends"] == {
            "state": replicas.backend,
            "events": replicas.backend,
            "workspace": "files",
        }
    # The baseline: the same prompt, undisturbed, on replica B.
    prompt(replicas.b, "ref", "sleep now")
    prompt(replicas.b, "ref", "followup")

    # Replica A runs the prompt; it is SIGKILLed while its (non-idempotent) tool sleeps.
    before, killed = killed_in_the_tool(replicas, "cut", "sleep now")

    # Replica B, never restarted, claims the run once A's lease ran out, and asks the model for
    # the one turn left.
    wait_for(lambda: replicas.calls("cut").get(1) == 1, "replica B to resume the run")
    took = replicas.called_at("cut", 1) - killed
    assert took <= TAKEOVER_LEASES * float(LEASE_SECONDS), f"taken over {took:.2f} s after"
    # (B's own journal serves the run: `follow` finds it in B's memory, where the resume put it.)
    after = follow(replicas.b, "cut", before[-1]["seq"])
    seqs = [frame["seq"] for frame in after]
    assert seqs == list(range(before[-1]["seq"] + 1, before[-1]["seq"] + 1 + len(after)))
    assert {frame["sessionId"] for frame in before + after} == {before[0]["sessionId"]}
    assert after[-1]["event"] == "complete", after[-3:]
    assert [f["data"]["result"] for f in after if f["event"] == "tool-result"] == [INTERRUPTED]
    assert replicas.a.process is not None
    assert replicas.a.process.poll() is not None  # A is dead: B ran it

    prompt(replicas.b, "cut", "followup")
    # Turn 0 was journalled on A: never asked again. Turn 1 once, on B. The tool ran once.
    assert replicas.calls("cut") == {0: 1, 1: 1}
    assert replicas.tool_runs("cut") == ["sleepy"]
    cut_history, ref_history = replicas.history("cut"), replicas.history("ref")
    assert [m[1] for m in cut_history if m[0] == "tool"] == [INTERRUPTED]
    assert [m for m in cut_history if m[1] != INTERRUPTED] == [
        m for m in ref_history if m[1] != "rested"
    ]


def test_a_prompt_holding_a_nul_is_journalled_and_resumed_whole(replicas: Replicas) -> None:
    # A NUL in the prompt (PostgreSQL's text refuses it as a raw character): the run is
    # journalled all the same, so replica B resumes it after A is SIGKILLed, and the model
    # gets the prompt back, NUL included.
    message = "sleep now\u0000and then"
    before, _ = killed_in_the_tool(replicas, "nul", message)

    wait_for(lambda: replicas.calls("nul").get(1) == 1, "replica B to resume the run")
    after = follow(replicas.b, "nul", before[-1]["seq"])
    assert after[-1]["event"] == "complete", after[-3:]
    assert [f["data"]["result"] for f in after if f["event"] == "tool-result"] == [INTERRUPTED]
    resumed = [
        entry["messages"]
        for entry in replicas.log("calls.jsonl")
        if entry["conversation"] == "nul" and entry["round"] == 1
    ]
    assert [m[1] for m in resumed[0] if m[0] == "user"] == [message]
    assert replicas.calls("nul") == {0: 1, 1: 1}


def test_an_approval_answered_on_b_while_a_is_dead_is_taken_over_with_the_run(
    replicas: Replicas,
) -> None:
    prompt_approving(replicas.b, "ref", "approval please")
    prompt(replicas.b, "ref", "followup")

    # Replica A raises the approval and is SIGKILLed while it waits.
    before: list[Frame] = []
    body = {"message": "approval please", "conversationId": "cut"}
    with httpx2.stream("POST", replicas.a.url + PATH, json=body, timeout=WAIT) as response:
        read(sse_frames(response), lambda f: f["event"] == "approval-required", before)
        replicas.a.kill()
    approval_id = before[-1]["data"]["approvalId"]

    # The approval is still pending (its row is shared): answered on B before any replica runs
    # the run again, the answer is kept, and the run replica B resumes goes on with it.
    answer(replicas.b, approval_id)
    wait_for(lambda: replicas.calls("cut").get(1) == 1, "replica B to resume the run")
    after = follow(replicas.b, "cut", before[-1]["seq"])
    assert after[-1]["event"] == "complete", after[-3:]
    assert {frame["sessionId"] for frame in before + after} == {before[0]["sessionId"]}
    announced = [f["data"]["approvalId"] for f in after if f["event"] == "approval-required"]
    assert announced == [approval_id]  # re-announced under its id, already answered

    prompt(replicas.b, "cut", "followup")
    assert replicas.calls("cut") == {0: 1, 1: 1}
    assert replicas.tool_runs("cut") == ["approve_me"]
    assert replicas.history("cut") == replicas.history("ref")


def answer(server: ServerProcess, approval_id: str) -> None:
    response = httpx2.post(
        f"{server.url}{PATH}/approvals/{approval_id}", json={"approve": True}, timeout=WAIT
    )
    assert response.status_code == 200, response.text


def prompt_approving(server: ServerProcess, conversation: str, message: str) -> None:
    seen: list[Frame] = []
    body = {"message": message, "conversationId": conversation}
    with httpx2.stream("POST", server.url + PATH, json=body, timeout=WAIT) as response:
        stream = sse_frames(response)
        while not terminal(
            read(stream, lambda f: terminal(f) or f["event"] == "approval-required", seen)
        ):
            answer(server, seen[-1]["data"]["approvalId"])
    assert seen[-1]["event"] == "complete", seen[-3:]


def test_events_on_b_replay_and_follow_a_run_executing_on_a(replicas: Replicas) -> None:
    replicas.hold("live-tool")
    on_a: list[Frame] = []
    body = {"message": "sleep now", "conversationId": "live"}
    with httpx2.stream("POST", replicas.a.url + PATH, json=body, timeout=WAIT) as response:
        stream = sse_frames(response)

        def sleeping(frame: Frame) -> bool:
            if frame["event"] != "tool-start":
                return False
            wait_for(lambda: replicas.tool_runs("live") == ["sleepy"], "the tool to start")
            return True

        read(stream, sleeping, on_a)
        # B does not run it: it replays it from the shared journal and follows it live once
        # the tool returns on A.
        seen_on_b: list[Frame] = []
        with httpx2.stream(
            "GET",
            f"{replicas.b.url}{PATH}/conversations/live/events",
            headers={"Last-Event-ID": "0"},
            timeout=WAIT,
        ) as followed:
            assert followed.status_code == 200, followed.read()
            from_b = sse_frames(followed)
            read(from_b, lambda f: f["seq"] == on_a[-1]["seq"], seen_on_b)
            assert seen_on_b == on_a
            replicas.release("live-tool")
            read(from_b, terminal, seen_on_b)
        read(stream, terminal, on_a)
    assert seen_on_b == on_a
    assert on_a[-1]["event"] == "complete"
    assert replicas.calls("live") == {0: 1, 1: 1}

    # From the middle, after it ended: its frames stay a little for the other replicas.
    assert follow(replicas.b, "live", on_a[2]["seq"]) == on_a[3:]


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """A test directory, a fresh database's URL and the backend's name, for a test that starts
    its own servers (`test_a_superseded_run_closes_its_shared_approval`)."""
    url = create_database()
    try:
        yield tmp_path, url, "postgres"
    finally:
        drop_database(url)


def listed(server: ServerProcess, conversation: str) -> list[str]:
    response = httpx2.get(
        f"{server.url}{PATH}/approvals", params={"conversationId": conversation}, timeout=WAIT
    )
    assert response.status_code == 200, response.text
    return [approval["approvalId"] for approval in response.json()["approvals"]]


def test_a_superseded_run_closes_its_shared_approval(shared: tuple[Path, str, str]) -> None:
    """A superseded run on a shared backend: A is SIGKILLed while its run waits for an approval; the
    client re-sends the prompt and goes on (on a replica without durable runs, so nothing claims
    the run meanwhile); B, once A's lease ran out, ends the run as superseded instead of
    resuming it, and closes its approval, which the shared store still listed."""
    root, url, backend = shared
    files = ScenarioFiles(root)
    env = {
        f"ATMOSPHERE_{backend.upper()}_URL": url,
        "ATMOSPHERE_DURABLE_RUNS_ENABLED": "true",
        "ATMOSPHERE_DURABLE_RUNS_LEASE_SECONDS": LEASE_SECONDS,
        "DURABLE_TEST_DIR": str(root),
    }
    servers: list[ServerProcess] = []

    def start(name: str, **extra: str) -> ServerProcess:
        server = ServerProcess(
            "durable",
            root / "workspace",
            root / f"{name}.log",
            {**env, **extra},
            module="tests.durable.app",
        ).start()
        servers.append(server)
        return server

    try:
        a = start("a")
        prompt(a, "cut", "stream one")
        before: list[Frame] = []
        body = {"message": "approval please", "conversationId": "cut"}
        with httpx2.stream("POST", a.url + PATH, json=body, timeout=WAIT) as response:
            read(sse_frames(response), lambda f: f["event"] == "approval-required", before)
            a.kill()
        stale = before[-1]["data"]["approvalId"]

        other = start("other", ATMOSPHERE_DURABLE_RUNS_ENABLED="false")
        prompt_approving(other, "cut", "approval please")
        prompt(other, "cut", "stream three")
        assert listed(other, "cut") == [stale]  # the dead run's, still in the shared store
        other.kill()

        b = start("b")
        # (By its session: the newer turns' runs are in the shared store too.)
        after = follow(b, "cut", before[-1]["seq"], before[0]["sessionId"])
        assert [f["event"] for f in after] == ["error"], after
        assert after[-1]["data"]["type"] == "RunSuperseded"
        assert listed(b, "cut") == []
        response = httpx2.post(
            f"{b.url}{PATH}/approvals/{stale}", json={"approve": True}, timeout=WAIT
        )
        assert response.status_code == 404, response.text

        prompt(b, "cut", "followup")
        approval_rounds = [
            e["round"]
            for e in files.log("calls.jsonl")
            if e["conversation"] == "cut" and e["scenario"] == "approval"
        ]
        assert sorted(approval_rounds) == [0, 0, 1]
        assert files.tool_runs("cut") == ["approve_me"]  # the re-sent prompt's, once
        history = files.history("cut")
        assert [m[1] for m in history if m[0] == "user"] == [
            "stream one",
            "approval please",
            "stream three",
            "followup",
        ]
    finally:
        for server in servers:
            server.kill()
