"""The model client's own network backend (`loop_transport`) over TLS: a streamed answer from
an HTTPS server whose certificate the environment's CA file (`SSL_CERT_FILE`) trusts."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
import uvicorn

from atmosphere_harness import Message, ModelRequest
from atmosphere_harness._errors import ModelError
from atmosphere_harness._runtimes.loop_transport import LoopTransport
from atmosphere_harness._runtimes.openai import OpenAIRuntime
from tests.fake_providers import Stream, fake_openai, openai_text

SAN = "subjectAltName=IP:127.0.0.1"


def self_signed(directory: Path) -> tuple[Path, Path]:
    key, cert = directory / "key.pem", directory / "cert.pem"
    command = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1"
    subprocess.run(
        [*command.split(), "-keyout", str(key), "-out", str(cert), "-addext", SAN],
        check=True,
        capture_output=True,
    )
    return key, cert


async def test_a_streamed_answer_over_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key, cert = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    fake = fake_openai().script(Stream(openai_text("over ", "tls")))
    config = uvicorn.Config(
        fake.app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        ssl_keyfile=str(key),
        ssl_certfile=str(cert),
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the HTTPS fake did not start"
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        runtime = OpenAIRuntime("fake-model", base_url=f"https://127.0.0.1:{port}/v1")
        assert isinstance(runtime.client._client._transport, LoopTransport)
        deltas: list[str] = []

        async def sink(text: str) -> None:
            deltas.append(text)

        answer = await runtime.complete(ModelRequest("", (Message.user("hi"),)), on_text=sink)
        await runtime.aclose()
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
    assert answer.text == "over tls"
    assert deltas == ["over ", "tls"]


async def drip_server(pieces: int, every: float, then_silent: bool) -> asyncio.Server:
    """A Chat Completions server writing one text chunk every `every` seconds, then either the
    end of the answer or nothing more (the connection left open)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.lower().split(b"\r\n")
            if line.startswith(b"content-length:")
        )
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n")
        events = [
            json.dumps({"choices": [{"index": 0, "delta": {"content": f"{n} "}}]})
            for n in range(pieces)
        ]
        for event in events:
            await asyncio.sleep(every)
            data = f"data: {event}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        if then_silent:
            await reader.read()  # until the client gives up and closes the connection
            writer.close()
            return
        data = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


@pytest.mark.parametrize("then_silent", [False, True])
async def test_the_read_timeout_is_between_two_chunks_not_for_the_whole_answer(
    then_silent: bool,
) -> None:
    """Chunks 0.1 s apart for 0.8 s stream whole under a 0.3 s timeout (the connection's one
    timer re-arms as the deadline moves on); a server that then goes silent is an error after
    about the timeout, not a hang."""
    server = await drip_server(8, 0.1, then_silent)
    port = server.sockets[0].getsockname()[1]
    runtime = OpenAIRuntime(
        "fake-model", base_url=f"http://127.0.0.1:{port}/v1", timeout=0.3, max_retries=0
    )
    assert isinstance(runtime.client._client._transport, LoopTransport)
    deltas: list[str] = []

    async def sink(text: str) -> None:
        deltas.append(text)

    started = asyncio.get_running_loop().time()
    try:
        if then_silent:
            with pytest.raises(ModelError, match="went silent mid-answer"):
                await runtime.complete(ModelRequest("", (Message.user("hi"),)), on_text=sink)
        else:
            answer = await runtime.complete(ModelRequest("", (Message.user("hi"),)), on_text=sink)
            assert answer.text == "".join(f"{n} " for n in range(8))
    finally:
        await runtime.aclose()
        server.close()
    assert deltas == [f"{n} " for n in range(8)]
    assert asyncio.get_running_loop().time() - started < 10
