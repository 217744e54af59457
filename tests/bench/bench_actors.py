"""Session-actor benchmarks (issue 3). Prints figures and ratios measured in one run.

    python tests/bench/bench_actors.py [--quick]

Targets (from the issue) are printed next to each figure. This machine has 2 cores and
is noisy: read medians and p95, compare ratios.
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import line, pct  # noqa: E402

from tests.bench.w1 import uss_mib  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    quick = args.quick

    import ray
    from thinkray.actors.namespace import AgentNamespace

    from tests.agents import ScriptAgent
    from tests.bench._ray import start_local_ray

    start_local_ray()
    root = tempfile.mkdtemp(prefix="thinkray-bench-")
    print(f"thinkray actor benchmarks (storage root {root})")

    # -- wake latency ---------------------------------------------------------------------
    ns = AgentNamespace(
        "bench",
        ScriptAgent,
        storage_root=root,
        pool_size=4,
        idle_timeout=None,
        agent_kwargs={"chunks": 5},
    )
    agent = ns.get("waker")
    for i in range(10):  # a 20-message session
        agent.chat.remote(f"message {i}").result()
    wake_ms = []
    for _ in range(15 if quick else 40):
        assert ns.hibernate("waker")
        while ns.stats()["free"] < 2:  # a warm pool, as in steady state
            time.sleep(0.01)
        t0 = time.perf_counter()
        stream = agent.stream_chat.remote("again")
        next(iter(stream))
        wake_ms.append((time.perf_counter() - t0) * 1000)
        for _chunk in stream:
            pass
    print("\nwake (hibernated -> first streamed chunk), warm pool")
    line(
        "p50 / p95",
        f"{statistics.median(wake_ms):.1f} / {pct(wake_ms, 0.95):.1f} ms",
        "<= 60 / <= 150 ms",
    )

    # -- file size --------------------------------------------------------------------------
    sizer = ns.get("sizer")
    for i in range(10):
        sizer.chat.remote(f"message number {i} with a little text").result()
    assert ns.hibernate("sizer")
    path = Path(root) / "bench" / "sizer.duckdb"
    size20 = path.stat().st_size
    for _ in range(50):
        sizer.get_history.remote().result()
        assert ns.hibernate("sizer")
    size_after = path.stat().st_size
    print("\nhibernated 20-message session file")
    line("size", f"{size20 / 1024:.0f} KiB", "<= 128 KiB")
    line(
        "after 50 wake cycles (ratio)",
        f"{size_after / 1024:.0f} KiB ({size_after / size20:.2f}x)",
        "<= 1.25x",
    )
    line("wal left after hibernate", str(Path(str(path) + ".wal").exists()), "False")

    # -- memory -----------------------------------------------------------------------------
    agent.chat.remote("warm").result()
    pid = ns.where("waker")["pid"]
    uss = uss_mib(pid)
    print("\nlive session actor memory")
    line("USS of the actor hosting a bound session", f"{uss:.0f} MiB", "<= 80 MiB")

    # -- relay throughput and latency ------------------------------------------------------
    ns_relay = AgentNamespace(
        "relay",
        ScriptAgent,
        storage_root=root,
        pool_size=2,
        idle_timeout=None,
        agent_kwargs={"chunks": 20000},
    )
    fast = ns_relay.get("fast")
    fast.chat.remote("warm up").result()
    t0 = time.perf_counter()
    stream = fast.stream_chat.remote("go")
    count = sum(1 for _ in stream)
    elapsed = time.perf_counter() - t0
    print("\nrelay (Ray streaming generator, batched)")
    line(
        "end-to-end throughput, 20,000-delta turn",
        f"{count / elapsed:,.0f} chunks/s",
        ">= 5,000 chunks/s",
    )
    line("Ray items for those chunks", f"{stream.batches:,} ({count / stream.batches:.0f}/item)")
    ns_relay.shutdown()

    ns_lat = AgentNamespace(
        "latency",
        ScriptAgent,
        storage_root=root,
        pool_size=2,
        idle_timeout=None,
        agent_kwargs={"chunks": 500, "delay": 0.004, "timestamps": True},
    )
    lat_agent = ns_lat.get("lat")
    lat_agent.chat.remote("warm up").result()
    lat = []
    for chunk in lat_agent.stream_chat.remote("go"):
        if chunk["type"] == "text-delta":
            lat.append((time.time() - float(chunk["delta"])) * 1000)
    line(
        "emit -> receive latency p50 / p95 (500 deltas, 4 ms apart)",
        f"{statistics.median(lat):.1f} / {pct(lat, 0.95):.1f} ms",
        "p95 <= 20 ms",
    )
    ns_lat.shutdown()

    # -- turn overhead ------------------------------------------------------------------------
    from thinkray.storage.session_store import DuckDBSessionStore

    async def in_process(n: int) -> list[float]:
        local = ScriptAgent(DuckDBSessionStore(Path(root) / "inproc.duckdb"), chunks=200)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            await local.chat("go")
            times.append((time.perf_counter() - t0) * 1000)
        local.close()
        return times

    n = 10 if quick else 30
    local_ms = asyncio.run(in_process(n))
    ns_turn = AgentNamespace(
        "turn",
        ScriptAgent,
        storage_root=root,
        pool_size=2,
        idle_timeout=None,
        agent_kwargs={"chunks": 200},
    )
    remote = ns_turn.get("t")
    remote.chat.remote("warm up").result()
    actor_ms = []
    for _ in range(n):
        t0 = time.perf_counter()
        for _chunk in remote.stream_chat.remote("go"):
            pass
        actor_ms.append((time.perf_counter() - t0) * 1000)
    ratio = statistics.median(actor_ms) / statistics.median(local_ms)
    print("\nturn overhead, 200-chunk scripted turn")
    line("in-process Think p50", f"{statistics.median(local_ms):.1f} ms")
    line("through the actor (stream to the driver) p50", f"{statistics.median(actor_ms):.1f} ms")
    line("ratio", f"{ratio:.2f}x", "<= 1.5x")
    ns_turn.shutdown()

    # -- wake storm ---------------------------------------------------------------------------
    storm = AgentNamespace(
        "storm",
        ScriptAgent,
        storage_root=root,
        pool_size=16,
        max_live=16,
        idle_timeout=None,
        agent_kwargs={"chunks": 3},
    )
    names = [f"s{i:03d}" for i in range(100)]
    handles = [storm.get(n) for n in names]

    async def touch_all(hs):
        return await asyncio.gather(*(h.chat.remote("hi") for h in hs))

    asyncio.run(touch_all(handles))  # create the 100 sessions
    storm.hibernate_all()
    while storm.stats()["free"] < 16:
        time.sleep(0.05)
    created_before = storm.stats()["counters"]["actors_created"]
    t0 = time.perf_counter()
    results = asyncio.run(touch_all([storm.get(n) for n in names]))
    storm_s = time.perf_counter() - t0
    stats = storm.stats()
    print("\nwake storm: 100 hibernated sessions woken at once (live cap 16, pool 16)")
    line("all 100 answered in", f"{storm_s:.2f} s", "<= 10 s")
    line("completed turns", f"{sum(r.status == 'completed' for r in results)} / 100")
    line(
        "actors created during the storm",
        str(stats["counters"]["actors_created"] - created_before),
        "(creating 100 actors takes ~43 s here)",
    )
    storm.shutdown()
    ns.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    raise SystemExit(main())
