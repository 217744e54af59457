"""The hosts benchmark's slow-disk burst (tests/bench/bench_hosts.py) keeps running: a
few brand-new sessions into hosts syncing off the loop and in place, every row
printed, no turn failed. No timing assertions: figures belong to the benchmark."""

from __future__ import annotations

import importlib
import re

import pytest

pytestmark = pytest.mark.ray


def test_bench_hosts_slow_disk_small(ray_local, monkeypatch, capsys):
    from tests.bench.workloads import SYNC_DELAY_ENV

    monkeypatch.setenv(SYNC_DELAY_ENV, "0")  # restored after: main() sets it
    bench = importlib.import_module("tests.bench.bench_hosts")
    argv = ["--skip-memory", "--skip-wake", "--burst", "3", "--rounds", "1"]
    assert bench.main([*argv, "--sync-delay", "5"]) == 0
    out = capsys.readouterr().out
    assert "3 brand-new sessions at once" in out
    for way in ("off the loop", "in place"):
        p50, p95 = map(int, re.search(rf"syncs {way}.*?\s(-?\d+) / (-?\d+) ms", out).groups())
        assert p50 <= p95
    assert re.search(r"turns failed\s+0\s", out)
