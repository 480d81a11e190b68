"""The harness sets the server process's garbage collector as it starts (`groups.process`)."""

from __future__ import annotations

import gc
from pathlib import Path

from atmosphere_harness import ScriptedRuntime, agent
from tests.agents import echo
from tests.support import client_for, make_app, prompt


async def test_starting_the_harness_freezes_start_up_and_spaces_full_collections(
    workspace: Path,
) -> None:
    before = gc.get_threshold()
    app = make_app(
        [echo(agent(name="gc"))],
        runtime=ScriptedRuntime(["hi"]),
        workspace=workspace,
        gc_full_threshold=77,
    )
    try:
        async with client_for(app) as client:
            assert gc.get_threshold() == (before[0], before[1], 77)
            assert gc.get_freeze_count() > 0, "start-up's objects left the collector's view"
            frames = await prompt(client, "/atmosphere/agent/gc", "hello")
            assert frames[-1]["event"] == "complete"
    finally:
        gc.set_threshold(*before)


async def test_the_collector_is_left_alone_when_told_so(workspace: Path) -> None:
    before = gc.get_threshold()
    app = make_app(
        [echo(agent(name="gc"))],
        runtime=ScriptedRuntime(["hi"]),
        workspace=workspace,
        gc_freeze=False,
    )
    async with client_for(app):
        assert gc.get_threshold() == before
