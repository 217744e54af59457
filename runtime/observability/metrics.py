"""The runtime's metrics seam: what is measured, by name, and where it goes.

The runtime (no Ray here) reports through :func:`metrics` — a process-wide
:class:`MetricsSink`. Nothing is recorded until a host installs one with
:func:`set_metrics_sink`: the actor layer installs one backed by
``ray.util.metrics`` (Ray's Prometheus endpoint and dashboard), a test may install
:class:`RecordingMetrics`. Every metric the project emits is declared in
:data:`METRICS`, with its kind, tags and (for histograms) bucket boundaries, so a sink
can create its instruments up front and a typo is an error, not a new series.

Tags are low-cardinality on purpose: the namespace, the agent's class, the model, the
tool — never a session id or agent name (a fleet has millions of those).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "METRICS",
    "MetricKind",
    "MetricSpec",
    "MetricsSink",
    "NullMetrics",
    "RecordingMetrics",
    "metrics",
    "set_metrics_sink",
]

MetricKind = Literal["counter", "histogram", "gauge"]

# Seconds: from a cached turn (a few ms) to a slow model call (minutes).
LATENCY_BOUNDARIES = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its Prometheus name, kind, help text, tag keys and (histograms)
    bucket boundaries."""

    name: str
    kind: MetricKind
    description: str
    tags: tuple[str, ...]
    boundaries: tuple[float, ...] = ()


def _specs(*specs: MetricSpec) -> dict[str, MetricSpec]:
    return {s.name: s for s in specs}


METRICS: dict[str, MetricSpec] = _specs(
    # -- turns (thinkray.runtime.agents.turns) --------------------------------------------
    MetricSpec(
        "thinkray_turns_total",
        "counter",
        "Turns finished, by status (completed, aborted, error).",
        ("namespace", "agent", "status"),
    ),
    MetricSpec(
        "thinkray_turn_seconds",
        "histogram",
        "Wall time of a turn, from its start to its final write.",
        ("namespace", "agent", "status"),
        LATENCY_BOUNDARIES,
    ),
    MetricSpec(
        "thinkray_ttfc_seconds",
        "histogram",
        "Time from a turn's start to its first streamed content chunk (text, reasoning "
        "or tool input).",
        ("namespace", "agent"),
        LATENCY_BOUNDARIES,
    ),
    MetricSpec(
        "thinkray_aborts_total",
        "counter",
        "Turns that ended aborted.",
        ("namespace", "agent"),
    ),
    MetricSpec(
        "thinkray_model_calls_total",
        "counter",
        "Model calls (one per step and retry), by outcome (ok, error).",
        ("namespace", "model", "outcome"),
    ),
    MetricSpec(
        "thinkray_tokens_total",
        "counter",
        "Tokens by model and kind (input, output, reasoning, cache_read, cache_write).",
        ("namespace", "model", "kind"),
    ),
    MetricSpec(
        "thinkray_tool_calls_total",
        "counter",
        "Tool calls by tool and outcome (ok, error, denied); errors include invalid "
        "input and aborted calls.",
        ("namespace", "tool", "outcome"),
    ),
    MetricSpec(
        "thinkray_compactions_total",
        "counter",
        "Compactions of a session's history.",
        ("namespace", "agent"),
    ),
    # -- the actor layer (thinkray.actors) -----------------------------------------------
    MetricSpec(
        "thinkray_agents_live",
        "gauge",
        "Agents bound to an actor, per namespace (reported by each directory shard).",
        ("namespace", "shard"),
    ),
    MetricSpec(
        "thinkray_agents_hibernated",
        "gauge",
        "Agents with a file in the namespace that are not live (per directory shard).",
        ("namespace", "shard"),
    ),
    MetricSpec(
        "thinkray_pool_free",
        "gauge",
        "Warm pooled actors waiting for a bind.",
        ("namespace", "shard"),
    ),
    MetricSpec(
        "thinkray_pool_hits_total",
        "counter",
        "Binds served by a warm pooled actor.",
        ("namespace",),
    ),
    MetricSpec(
        "thinkray_pool_misses_total",
        "counter",
        "Binds that had to wait for an actor to start (or for an idle agent to hibernate).",
        ("namespace",),
    ),
    MetricSpec(
        "thinkray_wakes_total",
        "counter",
        "Agents woken (bound to an actor from their file).",
        ("namespace",),
    ),
    MetricSpec(
        "thinkray_wake_seconds",
        "histogram",
        "Time to wake an agent inside its actor (download, open, construct, on_wake).",
        ("namespace",),
        LATENCY_BOUNDARIES,
    ),
    MetricSpec(
        "thinkray_hibernations_total",
        "counter",
        "Agents hibernated (file closed, actor back in the pool).",
        ("namespace",),
    ),
    MetricSpec(
        "thinkray_storage_bytes",
        "gauge",
        "Bytes of the agents' files in the namespace, as of their last hibernation or "
        "wake (per directory shard).",
        ("namespace", "shard"),
    ),
    MetricSpec(
        "thinkray_host_loop_lag_seconds",
        "gauge",
        "An agent host's event-loop lag: the most a 50 ms timer fired late over the "
        "last 2 s (placement hosts; what one agent's blocking work costs its siblings).",
        ("namespace",),
    ),
    MetricSpec(
        "thinkray_spans_dropped_total",
        "counter",
        "Finished spans dropped because the exporter's queue was full or it failed.",
        (),
    ),
)


class MetricsSink(Protocol):
    """Where measurements go. Every method is called on the hot path of a turn: an
    implementation must not block, must not raise (a broken backend loses the
    measurement, never the turn) and must accept being called from any thread.
    ``name`` is a key of :data:`METRICS`; ``tags`` carries exactly its tag keys."""

    def count(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Add ``value`` (≥ 0) to a counter."""
        ...

    def observe(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Record one sample of a histogram."""
        ...

    def set(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Set a gauge."""
        ...


class NullMetrics:
    """The sink until a host installs one: records nothing, costs a method call."""

    enabled = False

    def count(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Nothing."""

    def observe(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Nothing."""

    def set(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Nothing."""


class RecordingMetrics:
    """A sink that keeps everything in memory (tests, and the benchmarks): counter
    sums, histogram samples and gauge values per ``(name, sorted tags)``. Checks names
    and tag keys against :data:`METRICS` and raises on a mismatch, so a test catches
    what a real backend would silently split into a new series."""

    enabled = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: defaultdict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(
            float
        )
        self.samples: defaultdict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = (
            defaultdict(list)
        )
        self.gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    @staticmethod
    def _key(name: str, kind: MetricKind, tags: Mapping[str, str]) -> tuple[str, tuple]:
        spec = METRICS.get(name)
        if spec is None or spec.kind != kind:
            raise KeyError(f"{name!r} is not a declared {kind}")
        if set(tags) != set(spec.tags):
            raise KeyError(f"{name}: tags {sorted(tags)} != declared {sorted(spec.tags)}")
        return name, tuple(sorted(tags.items()))

    def count(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Add to the counter."""
        key = self._key(name, "counter", tags)
        with self._lock:
            self.counters[key] += value

    def observe(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Keep the sample."""
        key = self._key(name, "histogram", tags)
        with self._lock:
            self.samples[key].append(value)

    def set(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Keep the value."""
        key = self._key(name, "gauge", tags)
        with self._lock:
            self.gauges[key] = value

    def total(self, name: str, **tags: str) -> float:
        """A counter summed over the series whose tags include ``tags``."""
        want = set(tags.items())
        return sum(v for (n, t), v in self.counters.items() if n == name and want <= set(t))

    def observed(self, name: str, **tags: str) -> list[float]:
        """A histogram's samples over the series whose tags include ``tags``."""
        want = set(tags.items())
        return [
            x for (n, t), xs in self.samples.items() if n == name and want <= set(t) for x in xs
        ]


_sink: MetricsSink = NullMetrics()


def metrics() -> MetricsSink:
    """This process's sink (a :class:`NullMetrics` until one is installed)."""
    return _sink


def set_metrics_sink(sink: MetricsSink | None) -> MetricsSink:
    """Install ``sink`` for this process (None: record nothing); returns the previous."""
    global _sink
    previous = _sink
    _sink = sink if sink is not None else NullMetrics()
    return previous
