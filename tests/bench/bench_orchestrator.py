"""Orchestrator benchmarks (issue 4). Prints figures measured in one run.

python tests/bench/bench_orchestrator.py
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import line, pct  # noqa: E402


def main() -> int:
    import ray
    from thinkray.actors.bridge import BridgeClient, bridge_name
    from thinkray.actors.namespace import AgentNamespace
    from thinkray.actors.orchestrator import Orchestrator

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
    )
    root = tempfile.mkdtemp(prefix="thinkray-bench-orch-")
    ns = AgentNamespace("bo", Orchestrator, storage_root=root, pool_size=1, idle_timeout=None)
    boss = ns.get("boss")
    print("thinkray orchestrator benchmarks")

    # -- bridge round trip ------------------------------------------------------------
    boss.create_subagent.remote(
        "probe", {"model": {"provider": "script", "steps": [[{"text": "ok"}]]}}
    ).result()
    actor = ray.get_actor(bridge_name("bo", "boss"), namespace="thinkray")
    token = ray.get(actor.grant.remote("bench", "read-write"))
    client = BridgeClient(bridge_name("bo", "boss"), token, "read-write")
    ray.get(client.write_file("bench/a.txt", "hello world\n" * 20))
    reads, writes = [], []
    for i in range(300):
        t0 = time.perf_counter()
        ray.get(client.read_file("bench/a.txt"))
        reads.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        ray.get(client.write_file(f"bench/w{i % 10}.txt", "x"))
        writes.append((time.perf_counter() - t0) * 1000)
    print("\nbridge workspace call round trip (from another process, 300 calls)")
    line(
        "read_file p50 / p95",
        f"{statistics.median(reads):.2f} / {pct(reads, 0.95):.2f} ms",
        "p50 <= 5 ms",
    )
    line(
        "write_file p50 / p95",
        f"{statistics.median(writes):.2f} / {pct(writes, 0.95):.2f} ms",
        "p50 <= 5 ms",
    )

    # -- fan-out ----------------------------------------------------------------------
    words = " ".join(f"w{i}" for i in range(400))
    spec = {"provider": "script", "steps": [[{"text": words}]], "delay": 0.0}
    names = [f"sub{i}" for i in range(8)]
    for name in names:
        boss.create_subagent.remote(name, {"model": spec}).result()
    for name in names:  # warm: each sub-agent bound once
        boss.delegate.remote(name, "warm up", wait=True).result()
    t0 = time.perf_counter()
    tasks = [boss.delegate.remote(n, "go", wait=False).result() for n in names]
    all_started = time.perf_counter() - t0
    counts: dict[str, int] = {}
    rates: list[float] = []

    def view(task_id: str) -> None:
        started = time.perf_counter()
        n = sum(1 for _ in boss.view_task.remote(task_id))
        counts[task_id] = n
        rates.append(n / (time.perf_counter() - started))

    threads = [threading.Thread(target=view, args=(t.task_id,)) for t in tasks]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    all_done = time.perf_counter() - t0
    statuses = [boss.task_status.remote(t.task_id).result().status for t in tasks]
    print("\nfan-out: 8 sub-agents, one 400-delta scripted turn each, 8 live viewers")
    line("all started (8 fire-and-forget delegations)", f"{all_started * 1000:.0f} ms")
    line("all done (every viewer saw its finish)", f"{all_done * 1000:.0f} ms")
    line("completed", f"{statuses.count('completed')} / 8")
    line("relay per viewer: median chunks/s", f"{statistics.median(rates):,.0f}")
    line("chunks per task", f"{statistics.median(counts.values()):.0f}")
    with contextlib.suppress(Exception):
        AgentNamespace.connect("bo.boss.subs").shutdown()
    ns.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
