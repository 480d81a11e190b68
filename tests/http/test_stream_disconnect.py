"""A client that leaves a stream early is noticed at once, not written to until the end.

Found by the reliability suite's schemathesis run: reading only the first frame of a finished
run's replay (`GET P/conversations/{id}/events`) and closing made the server write every other
frame of the journal into the dead socket, logging an asyncio `socket.send() raised
exception.` WARNING for each (up to the journal's 2048 frames per disconnect). A server in its
own process shows it: in-process, client and server share one loop and the race never happens.
"""

from __future__ import annotations

from pathlib import Path

import httpx2

from tests.reliability.apps import PATH
from tests.reliability.server import running

DEAD_WRITE = "socket.send() raised exception"


def test_leaving_a_replay_after_one_frame_writes_no_more(tmp_path: Path) -> None:
    (tmp_path / "workspace").mkdir()
    log = tmp_path / "server.log"
    with running("fuzz", tmp_path / "workspace", log) as server:
        with httpx2.Client(base_url=server.url, timeout=30) as client:
            body = {"message": "plan a short task and save the result to a file"}
            seed = client.post(PATH, json={**body, "conversationId": "c-1"})
            assert seed.text.count("\ndata:") >= 10
            for _ in range(10):
                url = f"{PATH}/conversations/c-1/events"
                with client.stream("GET", url) as response:
                    for line in response.iter_lines():
                        if line.startswith("data:"):
                            break
            # Still serving, and every replay's client was seen leaving.
            again = client.post(PATH, json={**body, "conversationId": "c-2"})
            assert '"event":"complete"' in again.text
        assert server.stopped_cleanly()
    assert DEAD_WRITE not in log.read_text()
