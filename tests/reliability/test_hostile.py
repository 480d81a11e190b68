"""A hostile model against a real server process: every run must end with messages the model can
act on and a terminal frame, the server must keep answering other clients meanwhile, and its
memory must stay bounded.

Each scenario (`hostile.scenario`) runs in `hostile_run`: the hostile prompt streams while a
prober asks the health route every 50 ms (each probe must answer within a 10 s hang guard), and
the hostile run's final model call is held open until a normal conversation on another endpoint
and a health probe have both been answered. Memory is the server's own resident set, read from
`/proc` before and after.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest

from atmosphere_harness._filesystem.spares import SPARES_DIR

from . import hostile
from .apps import CHAT, HEALTH, OWNER, PATH
from .driver import STREAM_TIMEOUT, stream_frames
from .server import ServerProcess, running
from .verify import ADMIN_TOKEN

MIB = 1024 * 1024
PROBE_EVERY = 0.05
PROBE_GUARD = 10.0
"""A health probe slower than this means the server stopped serving (a hang guard)."""


@dataclass
class HostileRun:
    frames: list[dict[str, Any]]
    conversation_id: str
    probes: int
    probe_failures: list[str] = field(default_factory=list)

    def of(self, event: str) -> list[dict[str, Any]]:
        return [frame for frame in self.frames if frame["event"] == event]

    def results(self) -> list[str]:
        return [frame["data"]["result"] for frame in self.of("tool-result")]

    @property
    def last(self) -> dict[str, Any]:
        return self.frames[-1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("hostile")
    (root / "workspace").mkdir()
    (root / "release").mkdir()
    env = {
        "ATMOSPHERE_ADMIN_TOKEN": ADMIN_TOKEN,
        hostile.RELEASE_ENV: str(root / "release"),
        # glibc serves large blocks from the heap once a large block was freed (its mmap
        # threshold adapts), and a heap rarely shrinks: resident memory would then keep what
        # the allocator caches. A fixed threshold maps every large block and unmaps it when
        # freed, so the resident set measures what the server really holds.
        "MALLOC_MMAP_THRESHOLD_": str(256 * 1024),
    }
    with running("hostile", root / "workspace", root / "server.log", env) as process:
        yield process


def release_dir(server: ServerProcess) -> Path:
    return Path(server.env[hostile.RELEASE_ENV])


async def _wait_for(path: Path, run: asyncio.Task[Any]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STREAM_TIMEOUT
    while not path.exists():
        if run.done():
            run.result()
            raise AssertionError(f"the run ended before it held: {path.name}")
        assert loop.time() < deadline, f"the hostile run never reached its hold: {path.name}"
        await asyncio.sleep(0.02)


async def hostile_run(
    server: ServerProcess, scenario: str, conversation_id: str | None = None
) -> HostileRun:
    """Run one scenario with the prober on, and prove the server answers while it is open."""
    cid = conversation_id or f"hostile-{scenario}-{uuid.uuid4().hex[:8]}"
    token = uuid.uuid4().hex
    stop = asyncio.Event()
    failures: list[str] = []
    answered = 0

    async with httpx2.AsyncClient(base_url=server.url, timeout=STREAM_TIMEOUT) as client:

        async def probe_forever() -> None:
            nonlocal answered
            while not stop.is_set():
                try:
                    response = await client.get(HEALTH, timeout=PROBE_GUARD)
                    if response.status_code != 200:
                        failures.append(f"health answered {response.status_code}")
                    answered += 1
                except httpx2.HTTPError as exc:
                    failures.append(f"health probe failed: {type(exc).__name__}")
                await asyncio.sleep(PROBE_EVERY)

        prober = asyncio.create_task(probe_forever())
        run = asyncio.create_task(
            stream_frames(
                client, PATH, f"hostile {scenario} hold:{token}", cid, {"X-User-Id": "mallory"}
            )
        )
        await _wait_for(release_dir(server) / f"{token}.held", run)
        # The hostile run is open: another conversation and a probe must be served now.
        other = await stream_frames(client, CHAT, "are you there?")
        assert other[-1]["event"] == "complete", other[-1]
        assert other[-1]["data"]["summary"] == "echo: are you there?"
        assert (await client.get(HEALTH, timeout=PROBE_GUARD)).status_code == 200
        assert not run.done(), "the hostile run was still open while the others were served"
        (release_dir(server) / token).touch()
        frames = await run
        stop.set()
        await prober
    assert not failures, failures[:5]
    assert answered > 0
    return HostileRun(frames, cid, answered, failures)


def assert_clear(result: str) -> None:
    """A result the model can act on: a JSON error naming its kind, or a plain-text reason."""
    assert result.strip(), "empty result"
    assert "Traceback" not in result
    if result.startswith("{"):
        body = json.loads(result)
        assert body["error"] in ("invalid_arguments", "unknown_tool", "too_many_tool_calls"), body
        assert body.get("details") or body.get("message"), body
    elif result not in ("(no matches)", "(empty)"):  # e.g. a glob of `../**`: nothing inside
        prefixes = ("Error: ", "write_todos failed: ", "task failed: ", "task refused: ")
        assert result.startswith(prefixes), result[:200]


def stored_payload_sizes(workspace: Path) -> list[int]:
    with sqlite3.connect(f"file:{workspace / 'atmosphere.db'}?mode=ro", uri=True) as db:
        return [row[0] for row in db.execute("SELECT length(payload) FROM memory_messages")]


async def test_huge_arguments_are_refused_and_never_kept(server: ServerProcess) -> None:
    await hostile_run(server, "types")  # warm every code path before the baseline
    before = server.rss()
    runs = [await hostile_run(server, "huge") for _ in range(3)]
    after = server.rss()
    for run in runs:
        assert run.last["event"] == "complete", run.last
        assert run.last["data"]["summary"] == "survived huge"
        results = run.results()
        assert len(results) == 2
        for result in results:
            assert_clear(result)
            assert "arguments are too large" in result
        for start in run.of("tool-start"):
            assert len(json.dumps(start["data"]["arguments"])) < 1000, "arguments streamed back"
    # Three 50 MB arguments went through the server; none may stay resident or on disk, and
    # the peak may hold the one the model built, not copies of it (streamed, journaled, stored).
    # Before the fix: +129 MiB resident after, 620 MiB peak; with it: +0 MiB, 139 MiB peak.
    assert after - before < 64 * MIB, f"resident memory grew by {(after - before) // MIB} MiB"
    assert server.peak_rss() - before < 256 * MIB, f"peak {server.peak_rss() // MIB} MiB"
    assert max(stored_payload_sizes(server.workspace)) < MIB


async def test_wrong_types_and_unknown_tools_get_clear_results(server: ServerProcess) -> None:
    typed = await hostile_run(server, "types")
    unknown = await hostile_run(server, "unknown")
    for run, count in ((typed, len(hostile.scenario("types"))), (unknown, 6)):
        assert run.last["event"] == "complete", run.last
        results = run.results()
        assert len(results) == count
        for result in results:
            assert_clear(result)
    assert all(json.loads(result)["error"] == "unknown_tool" for result in unknown.results())
    assert max(len(result) for result in unknown.results()) < 2000, "a long name is echoed cut"
    # The conversation goes on: its history (with the malformed calls) is intact.
    async with httpx2.AsyncClient(base_url=server.url, timeout=STREAM_TIMEOUT) as client:
        after = await stream_frames(
            client, PATH, "still there?", typed.conversation_id, {"X-User-Id": "mallory"}
        )
    assert after[-1]["data"]["summary"] == "echo: still there?"


async def test_a_flood_of_calls_runs_none_and_stays_small(server: ServerProcess) -> None:
    run = await hostile_run(server, "flood")
    assert run.last["event"] == "complete", run.last
    (result,) = run.results()
    assert json.loads(result)["error"] == "too_many_tool_calls"
    assert f"asked for {hostile.FLOOD_CALLS} tool calls" in result
    assert len(run.frames) < 50
    files = server.workspace / "coordinators" / OWNER / "files" / run.conversation_id
    assert not files.exists(), "no call of the flood ran"


async def test_recursion_through_task_stops_at_its_bounds(server: ServerProcess) -> None:
    run = await hostile_run(server, "recurse")
    assert run.last["event"] == "complete", run.last
    spawned = run.of("subagent-start")
    ended = run.of("subagent-end")
    assert len(spawned) == 8, "subagent_max_spawns (8) per request, nested spawns included"
    assert len(ended) == 8
    assert {frame["data"]["status"] for frame in ended} == {"completed"}
    results = run.results()
    assert len(results) == hostile.SPAWNS_PER_MESSAGE * hostile.RECURSE_ROUNDS
    refused = "task refused: maximum subagent spawns (8) for this request reached."
    assert results.count(refused) >= len(results) - hostile.SPAWNS_PER_MESSAGE
    for result in results:
        assert result == refused or result.startswith("recursion over after"), result


async def test_a_catastrophic_regex_is_cut_off(server: ServerProcess) -> None:
    run = await hostile_run(server, "regex")
    assert run.last["event"] == "complete", run.last
    wrote, catastrophic, plain = run.results()
    assert wrote == "Wrote haystack.txt"
    assert catastrophic.startswith(f"Error: grep timed out on pattern '{hostile.CATASTROPHIC}'")
    assert len(plain.splitlines()) == 50, "the next grep works as usual"


async def test_traversal_and_planted_links_never_leave_the_store(
    server: ServerProcess, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(hostile.SECRET)
    before = {path.name: path.read_bytes() for path in outside.iterdir()}
    owner = server.workspace / "coordinators" / OWNER / "files"

    first = await hostile_run(server, "traversal")
    results = first.results()
    assert results[-1] == "Wrote inside.txt"
    for result in results[:-1]:
        assert_clear(result)
    store = owner / first.conversation_id
    assert sorted(path.name for path in store.iterdir()) == [SPARES_DIR, "inside.txt"]
    assert {path.name for path in owner.parent.iterdir()} <= {"files", "plans"}
    assert not (owner.parent.parent / "escape.txt").exists()

    # Symlinks planted inside the store (by anyone with access to the disk) lead nowhere.
    os.symlink(outside, store / "link")
    os.symlink(outside / "secret.txt", store / "filelink")
    second = await hostile_run(server, "through-links", first.conversation_id)
    assert second.last["event"] == "complete", second.last
    for result in second.results():
        assert_clear(result)
        assert hostile.SECRET not in result
    assert {path.name: path.read_bytes() for path in outside.iterdir()} == before
    async with httpx2.AsyncClient(base_url=server.url) as client:
        read = await client.get(
            f"/api/admin/agents/{OWNER}/files/content",
            params={"conversationId": first.conversation_id, "path": "filelink"},
            headers={"X-Atmosphere-Auth": ADMIN_TOKEN},
        )
    assert read.status_code == 400, read.text
    assert hostile.SECRET not in read.text
