"""The model client's own network backend (`loop_transport`) over TLS: a streamed answer from
an HTTPS server whose certificate the environment's CA file (`SSL_CERT_FILE`) trusts."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx2
import pytest
import uvicorn

from atmosphere_harness import Message, ModelRequest
from atmosphere_harness._errors import ModelError
from atmosphere_harness._runtimes import loop_transport
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


async def raw_server(
    bodies: list[list[bytes]], headers_read: asyncio.Event | None = None
) -> tuple[asyncio.Server, list[int]]:
    """A Chat Completions server answering each request on a connection with the next body of
    `bodies`, written piece by piece (each piece its own write); returns the server and a list
    that counts the connections it accepted. With `headers_read`, each body waits for it (the
    client has read the headers: the body comes in reads of its own)."""
    accepted: list[int] = []
    queue = list(bodies)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        while queue:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = next(
                int(line.split(b":")[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            )
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
            writer.write(b"transfer-encoding: chunked\r\n\r\n")
            await writer.drain()
            if headers_read is not None:
                await headers_read.wait()
                headers_read.clear()
            for piece in queue.pop(0):
                await asyncio.sleep(0)
                writer.write(piece)
                await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0), accepted


def sse_chunks(texts: list[str], *, extension: bytes = b"", trailer: bytes = b"") -> bytes:
    """The chunked body of an answer streaming `texts`, each event its own chunk."""
    out = b""
    for text in texts:
        event = json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]})
        data = f"data: {event}\n\n".encode()
        out += b"%x%s\r\n%s\r\n" % (len(data), extension, data)
    data = b"data: [DONE]\n\n"
    return out + b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(data), data, trailer)


def split(body: bytes, size: int) -> list[bytes]:
    return [body[n : n + size] for n in range(0, len(body), size)]


class Bodies:
    """Which body reader each response got (`chunked_body`'s answer), and an event set once
    the client read a response's headers."""

    def __init__(self) -> None:
        self.made: list[object] = []
        self.headers_read = asyncio.Event()


@pytest.fixture
def bodies(monkeypatch: pytest.MonkeyPatch) -> Bodies:
    seen = Bodies()
    original = loop_transport.chunked_body

    def spy(response: httpx2.Response, request: httpx2.Request) -> object:
        body = original(response, request)
        seen.made.append(body)
        seen.headers_read.set()
        return body

    monkeypatch.setattr(loop_transport, "chunked_body", spy)
    return seen


@pytest.mark.parametrize("size", [1, 3, 7, 64, 100_000])
async def test_a_chunked_answer_is_read_from_the_connection_in_any_split_and_it_is_reused(
    size: int, bodies: Bodies
) -> None:
    """The answer's chunks are cut by `ChunkedBody` (not `h11`) whatever the reads hold (a
    byte at a time, several chunks, a chunk extension, a trailer), and the connection goes back
    to the pool: two answers, one connection."""
    texts = ["one ", "two\r\n", "thrée ", "\u2028four"]
    first = split(sse_chunks(texts, extension=b";x=1"), size)
    second = split(sse_chunks(["again"], trailer=b"x-end: 1\r\n"), size)
    server, accepted = await raw_server([first, second], bodies.headers_read)
    port = server.sockets[0].getsockname()[1]
    runtime = OpenAIRuntime("fake-model", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    deltas: list[str] = []

    async def sink(text: str) -> None:
        deltas.append(text)

    try:
        one = await runtime.complete(ModelRequest("", (Message.user("hi"),)), on_text=sink)
        two = await runtime.complete(ModelRequest("", (Message.user("hi"),)), on_text=sink)
    finally:
        await runtime.aclose()
        server.close()
    assert one.text == "".join(texts)
    assert two.text == "again"
    assert deltas == [*texts, "again"]
    assert len(bodies.made) == 2
    assert all(isinstance(body, loop_transport.ChunkedBody) for body in bodies.made)
    assert accepted == [1]


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\ndata: x\r\n",  # not a size
        b"5\r\ndata: {}\n\nXX",  # data longer than its size
        b"5\r\ndata",  # cut off in a chunk
    ],
)
async def test_a_malformed_or_cut_chunked_answer_is_a_transient_model_error(
    body: bytes, bodies: Bodies
) -> None:
    server, _ = await raw_server([[body]], bodies.headers_read)
    port = server.sockets[0].getsockname()[1]
    runtime = OpenAIRuntime(
        "fake-model", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0, timeout=5
    )
    try:
        with pytest.raises(ModelError, match="broke off mid-answer") as caught:
            await runtime.complete(ModelRequest("", (Message.user("hi"),)))
    finally:
        await runtime.aclose()
        server.close()
    assert caught.value.transient
    assert isinstance(bodies.made[0], loop_transport.ChunkedBody)


@pytest.mark.parametrize("size", [b"1a", b"1A", b"001a", b"1a ;x=1", b"1a;x"])
async def test_a_chunk_a_read_is_taken_whole_whatever_its_size_line_spells(
    size: bytes, bodies: Bodies
) -> None:
    """Each chunk in its own write after the first (as a model streams its tokens): the
    chunk is taken in one step, its size line read as `h11` reads it (pins the behaviour of
    that path)."""
    event = b'data: {"choices":[{"delta":{"content":"xxxxxx"}}]}\n\n'
    assert len(event) == 0x1A * 2
    half = (event[:26], event[26:])
    pieces = [b"%x\r\n%s\r\n" % (len(event), event)]
    pieces += [size + b"\r\n" + part + b"\r\n" for part in half]
    pieces += [b"e\r\ndata: [DONE]\n\n\r\n", b"0\r\n\r\n"]
    server, accepted = await raw_server([pieces, pieces], bodies.headers_read)
    port = server.sockets[0].getsockname()[1]
    runtime = OpenAIRuntime("fake-model", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    try:
        one = await runtime.complete(ModelRequest("", (Message.user("hi"),)))
        two = await runtime.complete(ModelRequest("", (Message.user("hi"),)))
    finally:
        await runtime.aclose()
        server.close()
    assert one.text == two.text == "x" * 12
    assert accepted == [1]
    assert all(isinstance(body, loop_transport.ChunkedBody) for body in bodies.made)


async def test_a_chunk_is_looked_for_whole_only_once_bytes_of_it_came(
    bodies: Bodies, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two chunks the buffer holds at most the last one's CR LF: the next read comes
    first, then the one look for a whole chunk (never a look that cannot find one)."""
    looked: list[bytes] = []
    original = loop_transport.ChunkedBody._whole_chunk

    def spy(self: loop_transport.ChunkedBody, buffer: bytes, start: int) -> bytes | None:
        looked.append(buffer[start:])
        return original(self, buffer, start)

    monkeypatch.setattr(loop_transport.ChunkedBody, "_whole_chunk", spy)
    texts = [f"token {n} " for n in range(20)]
    server, _ = await raw_server([split(sse_chunks(texts), 97)], bodies.headers_read)
    port = server.sockets[0].getsockname()[1]
    runtime = OpenAIRuntime("fake-model", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    try:
        answer = await runtime.complete(ModelRequest("", (Message.user("hi"),)))
    finally:
        await runtime.aclose()
        server.close()
    assert answer.text == "".join(texts)
    assert looked
    assert all(looked)


@pytest.mark.parametrize("size", [b"0x1a", b"+1a", b"1_a", b" 1a", b"", b"1" * 17])
async def test_a_size_line_h11_would_reject_is_malformed_in_a_chunk_a_read_too(
    size: bytes, bodies: Bodies
) -> None:
    """A size `int(..., 16)` would take but the chunked format does not (pins the behaviour
    of the path that takes a whole chunk in one step)."""
    event = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 9 + b'"}}]}\n\n'
    pieces = [b"%x\r\n%s\r\n" % (len(event), event), size + b"\r\n" + event + b"\r\n"]
    server, _ = await raw_server([pieces], bodies.headers_read)
    port = server.sockets[0].getsockname()[1]
    runtime = OpenAIRuntime(
        "fake-model", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0, timeout=5
    )
    try:
        with pytest.raises(ModelError, match="illegal chunk header"):
            await runtime.complete(ModelRequest("", (Message.user("hi"),)))
    finally:
        await runtime.aclose()
        server.close()


@pytest.mark.parametrize("with_head", [10, 71, 73, 150, 166, 100_000])
async def test_a_body_whose_start_came_with_its_headers_is_read_here_too(
    with_head: int, bodies: Bodies
) -> None:
    """The headers and the body's first bytes (part of a chunk, a chunk and part of a size
    line, or the whole body) in one write: `h11` holds them already, yet the body is read here
    and `h11` ends it the same: the same answer, the connection reused."""
    accepted: list[int] = []
    body = sse_chunks(["all ", "at once"])
    assert len(body) == 169  # chunks end at 71, 145, 164

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        for _ in range(2):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            )
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n" + body[:with_head]
            )
            await writer.drain()
            for piece in split(body[with_head:], 7):
                await asyncio.sleep(0)
                writer.write(piece)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    runtime = OpenAIRuntime("fake-model", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    try:
        for _ in range(2):
            reply = await runtime.complete(ModelRequest("", (Message.user("hi"),)))
            assert reply.text == "all at once"
    finally:
        await runtime.aclose()
        server.close()
    assert len(bodies.made) == 2
    assert all(isinstance(made, loop_transport.ChunkedBody) for made in bodies.made)
    assert accepted == [1]
