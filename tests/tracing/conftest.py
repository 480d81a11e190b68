"""The SDK's in-memory span exporter and metric reader, set as the global providers once per
process (OpenTelemetry lets a process set them only once); each test reads what its own runs
recorded."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class Recording(SpanProcessor):
    """Hands ended spans to the exporter only while a tracing test records (the other tests of
    this process leave nothing behind)."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self.on = False

    def on_start(self, span: Span, parent_context: object = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            self.inner.on_end(span)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


@dataclass
class Telemetry:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    recording: Recording

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.spans() if span.name.startswith(prefix)]


_GLOBAL: Telemetry | None = None


def _global() -> Telemetry:
    global _GLOBAL
    if _GLOBAL is None:
        exporter = InMemorySpanExporter()
        recording = Recording(SimpleSpanProcessor(exporter))
        provider = TracerProvider()
        provider.add_span_processor(recording)
        trace.set_tracer_provider(provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _GLOBAL = Telemetry(exporter, reader, recording)
    return _GLOBAL


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    recorded = _global()
    recorded.exporter.clear()
    recorded.recording.on = True
    try:
        yield recorded
    finally:
        recorded.recording.on = False
        recorded.exporter.clear()
