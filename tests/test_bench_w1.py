"""The W1 benchmark (tests/bench/bench_w1.py) keeps running: its
in-process part, for a few turns, prints every figure with sane values, beside
LangGraph's when the bench extra is installed. No timing assertions: targets live in
the benchmark, never in unit tests. No Ray (``--skip-actors``)."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.bench.w1 import main as bench_main

SMALL = ["--skip-actors", "--seq-sessions", "2", "--seq-turns", "2", "--turns", "6"]


def _has_langgraph() -> bool:
    try:
        return importlib.util.find_spec("langgraph.checkpoint.sqlite") is not None
    except ModuleNotFoundError:
        return False


def _rows(out: str) -> dict[str, list[float]]:
    """Figure name -> the numbers on its row (the first occurrence of each name)."""
    rows: dict[str, list[float]] = {}
    for line in out.splitlines():
        if not line.startswith("  ") or len(line) < 54:
            continue
        name, rest = line[2:52].strip(), line[52:]
        rest = rest.split(">=")[0].split("<=")[0]  # drop the target column
        rows.setdefault(name, [float(x) for x in re.findall(r"\d+(?:\.\d+)?", rest)])
    return rows


def _sizes(out: str, name: str) -> list[float]:
    """The byte figures on row ``name``, in bytes."""
    line = next(row for row in out.splitlines() if row[2:52].strip() == name)
    unit = {"KiB": 1024, "MB": 1e6}
    return [float(n) * unit[u] for n, u in re.findall(r"(\d+(?:\.\d+)?) (KiB|MB)", line)]


def _check_thinkray(out: str, *, peer: bool) -> None:
    rows = _rows(out)
    # with the peer each row reads: LangGraph, thinkray, ratio
    k = 1 if peer else 0
    assert rows["turns/s"][k] > 0
    assert rows["CPU per turn"][k] > 0
    p50, p95 = rows["TTFC p50 / p95"][2 * k : 2 * k + 2]
    assert 0 < p50 <= p95
    p50, p95 = rows["turn latency p50 / p95"][2 * k : 2 * k + 2]
    assert 0 < p50 <= p95
    after5 = _sizes(out, "bytes on disk after 5 turns (file + WAL, open)")
    after6 = _sizes(out, "bytes on disk after 6 turns (file + WAL, open)")
    assert len(after5) == len(after6) == 1 + k
    assert all(0 < a <= b for a, b in zip(after5, after6, strict=True))
    assert len(_sizes(out, "file after 6 turns, closed")) == 1 + k


def test_thinkray_bench_in_process(tmp_path, capsys):
    assert bench_main([*SMALL, "--no-peer", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "W1 in process, 2 sessions x 2 turns" in out
    assert "one session of 6 turns" in out
    assert "LangGraph peer skipped: --no-peer" in out
    assert "OVER TARGET" in out or " ok" in out  # verdicts are printed
    _check_thinkray(out, peer=False)


@pytest.mark.skipif(not _has_langgraph(), reason="the bench extra (LangGraph) is not installed")
def test_bench_beside_langgraph(tmp_path, capsys):
    assert bench_main([*SMALL, "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skipped" not in out
    _check_thinkray(out, peer=True)
    turns = _rows(out)["turns/s"]
    assert turns[0] > 0 and turns[2] == pytest.approx(turns[1] / turns[0], rel=0.02, abs=0.01)
    assert "sync (graph.stream, SqliteSaver)" in out


async def test_w2_in_process_times_brand_new_agents_from_before_their_file_opens(tmp_path):
    """The W2 floor row: each agent's file is new, a first turn's TTFC counts from
    before the open (as an actor's first turn counts its bind), later turns from the
    call."""
    from thinkray.runtime import Think

    from tests.bench.workloads import in_process_w2, w2_model

    class Quick(Think):
        def get_model(self):
            return w2_model(first=0.05, span=0.02, chunks=4)

    figures = await in_process_w2(tmp_path, 3, 2, agent_factory=Quick, chunks=4)
    assert sorted(turn for turn, _, _ in figures) == [1, 1, 1, 2, 2, 2]
    assert all(0.05 <= ttfc <= latency for _, ttfc, latency in figures)
    assert sorted(p.parent.name for p in tmp_path.glob("w2-*/db.duckdb")) == [
        "w2-000",
        "w2-001",
        "w2-002",
    ]


@pytest.mark.skipif(not _has_langgraph(), reason="the bench extra (LangGraph) is not installed")
def test_langgraph_w2_runs_new_threads_at_once_with_w2s_timing(tmp_path):
    """The peer's W2: every thread's turns are recorded by turn number, the first chunk
    comes no sooner than the model's first-chunk delay, and each turn streams W2's
    chunks (the peer checks the count and fails otherwise)."""
    from tests.bench.w1 import _run_peer

    phase = {
        "phase": "concurrent",
        "sessions": 3,
        "turns": 2,
        "model": "w2",
        "w2_first": 0.05,
        "w2_span": 0.02,
        "w2_chunks": 4,
    }
    (run,), _ = _run_peer(tmp_path, [phase])
    turns = run.by_turn()
    assert len(turns.first_ttfc) == len(turns.later_ttfc) == 3
    assert all(
        0.05 <= ttfc <= latency for ttfc, latency in zip(turns.ttfc, turns.latency, strict=True)
    )
    assert all(latency >= 0.07 for latency in turns.latency)  # first + span


def test_w2_section_prints_langgraph_beside_thinkray(capsys):
    """With the peer's W2, each W2 row carries LangGraph's added p50 / p95 and the
    ratio of the p50s; without it, the LangGraph column stays empty."""
    from tests.bench.w1 import (
        W2_FIRST,
        W2_SPAN,
        Report,
        RunFigures,
        _ActorFigures,
        _PeerRun,
        _report_w2,
        _Settings,
        _Turns,
    )

    ours = _Turns()
    for turn, extra in ((1, 0.2), (1, 0.3), (2, 0.004), (2, 0.006)):
        ours.add(turn, W2_FIRST + extra, W2_FIRST + W2_SPAN + extra)
    figures = _ActorFigures(
        sequential=_Turns(),
        seq_cpu_per_turn=0.0,
        cold=_Turns(),
        cold_counters={},
        warm=_Turns(),
        warm_counters={},
        uss=[],
        idle_cpu=[],
        w2=ours,
        w2_machine=(1.0, 2.0),
        placement="hosts",
    )
    extras = [0.1, 0.1, 0.002, 0.002]
    peer = _PeerRun(
        RunFigures(
            turns=4,
            wall=1.0,
            cpu=1.0,
            ttfc=[W2_FIRST + e for e in extras],
            latency=[W2_FIRST + W2_SPAN + e for e in extras],
            sizes={},
        ),
        closed_bytes=0,
        first_ttfc=[],
        turns=[1, 1, 2, 2],
    )
    settings = _Settings.__new__(_Settings)
    settings.w2_sessions, settings.w2_turns = 2, 2
    for given in (peer, None):
        rep = Report()
        _report_w2(rep, settings, figures, given)
        rep.print()
        rows = _rows(capsys.readouterr().out)
        first = rows["first turns (binding): added TTFC p50 / p95"]
        if given is None:
            assert first == [200.0, 300.0]
        else:  # LangGraph 100 / 100 ms, thinkray 200 / 300 ms, ratio of the p50s 2x
            assert first == [100.0, 100.0, 200.0, 300.0, 2.0]
            assert rows["later turns (bound): added end p50 / p95"][:2] == [2.0, 2.0]
