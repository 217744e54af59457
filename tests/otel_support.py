"""A tracing setup for actor processes in tests (``THINKRAY_OTEL_SETUP``).

Each Ray worker process that starts a thinkray actor calls :func:`install` (through
``configure_from_env``): a real OpenTelemetry SDK provider whose exporter writes every
finished span, as the SDK's own JSON, to ``$THINKRAY_TEST_SPANS/<pid>.jsonl``. The test
reads the files of all processes back and rebuilds the trace tree across actors.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

SPANS_ENV = "THINKRAY_TEST_SPANS"


@contextlib.contextmanager
def in_memory_spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """thinkray's spans in this process go to the SDK's in-memory exporter for the
    block (``tracing.set_tracer_provider``); tracing is off again after it."""
    from thinkray.runtime.observability import tracing

    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)
    try:
        yield provider, exporter
    finally:
        tracing.set_tracer_provider(None)
        tracing.capture_content(False)
        provider.shutdown()


def install() -> None:
    folder = Path(os.environ[SPANS_ENV])
    folder.mkdir(parents=True, exist_ok=True)
    out = open(folder / f"{os.getpid()}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
    provider = TracerProvider(resource=Resource.create({"process.pid": os.getpid()}))
    exporter = ConsoleSpanExporter(out=out, formatter=lambda s: s.to_json(indent=None) + "\n")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def read_spans(folder: Path) -> list[dict[str, Any]]:
    """Every span the processes wrote, each with its process id under ``pid``."""
    spans = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                span = json.loads(line)
                span["pid"] = int(path.stem)
                spans.append(span)
    return spans
