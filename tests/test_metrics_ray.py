"""Metrics through ``ray.util.metrics`` (issue 14, item 2): a namespace runs turns (one
with a tool call, one aborted), hibernates and wakes, and the test reads the values
back from Ray's Prometheus endpoint over HTTP — the node's metrics export port, as
Prometheus would scrape it — not from the metric classes."""

from __future__ import annotations

import re
import time
import urllib.request
import uuid

import pytest
from thinkray.actors.metrics import RayMetrics, install_ray_metrics
from thinkray.runtime.observability.metrics import (
    METRICS,
    NullMetrics,
    RecordingMetrics,
    metrics,
    set_metrics_sink,
)

from tests.helpers import wait_until

SCRAPE_DEADLINE = 90.0  # Ray exports on an interval (~10 s): poll until the values appear
PREFIX = "ray_"  # Ray prefixes the names of application metrics

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition: (name, labels, value)."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        samples.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return samples


class Scrape:
    """One scrape of the endpoint; values summed over the series (every worker process
    reports its own) whose labels include the ones asked for."""

    def __init__(self, text: str) -> None:
        self.samples = parse_prometheus(text)

    def value(self, name: str, **labels: str) -> float:
        want = labels.items()
        return sum(v for n, ls, v in self.samples if n == name and want <= ls.items())

    def has(self, name: str, **labels: str) -> bool:
        want = labels.items()
        return any(n == name and want <= ls.items() for n, ls, _ in self.samples)

    def names(self) -> set[str]:
        return {n for n, _, _ in self.samples}


def metrics_url(ray) -> str:
    """Ray's Prometheus endpoint on this driver's node (``MetricsExportPort``)."""
    node_id = ray.get_runtime_context().get_node_id()
    node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
    return f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=10) as response:
        return Scrape(response.read().decode())


def scrape_until(url: str, check, deadline: float = SCRAPE_DEADLINE) -> Scrape:
    """Scrape until ``check(scrape)`` passes (it asserts); the last failure if it never
    does within ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while True:
        try:
            current = scrape(url)
            check(current)
            return current
        except (AssertionError, OSError):
            if time.monotonic() > end:
                raise
            time.sleep(1.0)


# -- through a real local Ray ------------------------------------------------------------


@pytest.mark.ray
def test_metrics_reach_rays_prometheus_endpoint(namespace_factory, ray_local):
    namespace = f"metrics-{uuid.uuid4().hex[:10]}"
    ns = namespace_factory(name=namespace, agent_kwargs={"chunks": 60, "delay": 0.02})
    agent = ns.get("alice")

    assert agent.chat.remote("hello").result().status == "completed"
    assert agent.chat.remote("what is the weather in Paris").result().status == "completed"

    run = agent.stream_chat.remote("a long answer, please")
    for chunk in run:
        if chunk["type"] == "text-delta":
            break
    assert run.receiver.abort("enough")
    result = agent.wait_run.remote(run.run_id).result()
    assert result is None or result.status == "aborted"
    wait_until(lambda: agent.get_status.remote().result().state == "idle")

    assert ns.hibernate("alice")
    assert agent.chat.remote("back again").result().status == "completed"  # a second wake
    bob = ns.get("bob")
    assert bob.chat.remote("hi").result().status == "completed"
    assert ns.hibernate("bob")

    ns_tag = {"namespace": namespace}
    shard = {"namespace": namespace, "shard": "0"}

    def m(name: str) -> str:
        return PREFIX + name

    def actor_layer(s: Scrape) -> None:
        assert s.value(m("thinkray_wakes_total"), **ns_tag) >= 3  # alice twice, bob
        assert s.value(m("thinkray_wake_seconds_count"), **ns_tag) >= 3
        assert s.value(m("thinkray_hibernations_total"), **ns_tag) >= 2
        hits = s.value(m("thinkray_pool_hits_total"), **ns_tag)
        misses = s.value(m("thinkray_pool_misses_total"), **ns_tag)
        assert hits + misses >= 3
        assert s.value(m("thinkray_agents_live"), **shard) == 1  # alice
        assert s.value(m("thinkray_agents_hibernated"), **shard) == 1  # bob
        assert s.value(m("thinkray_storage_bytes"), **shard) > 0
        assert s.has(m("thinkray_pool_free"), **shard)

    def runtime(s: Scrape) -> None:
        assert s.value(m("thinkray_turns_total"), status="completed", **ns_tag) >= 4
        assert s.value(m("thinkray_turns_total"), status="aborted", **ns_tag) >= 1
        assert s.value(m("thinkray_aborts_total"), **ns_tag) >= 1
        assert s.value(m("thinkray_turn_seconds_count"), **ns_tag) >= 5
        assert s.value(m("thinkray_ttfc_seconds_count"), **ns_tag) >= 4
        tokens = {"model": "script", **ns_tag}
        assert s.value(m("thinkray_tokens_total"), kind="input", **tokens) > 0
        assert s.value(m("thinkray_tokens_total"), kind="output", **tokens) > 0
        assert s.value(m("thinkray_model_calls_total"), outcome="ok", **ns_tag) >= 5
        weather = {"tool": "get_weather", "outcome": "ok", **ns_tag}
        assert s.value(m("thinkray_tool_calls_total"), **weather) == 1

    url = metrics_url(ray_local)
    scraped = scrape_until(url, lambda s: (actor_layer(s), runtime(s)))
    exported = {n for n in scraped.names() if n.startswith(PREFIX + "thinkray_")}
    assert {PREFIX + "thinkray_wakes_total", PREFIX + "thinkray_storage_bytes"} <= exported


# -- the sink itself (no Ray) ------------------------------------------------------------


def test_ray_metrics_never_raises():
    sink = RayMetrics()
    sink.count("thinkray_no_such_metric", 1, {})
    sink.count("thinkray_wakes_total", 1, {"wrong": "tags"})
    sink.count("thinkray_wakes_total", 0, {"namespace": "n"})  # dropped, not an error
    sink.observe("thinkray_wakes_total", 1.0, {"namespace": "n"})  # not a histogram
    sink.set("thinkray_agents_live", 1, {"namespace": "n", "shard": 7})  # type: ignore[dict-item]


def test_install_keeps_a_sink_the_host_installed():
    recording = RecordingMetrics()
    previous = set_metrics_sink(recording)
    try:
        assert install_ray_metrics() is recording
        assert metrics() is recording
    finally:
        set_metrics_sink(previous)


def test_recording_metrics_checks_names_and_tags():
    sink = RecordingMetrics()
    sink.count("thinkray_wakes_total", 2, {"namespace": "a"})
    sink.count("thinkray_wakes_total", 1, {"namespace": "b"})
    sink.observe("thinkray_wake_seconds", 0.5, {"namespace": "a"})
    sink.set("thinkray_agents_live", 3, {"namespace": "a", "shard": "0"})
    assert sink.total("thinkray_wakes_total") == 3
    assert sink.total("thinkray_wakes_total", namespace="a") == 2
    assert sink.observed("thinkray_wake_seconds", namespace="a") == [0.5]
    with pytest.raises(KeyError):
        sink.count("thinkray_wake_seconds", 1, {"namespace": "a"})  # a histogram
    with pytest.raises(KeyError):
        sink.count("thinkray_wakes_total", 1, {"namespace": "a", "agent": "x"})
    null = NullMetrics()
    null.count("anything", 1, {})  # records nothing, checks nothing


def test_every_declared_metric_has_a_valid_ray_shape():
    for name, spec in METRICS.items():
        assert name.startswith("thinkray_") and re.fullmatch(r"[a-z_]+", name)
        assert (spec.kind == "histogram") == bool(spec.boundaries), name
        assert list(spec.boundaries) == sorted(spec.boundaries), name


def test_scrape_parser_sums_series_over_workers():
    text = (
        "# HELP ray_x_total d\n# TYPE ray_x_total counter\n"
        'ray_x_total{WorkerId="a",namespace="n",tool="t"} 2.0\n'
        'ray_x_total{WorkerId="b",namespace="n",tool="u"} 3.0\n'
        'ray_x_total{WorkerId="c",namespace="other",tool="t"} 5.0\n'
    )
    s = Scrape(text)
    assert s.value("ray_x_total", namespace="n") == 5.0
    assert s.value("ray_x_total", namespace="n", tool="t") == 2.0
    assert s.value("ray_y") == 0
