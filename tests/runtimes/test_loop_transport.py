"""The model client's own network backend (`loop_transport`) over TLS: a streamed answer from
an HTTPS server whose certificate the environment's CA file (`SSL_CERT_FILE`) trusts."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
import uvicorn

from atmosphere_harness import Message, ModelRequest
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
