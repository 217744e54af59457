"""The metrics sink of the actor layer: :class:`RayMetrics` records through
``ray.util.metrics``, so every metric of
:data:`~thinkray.runtime.observability.metrics.METRICS` appears on Ray's Prometheus
endpoint (``http://<node>:<metrics_export_port>/metrics``, with Ray's ``ray_`` prefix)
and in its dashboard and Grafana.

Each process that hosts agents or directories calls :func:`install_ray_metrics` once
(the session actor, the directory and the workspace bridge do it as they start); the
runtime then reports through :func:`~thinkray.runtime.observability.metrics.metrics`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from thinkray.runtime.observability.metrics import (
    METRICS,
    MetricsSink,
    NullMetrics,
    metrics,
    set_metrics_sink,
)

__all__ = ["RayMetrics", "install_ray_metrics"]

log = logging.getLogger("thinkray.metrics")


class _Broken:
    """Stands in for an instrument that could not be created: records nothing."""

    def inc(self, value: float, tags: Mapping[str, str]) -> None:
        """Nothing."""

    def observe(self, value: float, tags: Mapping[str, str]) -> None:
        """Nothing."""

    def set(self, value: float, tags: Mapping[str, str]) -> None:
        """Nothing."""


class RayMetrics:
    """A :class:`~thinkray.runtime.observability.metrics.MetricsSink` backed by
    ``ray.util.metrics``: one Counter, Histogram or Gauge per declared metric, made on
    its first use (tag keys and bucket boundaries from its
    :class:`~thinkray.runtime.observability.metrics.MetricSpec`). A measurement costs a
    dict lookup and Ray's own call. Never raises: a failure (an undeclared name, wrong
    tags, Ray not connected) loses the measurement and is logged once per metric at
    debug level. Safe from any thread."""

    enabled = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._instruments: dict[str, Any] = {}
        self._logged: set[str] = set()

    def _make(self, name: str) -> Any:
        from ray.util import metrics as ray_metrics

        spec = METRICS[name]
        if spec.kind == "counter":
            return ray_metrics.Counter(name, spec.description, tag_keys=spec.tags)
        if spec.kind == "histogram":
            return ray_metrics.Histogram(
                name, spec.description, boundaries=list(spec.boundaries), tag_keys=spec.tags
            )
        return ray_metrics.Gauge(name, spec.description, tag_keys=spec.tags)

    def _instrument(self, name: str) -> Any:
        with self._lock:
            instrument = self._instruments.get(name)
            if instrument is None:
                try:
                    instrument = self._make(name)
                except Exception as exc:
                    self._failed(name, exc)
                    instrument = _Broken()
                self._instruments[name] = instrument
            return instrument

    def _failed(self, name: str, exc: BaseException) -> None:
        if name not in self._logged:
            self._logged.add(name)
            log.debug("metric %s not recorded: %r", name, exc)

    def count(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Add ``value`` to the counter (a zero or negative value is dropped: Ray's
        counters only grow)."""
        if value <= 0:
            return
        try:
            (self._instruments.get(name) or self._instrument(name)).inc(value, tags)
        except Exception as exc:
            self._failed(name, exc)

    def observe(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Record one sample of the histogram."""
        try:
            (self._instruments.get(name) or self._instrument(name)).observe(value, tags)
        except Exception as exc:
            self._failed(name, exc)

    def set(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Set the gauge."""
        try:
            (self._instruments.get(name) or self._instrument(name)).set(value, tags)
        except Exception as exc:
            self._failed(name, exc)


_install_lock = threading.Lock()


def install_ray_metrics() -> MetricsSink:
    """Make this process report to Ray (a :class:`RayMetrics` as its sink), once: a
    second call, a process where Ray is not initialized, or one whose host installed a
    sink of its own (a test's ``RecordingMetrics``) keeps the sink it has. Returns the
    sink in effect. Never raises."""
    with _install_lock:
        current = metrics()
        if not isinstance(current, NullMetrics):
            return current
        try:
            import ray

            if not ray.is_initialized():
                return current
        except Exception:
            return current
        sink = RayMetrics()
        set_metrics_sink(sink)
        return sink
