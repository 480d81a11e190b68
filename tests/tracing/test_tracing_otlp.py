"""The real OTLP/HTTP exporter sends a run's spans to a small receiver on loopback, which decodes
the protobuf request as a collector would: the wire format, not a mock."""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from atmosphere_harness import HarnessSettings, ScriptedRuntime, ToolCall, agent
from atmosphere_harness._assembly import default_primitives
from atmosphere_harness._backends import resolve_backends
from atmosphere_harness._events import Frame
from atmosphere_harness._kernel.host import HarnessHost
from atmosphere_harness._kernel.run import execute_prompt
from atmosphere_harness._registry import spec_of
from atmosphere_harness._tracing import Tracing
from tests.agents import echo

Wired = echo(agent(name="wired"), "Wired")


@contextmanager
def receiver() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    """An OTLP/HTTP traces endpoint on 127.0.0.1: every request decoded, answered 200."""
    received: list[ExportTraceServiceRequest] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            assert self.path == "/v1/traces"
            assert self.headers["Content-Type"] == "application/x-protobuf"
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.append(request)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", received
    finally:
        server.shutdown()
        server.server_close()


def value(attribute: Any) -> Any:
    kind = attribute.value.WhichOneof("value")
    return getattr(attribute.value, kind)


async def test_spans_reach_an_otlp_receiver_in_the_protobuf_wire_format(workspace: Path) -> None:
    runtime = ScriptedRuntime(
        [[ToolCall("write_file", {"path": "a.md", "content": "hi"}, "call-1")], "saved"]
    )
    with receiver() as (endpoint, received):
        provider = TracerProvider(resource=Resource.create({"service.name": "wire-test"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        settings = HarnessSettings(workspace_root=workspace)
        backends = resolve_backends(settings)
        host = HarnessHost(
            settings,
            runtime=runtime,
            specs=[spec_of(Wired)],
            primitives=default_primitives(backends),
            runs=backends.runs,
            hooks=[Tracing(tracer_provider=provider)],
        )
        frames: list[Frame] = []

        async def sink(frame: Frame) -> None:
            frames.append(frame)

        await host.start()
        try:
            await execute_prompt(
                host,
                host.endpoints["/atmosphere/agent/wired"],
                message="save it",
                conversation_id="wire-1",
                user_id=None,
                sink=sink,
            )
        finally:
            await host.stop()
        await asyncio.to_thread(provider.shutdown)  # flushes the batch over HTTP

    assert frames[-1].event == "complete"
    spans = [
        (resource, span)
        for request in received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    by_name = {span.name: span for _, span in spans}
    assert sorted(by_name) == ["chat scripted", "execute_tool write_file", "invoke_agent wired"]
    resource = spans[0][0].resource
    assert {a.key: value(a) for a in resource.attributes}["service.name"] == "wire-test"
    run = by_name["invoke_agent wired"]
    tool = by_name["execute_tool write_file"]
    assert tool.parent_span_id == run.span_id
    assert tool.trace_id == run.trace_id
    attributes = {a.key: value(a) for a in tool.attributes}
    assert attributes["gen_ai.tool.name"] == "write_file"
    assert attributes["gen_ai.tool.call.id"] == "call-1"
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    chat = {a.key: value(a) for a in by_name["chat scripted"].attributes}
    usage = frames[-1].data["usage"]
    chats = [span for _, span in spans if span.name == "chat scripted"]
    assert len(chats) == 2
    assert (
        sum(
            {a.key: value(a) for a in span.attributes}["gen_ai.usage.input_tokens"]
            for span in chats
        )
        == usage["inputTokens"]
    )
    assert chat["gen_ai.conversation.id"] == "wire-1"
