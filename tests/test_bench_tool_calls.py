"""The durable tool calls benchmark (tests/bench/bench_tool_calls.py) keeps running: a
tiny run in process, and one through the suite's Ray, print every figure with sane
values, and no call is lost or executed twice. No timing assertions: targets live in
the benchmark, never in unit tests."""

from __future__ import annotations

import importlib
import re

import pytest

TINY = ["--round-trips", "3", "--ray-round-trips", "3", "--generations", "3", "--steps", "2"]
TINY += ["--workers", "2", "--work", "0", "--inline", "3"]


def _bench():
    # By its package name, so Ray's workers import the agent class the same way.
    return importlib.import_module("tests.bench.bench_tool_calls")


def _numbers(section: str, name: str) -> list[float]:
    """The figures on row ``name`` of ``section`` (the target column dropped)."""
    row = next(r for r in section.splitlines() if r[2:54].strip() == name)
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", row[54:84])]


def _check_round_trip(section: str) -> None:
    p50, p95 = _numbers(section, "submit -> turn continues p50 / p95")
    assert 0 < p50 <= p95
    p50, p95 = _numbers(section, "submit -> caller sees tool-output p50 / p95")
    assert 0 < p50 <= p95
    assert " ok" in section or "OVER TARGET" in section  # a verdict is printed


def _check_generations(section: str, g: int, calls: int) -> None:
    assert _numbers(section, "generations completed") == [g, g]
    assert _numbers(section, "tool calls completed (rows)") == [calls]
    assert _numbers(section, "calls lost") == [0]
    assert _numbers(section, "calls executed twice") == [0]
    assert _numbers(section, "claims per call (max attempts)") == [1]
    p50, p95 = _numbers(section, "per call: submit -> turn continues p50 / p95")
    assert 0 < p50 <= p95


def _check_inline(section: str) -> None:
    for name in (
        "turn with one inline call, ledger p50",
        "the same turn, ledger bypassed p50",
        "ToolCallLedger.execute p50 (row insert + move)",
        "run_tool alone p50",
    ):
        assert _numbers(section, name)[0] > 0


def test_bench_tool_calls_in_process(tmp_path, capsys):
    assert _bench().main([*TINY, "--no-ray", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    head, rest = out.split("tool result round trip, in process (3 calls", 1)
    trips, rest = rest.split("3 concurrent generations x 2 external calls, in process", 1)
    gens, inline = rest.split("inline tool call overhead", 1)
    _check_round_trip(trips)
    _check_generations(gens, 3, 6)
    _check_inline(inline)
    assert "through Ray" not in out


@pytest.mark.ray
def test_bench_tool_calls_through_ray(ray_local, tmp_path, capsys):
    assert _bench().main([*TINY, "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    _, rest = out.split("tool result round trip, through Ray (3 calls", 1)
    trips, rest = rest.split("3 concurrent generations x 2 external calls, through Ray", 1)
    gens, _ = rest.split("inline tool call overhead", 1)
    _check_round_trip(trips)
    _check_generations(gens, 3, 6)
    assert ray_local.is_initialized()  # the suite's Ray is left running
