"""Directory benchmark (issue 13, item 4): resolves/s and wake p50/p95 with one
directory actor and with K shards, under 1,000 concurrent resolves.

    python tests/bench/bench_directory.py [--resolves 1000] [--shards 1,4]

For each K: a namespace with ``directories=K``; ``--live`` agents are bound (live)
and ``--wakes`` more are created and hibernated (their actors return to the pool as
spares). Then ``--resolves`` resolves are sent at once: one for each hibernated agent
(a wake: the directory binds a spare to its file) and the rest spread over the live
agents (a lookup). Printed: resolves/s over the burst (all resolves / its wall time),
the wake latency p50 / p95 (the resolves that bound an agent) and the lookup latency
p50 / p95. Starts a local Ray (``num_cpus=2``, no dashboard) unless one is running;
every phase is bounded by ``--deadline`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


async def _burst(ns: Any, names: list[str], deadline: float) -> tuple[float, list[float]]:
    """Resolve every name of ``names`` at once; wall time and each resolve's latency."""

    async def one(name: str) -> float:
        started = time.perf_counter()
        await ns.directory_for(name).resolve.remote(name, True, None, None)
        return time.perf_counter() - started

    started = time.perf_counter()
    latencies = await asyncio.wait_for(asyncio.gather(*(one(n) for n in names)), deadline)
    return time.perf_counter() - started, list(latencies)


def run_one(shards: int, args: argparse.Namespace, root: str) -> dict[str, Any]:
    """One K: set up the agents, then the burst; the figures."""
    import ray
    from thinkray.actors.namespace import AgentNamespace

    agents = args.live + args.wakes
    ns = AgentNamespace(
        f"bench-dir-{shards}-{os.getpid()}",
        storage_root=root,
        directories=shards,
        pool_size=agents + shards,  # every agent binds a spare: none waits, none is taken
        max_live=2 * agents,
        idle_timeout=None,
        pool_ttl=600.0,
    )
    try:
        live = [f"live-{i}" for i in range(args.live)]
        sleeping = [f"wake-{i}" for i in range(args.wakes)]
        ray.get(
            [ns.directory_for(n).resolve.remote(n, True, None, None) for n in live + sleeping],
            timeout=args.deadline,
        )
        for name in sleeping:
            ns.hibernate(name, force=True)
        # the burst: one wake per hibernated agent, lookups of the live ones for the rest
        lookups = [live[i % len(live)] for i in range(max(0, args.resolves - len(sleeping)))]
        names = sleeping + lookups
        before = ns.stats()["counters"].get("binds", 0)
        wall, latencies = asyncio.run(_burst(ns, names, args.deadline))
        binds = ns.stats()["counters"].get("binds", 0) - before
        wakes, looks = latencies[: len(sleeping)], latencies[len(sleeping) :]
        return {
            "shards": shards,
            "resolves": len(names),
            "wall": wall,
            "rate": len(names) / wall,
            "wakes": wakes,
            "lookups": looks,
            "binds": binds,
        }
    finally:
        ns.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolves", type=int, default=1000, help="resolves sent at once")
    parser.add_argument("--live", type=int, default=8, help="live agents looked up")
    parser.add_argument("--wakes", type=int, default=8, help="hibernated agents woken")
    parser.add_argument("--shards", default="1,4", help="the K values, comma-separated")
    parser.add_argument("--deadline", type=float, default=180.0, help="seconds per phase")
    parser.add_argument("--root", default=None, help="storage root (default: a temp dir)")
    args = parser.parse_args(argv)

    from tests.bench._ray import start_local_ray

    start_local_ray()  # unless one runs (a test's)
    print(
        f"directory benchmark: {args.resolves} concurrent resolves "
        f"({args.wakes} wakes, the rest lookups of {args.live} live agents)"
    )
    with tempfile.TemporaryDirectory(prefix="thinkray-bench-dir-") as scratch:
        root = args.root or scratch
        for shards in [int(k) for k in args.shards.split(",") if k.strip()]:
            try:
                r = run_one(shards, args, root)
            except TimeoutError as exc:
                print(f"K={shards}: over the {args.deadline:.0f} s deadline ({exc!r})")
                continue
            wakes, looks = r["wakes"], r["lookups"]
            print(f"K={shards} directories")
            print(f"  {'resolves/s':<34}{r['rate']:>10.0f}  ({r['resolves']} in {r['wall']:.2f} s)")
            if wakes:
                print(
                    f"  {'wake p50 / p95':<34}{_ms(statistics.median(wakes)):>10} / "
                    f"{_ms(pct(wakes, 0.95))}  ({len(wakes)} wakes, {r['binds']} binds)"
                )
            if looks:
                print(
                    f"  {'lookup p50 / p95':<34}{_ms(statistics.median(looks)):>10} / "
                    f"{_ms(pct(looks, 0.95))}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
