"""Scale on one disk (issue 13, item 6): a fleet of hibernated agents and its index.

Creates ``--agents`` (100,000) hibernated agents with small histories, generated
directly through the store: one template file written by ``DuckDBSessionStore`` (a
session, a few messages, usage) copied to every name, and their index rows loaded in
bulk into the snapshot. Prints bytes per agent, ``thinkray sessions ls --json`` and
``thinkray stats --json`` times (in process, output discarded), the index size, and
the wake of random agents among them through a local Ray (``num_cpus=2``), p50/p95.

The same commands, timed the same way, as the figures before the columnar snapshot
(msgpack snapshot, rows merged and aggregated in Python, ``json.dump``): at 100,000
agents on the 2-core CI machine ``sessions ls --json`` took 2.3-11.0 s, ``stats --json``
0.7-4.7 s, the index 24.1 MB. Also printed: ``sessions ls`` as a table, a sorted
``--limit 20`` listing, and how long reading the former msgpack snapshot alone takes
(``--no-legacy`` skips it).

    python tests/bench/bench_fleet.py                # 100,000 agents
    python tests/bench/bench_fleet.py --agents 2000 --wakes 10
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

NAMESPACE = "fleet"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _template(folder: Path, messages: int) -> Path:
    from thinkray.storage.session_store import DuckDBSessionStore

    path = folder / "template.duckdb"
    with DuckDBSessionStore(path) as store:
        sid = store.create_session("chat").id
        store.set_config("think.current_session", sid)  # what a Think agent reads first
        store.update_session(sid, model={"provider_id": "anthropic", "model_id": "claude-x"})
        for i in range(messages):
            role = "user" if i % 2 == 0 else "assistant"
            text = f"message {i}: " + "lorem ipsum " * 8
            store.append_message(
                sid,
                {
                    "id": f"m{i}",
                    "role": role,
                    "metadata": {},
                    "parts": [{"type": "text", "text": text}],
                },
            )
        store.add_usage(sid, {"input": 1200, "output": 300, "cache_read": 800})
    return path


def _timed_cli(argv: list[str]) -> float:
    from thinkray.actors.cli import main

    sink = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    elapsed = time.perf_counter() - started
    assert code == 0, argv
    return elapsed


def _wakes(root: Path, names: list[str], count: int) -> list[float]:
    import ray
    from thinkray.actors.demo import DemoAgent
    from thinkray.actors.namespace import AgentNamespace

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ns = AgentNamespace(
        NAMESPACE, DemoAgent, storage_root=str(root), pool_size=2, idle_timeout=None
    )
    rng = random.Random(13)
    out = []
    try:
        for name in rng.sample(names, min(count, len(names))):
            agent = ns.get(name)
            started = time.perf_counter()
            history = agent.get_history.remote().result()
            out.append(time.perf_counter() - started)
            assert len(history) > 0
            ns.hibernate(name)
    finally:
        ns.shutdown()
    return out


def _legacy_read(index: object, agents: int) -> float:
    """Seconds to read the snapshot in its former format (msgpack, decoded to dicts)."""
    from thinkray.storage.codec import pack, unpack

    rows = list(index.rows().values())  # type: ignore[attr-defined]
    data = pack({"v": 1, "rows": rows})
    del rows
    started = time.perf_counter()
    assert len(unpack(data)["rows"]) == agents
    return time.perf_counter() - started


def run(
    agents: int, wakes: int, messages: int, root: Path | None, keep: bool, legacy: bool = True
) -> dict[str, float]:
    """Build the fleet, measure, print; returns the figures."""
    from thinkray.storage import fleet_index as fi

    scratch = Path(tempfile.mkdtemp(prefix="thinkray-fleet-", dir=root))
    figures: dict[str, float] = {}
    try:
        folder = scratch / NAMESPACE
        folder.mkdir(parents=True)
        started = time.perf_counter()
        template = _template(scratch, messages)
        names = [f"agent-{i:06d}" for i in range(agents)]

        def copy(chunk: list[str]) -> None:
            for name in chunk:
                shutil.copyfile(template, folder / f"{name}.duckdb")

        chunks = [names[i : i + 1000] for i in range(0, len(names), 1000)]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(copy, chunks))
        copied = time.perf_counter() - started
        # One real row from a copy, then every agent's row in bulk.
        row = fi.scan_file(folder / f"{names[0]}.duckdb")
        now = time.time()
        rows = []
        for i, name in enumerate(names):
            r = dict(row, name=name)
            r["last_active"] = now - (i % 90) * 86400  # a spread of idle times
            rows.append(r)
        index = fi.FleetIndex(scratch, NAMESPACE)
        index.put_snapshot(rows)
        del rows
        built = time.perf_counter() - started
        size = template.stat().st_size
        blocks = (folder / f"{names[0]}.duckdb").stat().st_blocks * 512
        index_bytes = index.size_bytes()
        _timed_cli(["sessions", "ls", "--root", str(scratch), "--limit", "1"])  # imports
        ls_s = _timed_cli(["sessions", "ls", "--root", str(scratch), "--json"])
        stats_s = _timed_cli(["stats", "--root", str(scratch), "--json"])
        ls_table_s = _timed_cli(["sessions", "ls", "--root", str(scratch)])
        stats_table_s = _timed_cli(["stats", "--root", str(scratch)])
        ls_top_s = _timed_cli(
            ["sessions", "ls", "--root", str(scratch), "--sort", "bytes", "--limit", "20"]
        )
        legacy_s = _legacy_read(index, agents) if legacy else None
        # A few agents re-indexed since the compaction: the usual state.
        for name in names[:50]:
            index.put(dict(row, name=name, written_at=time.time()))
        ls_mixed_s = _timed_cli(
            ["sessions", "ls", "--root", str(scratch), "--json", "--no-compact"]
        )
        wake = _wakes(scratch, names, wakes) if wakes else []
        figures = {
            "agents": agents,
            "build_s": built,
            "copy_s": copied,
            "bytes_per_agent": size,
            "disk_bytes_per_agent": blocks,
            "index_bytes": index_bytes,
            "index_bytes_per_agent": index_bytes / agents,
            "ls_s": ls_s,
            "ls_with_50_rows_s": ls_mixed_s,
            "ls_table_s": ls_table_s,
            "ls_top20_s": ls_top_s,
            "stats_s": stats_s,
            "stats_table_s": stats_table_s,
        }
        if legacy_s is not None:
            figures["legacy_snapshot_read_s"] = legacy_s
        if wake:
            figures["wake_p50_ms"] = _pct(wake, 0.5) * 1000
            figures["wake_p95_ms"] = _pct(wake, 0.95) * 1000
        print(f"fleet benchmark: {agents:,} hibernated agents ({messages} messages each)")
        print(f"  built in                     {built:8.1f} s (copies {copied:.1f} s)")
        print(f"  bytes per agent (file)       {size:8,d} B ({blocks:,d} B on disk)")
        print(
            f"  index size                   {index_bytes:8,d} B ({index_bytes / agents:.0f} B/agent)"
        )
        print(f"  sessions ls --json           {ls_s * 1000:8.0f} ms")
        print(f"  ... with 50 fresh row files  {ls_mixed_s * 1000:8.0f} ms")
        print(f"  stats --json                 {stats_s * 1000:8.0f} ms")
        print(f"  sessions ls (table)          {ls_table_s * 1000:8.0f} ms")
        print(f"  ls --sort bytes --limit 20   {ls_top_s * 1000:8.0f} ms")
        print(f"  stats (tables)               {stats_table_s * 1000:8.0f} ms")
        if legacy_s is not None:
            print(f"  former msgpack snapshot read {legacy_s * 1000:8.0f} ms (decode alone)")
        if wake:
            print(
                f"  wake of a random agent       p50 {figures['wake_p50_ms']:.0f} ms, "
                f"p95 {figures['wake_p95_ms']:.0f} ms ({len(wake)} wakes)"
            )
        sys.stdout.flush()
        return figures
    finally:
        if keep:
            print(f"kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=100_000)
    parser.add_argument("--wakes", type=int, default=20, help="random wakes timed (0: none)")
    parser.add_argument("--messages", type=int, default=6, help="messages per agent")
    parser.add_argument("--root", type=Path, help="where to build it (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="leave the fleet on disk")
    parser.add_argument(
        "--no-legacy", action="store_true", help="skip timing the former snapshot's read"
    )
    args = parser.parse_args(argv)
    run(args.agents, args.wakes, args.messages, args.root, args.keep, not args.no_legacy)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    raise SystemExit(main())
