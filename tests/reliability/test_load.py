"""Load: 200 conversations at once over real HTTP against a uvicorn server in its own process.

Each conversation plans, writes, reads, greps and lists its files over three turns, and probes
every bound in its last one (see `workload`). Afterwards every plan and every file, read
through the admin REST API and again from disk, must be exactly what its own conversation last
wrote; nothing of one conversation may have appeared in another's stream; no store may hold
more than its bounds; every history must hold exactly its own turns, and every user's
long-term memory exactly the facts its conversations taught it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from . import workload
from .apps import OWNER
from .driver import conversations, http_client, run_load
from .server import running
from .verify import (
    ADMIN_TOKEN,
    disk_files,
    disk_plans,
    facts,
    histories,
    read_back,
)

CONVERSATIONS = 200
CONCURRENCY = 100
"""Streams the client keeps open at once; the model's gate holds the first turn of each
conversation until this many are in flight, so they provably overlap on the server."""


def server_env(gate: int) -> dict[str, str]:
    return {
        "ATMOSPHERE_ADMIN_TOKEN": ADMIN_TOKEN,
        "ATMOSPHERE_AI_FILESYSTEM_LIMITS": json.dumps(dataclasses.asdict(workload.LIMITS)),
        workload.GATE_ENV: str(gate),
    }


async def test_200_concurrent_conversations_keep_exactly_what_they_wrote(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    convs = conversations(CONVERSATIONS, "load")
    with running("load", workspace, tmp_path / "server.log", server_env(CONCURRENCY)) as server:
        failures = await run_load(server.url, convs, concurrency=CONCURRENCY)
        assert not failures, f"{failures[:3]}\n{server.log_tail()}"
        problems = [problem for conv in convs for problem in conv.problems]
        assert not problems, "\n".join(problems[:20])
        assert [conv.completed for conv in convs] == [workload.TURNS] * CONVERSATIONS

        async with http_client(server.url, 16) as client:
            seen = await read_back(client, [conv.cid for conv in convs])
        for conv in convs:
            plan, files = seen[conv.cid]
            steps, goal = workload.todos(conv.cid, workload.TURNS, done=True)
            assert plan == {
                "agent": OWNER,
                "conversationId": conv.cid,
                "sessionId": conv.cid,
                "goal": goal,
                "steps": steps,
            }
            assert files == workload.expected_files(conv.cid), conv.cid
        assert server.stopped_cleanly(), server.log_tail()

    # The same from disk, after a clean shutdown: every document parses and holds its bounds.
    plans = disk_plans(workspace)
    assert set(plans) == {conv.cid for conv in convs}
    for conv in convs:
        steps, goal = workload.todos(conv.cid, workload.TURNS, done=True)
        assert plans[conv.cid].wire_steps() == steps
        assert plans[conv.cid].goal == goal
    assert disk_files(workspace) == {conv.cid: workload.expected_files(conv.cid) for conv in convs}
    turns = [workload.message(turn) for turn in range(1, workload.TURNS + 1)]
    assert histories(workspace) == {conv.cid: turns for conv in convs}
    # Closing each conversation extracted its fact; shutdown waited for every extraction.
    expected: dict[str, set[str]] = {}
    for conv in convs:
        expected.setdefault(conv.user, set()).add(workload.fact(conv.cid))
    assert {user: set(found) for user, found in facts(workspace).items()} == expected
