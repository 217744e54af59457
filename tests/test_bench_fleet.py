"""The fleet benchmark (tests/bench/bench_fleet.py) keeps running: a tiny fleet of 200
agents, every figure printed and sane. No timing assertions."""

from __future__ import annotations

import importlib


def test_bench_fleet_tiny(ray_local, capsys):
    bench = importlib.import_module("tests.bench.bench_fleet")
    figures = bench.run(agents=200, wakes=2, messages=4, root=None, keep=False)
    out = capsys.readouterr().out
    for label in ("bytes per agent", "index size", "sessions ls", "stats --json", "wake of"):
        assert label in out
    assert figures["agents"] == 200
    assert figures["bytes_per_agent"] > 0 and figures["index_bytes"] > 0
    assert 0 < figures["wake_p50_ms"] <= figures["wake_p95_ms"]
