"""The tracing overhead benchmark (tests/bench/bench_tracing.py) keeps running: a tiny
run prints every variant's figures with sane values and both overhead lines. No timing
assertions: the targets live in the benchmark."""

from __future__ import annotations

import importlib
import re


def test_tracing_bench_prints_every_variant_and_the_overheads(capsys):
    bench = importlib.import_module("tests.bench.bench_tracing")
    assert bench.main(["--rounds", "1", "--sessions", "1", "--turns", "5"]) == 0
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        m = re.match(
            r"\s+(baseline|off|on)\s+([\d.]+) ms\s+([\d.]+) ms\s+([\d.]+) ms\s*(\d*)", line
        )
        if m:
            rows[m.group(1)] = m.groups()[1:]
    # the baseline comes from git history; a clone without it still measures off and on
    assert {"off", "on"} <= set(rows)
    for cpu, wall, p95, _ in rows.values():
        assert float(cpu) > 0 and float(wall) > 0 and float(p95) > 0
    # with tracing on, every turn left its spans (5 turns, one with a tool call)
    assert int(rows["on"][3]) >= 10 and rows["off"][3] == ""
    assert re.search(r"tracing on vs off: [+-][\d.]+% CPU/turn", out)
    if "baseline" in rows:
        assert re.search(r"tracing off vs before observability: [+-][\d.]+% CPU/turn", out)
