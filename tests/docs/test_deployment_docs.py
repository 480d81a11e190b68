"""docs/deployment.md's advice holds for the uvicorn and the harness this repository ships.

Every uvicorn option the page uses exists; the numbers it quotes are the code's; and the header
bound it recommends really refuses a client that keeps sending headers.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import click
import uvicorn

from atmosphere_harness import HarnessSettings, agent
from atmosphere_harness._web import sse, websocket
from tests.agents import echo
from tests.support import make_app

DOC = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
TEXT = DOC.read_text(encoding="utf-8")


def _uvicorn_options() -> set[str]:
    command = uvicorn.main  # the `uvicorn` command line (a click command)
    assert isinstance(command, click.Command)
    return {option for param in command.params for option in param.opts}


def test_every_uvicorn_option_on_the_page_exists() -> None:
    command = re.search(r"\$ uvicorn app:app.*?(?=\n```)", TEXT, re.DOTALL)
    assert command is not None
    used = set(re.findall(r"(--[a-z0-9-]+)", command.group(0)))
    tabled = set(re.findall(r"^\| `(--[a-z0-9-]+)", TEXT, re.MULTILINE))
    assert tabled <= used, "the table explains the options of the command"
    assert used - _uvicorn_options() == set(), "options uvicorn does not have"


def test_the_numbers_the_page_quotes_are_the_codes() -> None:
    flat = " ".join(TEXT.split())
    assert HarnessSettings().max_request_bytes == 4 * 1024 * 1024
    assert "client_max_body_size 4m;" in TEXT
    assert sse.PING_SECONDS == 15
    assert websocket.HEARTBEAT_SECONDS == 15
    assert "every 15 seconds" in flat
    assert websocket.MAX_TEXT_CHARS == 4_194_304
    assert "(4,194,304 characters)" in flat
    assert sse.SEND_TIMEOUT == websocket.SEND_TIMEOUT == 30
    assert "stops reading a stream for 30 seconds" in flat


async def test_the_recommended_header_bound_refuses_endless_headers(workspace: Path) -> None:
    app = make_app([echo(agent(name="a"))], workspace=workspace)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="critical",
        http="h11",
        h11_max_incomplete_event_size=16384,
        timeout_keep_alive=5,
        limit_concurrency=2000,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "uvicorn exited before it started"
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /api/console/info HTTP/1.1\r\nHost: x\r\nX-Junk: " + b"a" * 40_000)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:80]
        assert "`400 Bad Request`" in TEXT
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
