"""A client that leaves a stream early is noticed at once, not written to until the end; one
that stops reading is cut off by the send timeout with one INFO line, never a traceback.

Found by the reliability suite's schemathesis run: reading only the first frame of a finished
run's replay (`GET P/conversations/{id}/events`) and closing made the server write every other
frame of the journal into the dead socket, logging an asyncio `socket.send() raised
exception.` WARNING for each (up to the journal's 2048 frames per disconnect). A server in its
own process shows it: in-process, client and server share one loop and the race never happens.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from pathlib import Path

import httpx2
import pytest

from atmosphere_harness import ScriptedRuntime
from atmosphere_harness._web import sse as sse_module
from tests.firehose import PATH as FIREHOSE
from tests.firehose import Firehose, FirehoseEndpoint, slow_connection
from tests.reliability.apps import PATH
from tests.reliability.server import running
from tests.support import make_app, serve

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


# --- a reader cut off by the send timeout: one INFO line, never a traceback ---------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_a_reader_cut_off_by_the_send_timeout_costs_one_info_line(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sse_module, "SEND_TIMEOUT", 2.0)
    Firehose.reset()
    app = make_app([FirehoseEndpoint], runtime=ScriptedRuntime(["hi"]), workspace=workspace)
    uvicorn_log = _Records()
    with caplog.at_level(logging.INFO, logger="atmosphere_harness"):
        async with serve(app) as base:
            logging.getLogger("uvicorn.error").addHandler(uvicorn_log)
            try:
                host, port = base.removeprefix("http://").split(":")
                reader, writer = await slow_connection(base)
                body = json.dumps({"message": "flood me"}).encode()
                writer.write(
                    f"POST {FIREHOSE} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                try:
                    await asyncio.wait_for(Firehose.cancelled.wait(), 20)
                    while await asyncio.wait_for(reader.read(1 << 20), 15):
                        pass  # the server dropped the connection
                finally:
                    writer.close()
            finally:
                logging.getLogger("uvicorn.error").removeHandler(uvicorn_log)
    ours = [r for r in caplog.records if "stopped reading" in r.getMessage()]
    assert len(ours) == 1, [r.getMessage() for r in caplog.records]
    assert ours[0].levelno == logging.INFO
    assert ours[0].name == "atmosphere_harness._web.sse"
    assert f"path='{FIREHOSE}'" in ours[0].getMessage()
    assert [r for r in caplog.records if r.exc_info] == []
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    server_side = [r.getMessage() for r in uvicorn_log.records if r.levelno >= logging.WARNING]
    assert server_side == [], "no 'Exception in ASGI application', no unfinished-response ERROR"


def test_only_a_cut_off_request_loses_uvicorns_unfinished_response_line() -> None:
    record = logging.LogRecord(
        "uvicorn.error", logging.ERROR, __file__, 1, sse_module._UNFINISHED, None, None
    )
    other = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "other", None, None)

    def cut_off() -> tuple[bool, bool]:
        sse_module._CUT_OFF.set(True)
        return sse_module._CUT_OFF_FILTER.filter(record), sse_module._CUT_OFF_FILTER.filter(other)

    assert sse_module._CUT_OFF_FILTER.filter(record), "any other request keeps uvicorn's line"
    assert contextvars.copy_context().run(cut_off) == (False, True)
