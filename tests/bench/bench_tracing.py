"""What observability costs a turn (issue 14): W1 in process, with tracing off and on.

    python tests/bench/bench_tracing.py [--rounds 5] [--sessions 4] [--turns 25]
        [--baseline-ref REF] [--no-baseline]

Three variants of the same in-process W1 workload (``tests.bench.workloads``:
streamed replies, a tool call every 5th turn, each session its own DuckDB file):

- ``baseline``: the code before observability existed (``--baseline-ref``, default the
  commit before the observability seam), taken from git into a scratch folder;
- ``off``: this tree, no tracer provider (what every user without tracing runs);
- ``on``: this tree, the real OpenTelemetry SDK recording every span through
  thinkray's BoundedSpanProcessor into the SDK's in-memory exporter.

Each variant runs in its own fresh process, the variants alternating round by round
(this machine has 2 cores and is noisy: interleaving spreads the noise evenly). The
figure is CPU time per turn (the process's, steadier than wall time), median over the
rounds; wall time per turn and turn latency p95 are printed beside it. Targets: ``off``
≤ 5% over ``baseline``; ``on`` ≤ 15% over ``off``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BASELINE_REF = "985efb8~1"
"""The last commit before observability (issue 14's first commit is 985efb8)."""

OFF_TARGET = 0.05
ON_TARGET = 0.15

RUNNER = r"""
import asyncio, json, sys, tempfile, time
variant, sessions, turns, base = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if variant == "baseline":
    # The old tree's packages under a bare 'thinkray' namespace, found before the
    # editable install's finder (which sits after the path finder on sys.meta_path).
    import types
    pkg = types.ModuleType("thinkray")
    pkg.__path__ = [base]
    sys.modules["thinkray"] = pkg
spans = None
if variant == "on":
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from thinkray.runtime.observability import tracing
    from thinkray.runtime.observability.exporter import BoundedSpanProcessor
    provider = TracerProvider()
    spans = InMemorySpanExporter()
    processor = BoundedSpanProcessor(spans, max_queue=100_000)
    provider.add_span_processor(processor)
    tracing.set_tracer_provider(provider)
import thinkray.runtime
from tests.bench.workloads import in_process_w1
with tempfile.TemporaryDirectory() as root:
    asyncio.run(in_process_w1(root + "/warm", 1, 3))  # code paths and caches warm
    figures = asyncio.run(in_process_w1(root + "/run", sessions, turns))
n_spans = None
if spans is not None:
    processor.force_flush()
    n_spans = len(spans.get_finished_spans())
lat = sorted(figures.latency)
print(json.dumps({
    "variant": variant,
    "code": thinkray.runtime.__path__[0],
    "turns": figures.turns,
    "cpu_per_turn": figures.cpu / figures.turns,
    "wall_per_turn": figures.wall / figures.turns,
    "p95": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
    "spans": n_spans,
}))
"""


def _baseline_tree(ref: str, into: Path) -> Path | None:
    """The packages of ``ref`` laid out as ``<into>/thinkray/{runtime,storage}``; None
    when git or the ref is not available (a shallow clone, an archive)."""
    repo = Path(__file__).resolve().parents[2]
    target = into / "thinkray"
    target.mkdir(parents=True)
    try:
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", ref, "runtime", "storage"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"baseline {ref} unavailable: {exc}", file=sys.stderr)
        return None
    return target


def _run(variant: str, sessions: int, turns: int, base: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, variant, str(sessions), str(turns), base],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "THINKRAY_TRACING": ""},
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the table; 0 (targets are reported, not enforced)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=25)
    parser.add_argument("--baseline-ref", default=BASELINE_REF)
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="thinkray-bench-tracing-"))
    try:
        base = None if args.no_baseline else _baseline_tree(args.baseline_ref, scratch)
        variants = (["baseline"] if base else []) + ["off", "on"]
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for r in range(args.rounds):
            for v in variants if r % 2 == 0 else reversed(variants):
                runs[v].append(_run(v, args.sessions, args.turns, str(base or "")))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def median(v: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[v])

    turns = runs["off"][0]["turns"]
    print(
        f"W1 in process: {args.sessions} sessions x {args.turns} turns = {turns} turns "
        f"per run, {args.rounds} rounds, medians"
    )
    print(f"  {'variant':<10}{'CPU/turn':>14}{'wall/turn':>14}{'turn p95':>14}{'spans':>10}")
    for v in variants:
        spans = runs[v][0]["spans"]
        print(
            f"  {v:<10}{_ms(median(v, 'cpu_per_turn')):>14}"
            f"{_ms(median(v, 'wall_per_turn')):>14}{_ms(median(v, 'p95')):>14}"
            f"{'' if spans is None else spans:>10}"
        )
    off, on = median("off", "cpu_per_turn"), median("on", "cpu_per_turn")
    if base:
        overhead = off / median("baseline", "cpu_per_turn") - 1
        verdict = "ok" if overhead <= OFF_TARGET else "OVER TARGET"
        print(
            f"  tracing off vs before observability: {overhead * 100:+.1f}% CPU/turn "
            f"(target <= {OFF_TARGET * 100:.0f}%) {verdict}"
        )
    overhead = on / off - 1
    verdict = "ok" if overhead <= ON_TARGET else "OVER TARGET"
    print(
        f"  tracing on vs off: {overhead * 100:+.1f}% CPU/turn "
        f"(target <= {ON_TARGET * 100:.0f}%) {verdict}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
