"""The ingress benchmark (tests/bench/bench_ingress.py) keeps running: a few concurrent
streams through the in-process ingress (and through ``thinkray serve --direct``'s server
in a process of its own) and directly, with every figure printed and no errors. No
timing assertions: figures belong to the benchmark, never to unit tests."""

from __future__ import annotations

import importlib
import re

import pytest

pytestmark = pytest.mark.ray


def _load_bench():
    # By its module name: --via direct's server process imports its function by name.
    return importlib.import_module("tests.bench.bench_ingress")


@pytest.mark.parametrize("via", ["uvicorn", "direct"])
def test_bench_ingress_small(ray_local, tmp_path, capsys, via):
    bench = _load_bench()
    argv = ["--via", via, "--streams", "6", "--agents", "2", "--rounds", "2"]
    argv += ["--turns", "1", "--chunks", "5", "--delay", "0", "--root", str(tmp_path)]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert f"via {via}" in out
    assert "6 concurrent streams x 2 rounds x 1 turns" in out
    for way in ("through the ingress (HTTP/SSE):", "direct (actor):"):
        section = out.split(way, 1)[1]
        rate = re.search(r"chunks/s\s+([\d,]+) \(([\d,]+) chunks", section)
        assert rate and int(rate.group(2).replace(",", "")) > 0
        p50, p95 = map(
            float, re.search(r"TTFC p50 / p95\s+([\d.]+) / ([\d.]+) ms", section).groups()
        )
        assert 0 < p50 <= p95
        assert re.search(r"errors\s+0\s", section)
    assert "added by the ingress (HTTP minus direct):" in out
    assert "chunks/s, ingress / direct" in out
