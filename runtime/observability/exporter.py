"""A span processor that never makes a turn wait for its exporter.

:class:`BoundedSpanProcessor` puts each finished span into a bounded queue and returns;
one daemon thread exports them in batches. When the exporter is slow, hangs or cannot
reach its endpoint, the queue fills and further spans are *dropped and counted*
(:attr:`BoundedSpanProcessor.dropped`, and the ``thinkray_spans_dropped_total``
metric) — the turn that produced them never blocks and never sees an error. The
OpenTelemetry SDK's ``BatchSpanProcessor`` also bounds its queue, but it neither
exposes how many spans it dropped nor bounds how long ``force_flush`` waits on a hung
exporter; this one does both.

Needs the OpenTelemetry SDK (``pip install "thinkray[otel]"``).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from thinkray.runtime.observability.metrics import metrics

__all__ = ["BoundedSpanProcessor"]

log = logging.getLogger("thinkray.tracing")


class BoundedSpanProcessor(SpanProcessor):
    """Export finished spans from a background thread through a bounded queue.

    Contract: :meth:`on_end` is O(1) and never blocks or raises; at most ``max_queue``
    spans wait; a span that finds the queue full is dropped (counted in ``dropped``).
    Spans are exported in the order they ended, in batches of up to ``max_batch``,
    at least every ``interval`` seconds. An export that fails or raises loses its
    batch (counted in ``dropped`` and ``failed_batches``); the thread goes on.
    :meth:`force_flush` and :meth:`shutdown` wait at most their timeout.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue: int = 2048,
        max_batch: int = 256,
        interval: float = 1.0,
    ) -> None:
        if max_queue < 1 or max_batch < 1:
            raise ValueError("max_queue and max_batch must be at least 1")
        self.exporter = exporter
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.interval = interval
        self.dropped = 0
        self.exported = 0
        self.failed_batches = 0
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="thinkray-span-export", daemon=True)
        self._thread.start()

    # -- SpanProcessor ------------------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Nothing to do when a span starts."""

    def on_end(self, span: ReadableSpan) -> None:
        """Queue the span, or drop it (counted) if the queue is full or we stopped."""
        if self._stopped or not span.context.trace_flags.sampled:
            return
        wake = False
        with self._lock:
            if len(self._queue) >= self.max_queue:
                self.dropped += 1
                dropped = True
            else:
                self._queue.append(span)
                self._idle.clear()
                dropped = False
                wake = len(self._queue) >= self.max_batch
        if dropped:
            metrics().count("thinkray_spans_dropped_total", 1, {})
        elif wake:
            self._wake.set()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Wait (at most ``timeout_millis``) until every queued span was exported or
        dropped; False on timeout."""
        self._wake.set()
        return self._idle.wait(timeout_millis / 1000)

    def shutdown(self) -> None:
        """Flush for at most 2 s, stop the thread and shut the exporter down. Runs at
        the process's exit: a collector that is down delays the exit by seconds at
        most, never hangs it (the daemon thread is left to the interpreter)."""
        self.force_flush(2_000)
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=1.0)
        try:
            self.exporter.shutdown()
        except Exception:
            log.debug("span exporter shutdown failed", exc_info=True)

    # -- the export thread --------------------------------------------------------------

    def _take(self) -> list[ReadableSpan]:
        with self._lock:
            n = min(len(self._queue), self.max_batch)
            return [self._queue.popleft() for _ in range(n)]

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self.interval)
            self._wake.clear()
            while True:
                batch = self._take()
                if not batch:
                    break
                self._export(batch)
            with self._lock:
                if not self._queue:
                    self._idle.set()

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        started = time.monotonic()
        try:
            result = self.exporter.export(batch)
        except Exception as exc:
            result = SpanExportResult.FAILURE
            log.debug("span export raised %s", exc, exc_info=True)
        if result == SpanExportResult.SUCCESS:
            self.exported += len(batch)
            return
        self.failed_batches += 1
        self.dropped += len(batch)
        metrics().count("thinkray_spans_dropped_total", len(batch), {})
        if self.failed_batches in (1, 10, 100) or self.failed_batches % 1000 == 0:
            log.warning(
                "span export failed (%d batches so far, %d spans dropped; last took %.1fs)",
                self.failed_batches,
                self.dropped,
                time.monotonic() - started,
            )
