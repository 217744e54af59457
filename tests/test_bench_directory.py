"""The directory benchmark (tests/bench/bench_directory.py) keeps running: a small
burst with one directory and with two shards prints every figure with sane values.
No timing assertions: figures only."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

BENCH = Path(__file__).resolve().parent / "bench" / "bench_directory.py"


def test_directory_bench_runs_small(ray_local, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_directory", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--resolves", "40", "--live", "2", "--wakes", "2", "--shards", "1,2"]
    assert bench.main([*argv, "--root", str(tmp_path), "--deadline", "120"]) == 0
    out = capsys.readouterr().out
    assert "40 concurrent resolves" in out
    for k in (1, 2):
        block = out.split(f"K={k} directories")[1]
        rate = re.search(r"resolves/s\s+(\d+)", block)
        assert rate is not None and int(rate.group(1)) > 0
        wake = re.search(
            r"wake p50 / p95\s+([\d.]+) ms / ([\d.]+) ms\s+\(2 wakes, (\d+) binds", block
        )
        assert wake is not None
        assert 0 < float(wake.group(1)) <= float(wake.group(2))
        assert int(wake.group(3)) == 2  # each hibernated agent bound once, the rest looked up
        assert "lookup p50 / p95" in block
