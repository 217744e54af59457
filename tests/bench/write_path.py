"""Issue 23's figures (the turn's write path), side by side with LangGraph + its SQLite
checkpointer in one run:

- W1 in process: turns/s and CPU per turn, thinkray (this process) against LangGraph's
  sync API (a child process, :func:`tests.bench.w1._run_peer`), alternating rounds;
- DuckDB commits (and statements) per turn without tools and per inline tool call,
  counted through :meth:`thinkray.storage.db.Database.counting`;
- per-turn durability on an ``s3://`` root (moto's S3 server on loopback): the time the
  turn's ``make_durable`` (ship the turn's WAL to the store, before its ``finish``)
  adds to each turn, p50 / p95;
- storage after 5 turns of one session, live (file, WAL and journal) and after close;
- a realistic 10,000-message history: the first ``get_history`` after a wake (open +
  read), and clone / branch of it.

    python tests/bench/bench_w1.py --write-path [--rounds N] [--turns N] [--no-peer]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for tests.bench
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _report

import numpy  # noqa: E402,F401  (loaded in every Ray worker; the store uses it when present)
from _report import conversation, pct  # noqa: E402
from thinkray.runtime.agents.context import AgentContext  # noqa: E402
from thinkray.storage.session_store import DuckDBSessionStore  # noqa: E402

from tests.bench.w1 import _peer_available, _run_peer  # noqa: E402
from tests.bench.workloads import (  # noqa: E402
    WorkloadAgent,
    in_process_w1,
    is_tool_turn,
)


def _ratio(ours: float | None, peer: float | None) -> str:
    if not ours or not peer:
        return "-"
    return f"{ours / peer:.2f}x"


def _row(name: str, ours: str, peer: str, ratio: str, target: str) -> None:
    print(f"  {name:<44} {ours:>16} {peer:>16} {ratio:>8}   {target}")


# -- W1 in process ------------------------------------------------------------------------


def w1_rounds(root: Path, sessions: int, turns: int, rounds: int, peer: bool) -> dict[str, Any]:
    """Alternating rounds of thinkray then LangGraph on the same W1 load."""
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    for r in range(rounds):
        figures = asyncio.run(in_process_w1(root / f"w1-{r}", sessions, turns))
        ours.append((figures.turns_per_s, figures.cpu_per_turn))
        if peer:
            base = root / f"lg-{r}"
            base.mkdir(parents=True, exist_ok=True)
            (run,), _ = _run_peer(base, [{"phase": "sync", "sessions": sessions, "turns": turns}])
            theirs.append((run.figures.turns_per_s, run.figures.cpu_per_turn))
    return {"ours": ours, "peer": theirs}


# -- commits per turn -----------------------------------------------------------------------


def commits_per_turn(root: Path, turns: int) -> dict[str, float]:
    """W1 on one agent, each turn counted: commits and statements of the turns without
    tools, and of the tool turns minus that (per inline call: W1 makes one per tool
    turn)."""

    async def run() -> dict[str, float]:
        agent = WorkloadAgent(root / "commits.duckdb")
        plain: list[tuple[int, int]] = []
        tool: list[tuple[int, int]] = []
        try:
            for turn in range(1, turns + 1):
                with agent.store.counting() as count:  # type: ignore[attr-defined]
                    result = await agent.chat(f"turn {turn}")
                assert result.status == "completed", result.error
                if turn == 1:
                    continue  # the session and the tables are made once
                (tool if is_tool_turn(turn) else plain).append((count.commits, count.statements))
        finally:
            agent.close()
        c0 = statistics.mean(c for c, _ in plain)
        s0 = statistics.mean(s for _, s in plain)
        c1 = statistics.mean(c for c, _ in tool) if tool else c0
        s1 = statistics.mean(s for _, s in tool) if tool else s0
        return {
            "commits": c0,
            "statements": s0,
            "tool_commits": c1 - c0,
            "tool_statements": s1 - s0,
        }

    return asyncio.run(run())


# -- durability on s3:// ----------------------------------------------------------------------


def s3_durability(root: Path, turns: int) -> list[float] | str:
    """Seconds each turn's ``make_durable`` took on an s3:// root (moto on loopback)."""
    try:
        import boto3  # type: ignore[import-untyped]
        from moto.server import ThreadedMotoServer
        from thinkray.storage.objectstore import RemoteSession
    except ImportError as exc:
        return f"skipped ({exc.name} not installed)"
    import os

    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        remote = RemoteSession(
            f"s3://bench/w1?endpoint_override={endpoint}", "bench", "s1", cache_dir=root / "cache"
        )
        remote.acquire()
        remote.fetch()
        return asyncio.run(_shipped_turns(remote, turns))
    finally:
        server.stop()


async def _shipped_turns(remote: Any, turns: int) -> list[float]:
    store = DuckDBSessionStore(remote.local_path, journal=False)  # as the actor does
    took: list[float] = []

    async def make_durable() -> None:
        # What the session actor's _ship does: on this thread, between writes, take the
        # WAL since the last entry (or checkpoint and snapshot); upload off the loop.
        started = time.perf_counter()
        upload = remote.prepare_ship(store.checkpoint)
        if upload is not None:
            await asyncio.to_thread(upload)
        took.append(time.perf_counter() - started)

    agent = WorkloadAgent(store)
    agent.context = AgentContext(make_durable=make_durable)
    try:
        for turn in range(1, turns + 1):
            result = await agent.chat(f"turn {turn}")
            assert result.status == "completed", result.error
    finally:
        agent.close()
    return took[1:]  # the first is the session's first generation (the whole file)


# -- storage after 5 turns -------------------------------------------------------------------


def storage_after(root: Path, turns: int, peer: bool) -> dict[str, Any]:
    ours = asyncio.run(in_process_w1(root / "size", 1, turns, sizes_at=(turns,)))
    out: dict[str, Any] = {"live": ours.sizes.get(turns), "closed": ours.closed_bytes}
    if peer:
        base = root / "lg-size"
        base.mkdir(parents=True, exist_ok=True)
        (run,), _ = _run_peer(
            base, [{"phase": "sync", "sessions": 1, "turns": turns, "sizes_at": [turns]}]
        )
        out["peer_live"] = run.figures.sizes.get(turns)
        out["peer_closed"] = run.closed_bytes
    return out


# -- a long history -----------------------------------------------------------------------------


def long_history(root: Path, runs: int) -> dict[str, list[float]]:
    """A realistic 10,000-message session: the first get_history after each open (a
    wake: the open and migrate check counted apart), then clone and branch."""
    path = root / "history.duckdb"
    store = DuckDBSessionStore(path)
    thread = store.thread("main")
    messages = conversation(10_000)
    store.append_messages(thread.id, messages)
    store.close()
    opens: list[float] = []
    reads: list[float] = []
    history: list[Any] = []
    for _ in range(runs):
        started = time.perf_counter()
        store = DuckDBSessionStore(path)
        opened = time.perf_counter()
        read = store.get_history(thread.id)
        reads.append(time.perf_counter() - opened)
        opens.append(opened - started)
        # The previous read is freed here, outside the timing (~7 ms for 10,000
        # messages: it was counted in the read until now). It stays alive during the
        # read, so the read builds in memory not yet touched, as in a growing process.
        history = read
        assert len(history) == len(messages)
        store.close()
    store = DuckDBSessionStore(path)
    clones: list[float] = []
    branches: list[float] = []
    fork = messages[len(messages) // 2 + 1]["id"]
    checkpoints: list[float] = []
    for i in range(runs):
        # Each copy writes ~5-10 MB of WAL, and DuckDB checkpoints by itself inside
        # the commit that crosses 16 MB (every other copy here): measured apart, as
        # the stall it is, so that the copies' own cost is not hidden in it.
        started = time.perf_counter()
        store.clone_thread("main", f"copy{i}")
        clones.append(time.perf_counter() - started)
        store.checkpoint()
        started = time.perf_counter()
        store.branch_session(thread.id, fork)
        branches.append(time.perf_counter() - started)
        started = time.perf_counter()
        store.checkpoint()
        checkpoints.append(time.perf_counter() - started)
    store.close()
    return {
        "opens": opens,
        "reads": reads,
        "clones": clones,
        "branches": branches,
        "checkpoints": checkpoints,
    }


def profile_history(root: Path) -> str:
    """cProfile of one first read after a wake (the top of the list by own time)."""
    path = root / "history.duckdb"
    store = DuckDBSessionStore(path)
    sid = store.get_thread("main").id
    profiler = cProfile.Profile()
    profiler.enable()
    store.get_history(sid)
    profiler.disable()
    store.close()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(8)
    return out.getvalue()


def profile_turns(root: Path, turns: int) -> str:
    """cProfile of W1 turns in process (the top of the list by cumulative time)."""
    profiler = cProfile.Profile()
    profiler.enable()
    asyncio.run(in_process_w1(root / "profile", 1, turns))
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
    return out.getvalue()


# -- the report -------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:.0f} KiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--profile", action="store_true", help="print cProfile tops too")
    args = parser.parse_args(argv)
    peer = not args.no_peer and _peer_available() is None
    with tempfile.TemporaryDirectory(prefix="bench-write-path-") as tmp:
        root = Path(tmp)
        w1 = w1_rounds(root, args.sessions, args.turns, args.rounds, peer)
        commits = commits_per_turn(root, 11)
        shipped = s3_durability(root, 21)
        size = storage_after(root, 5, peer)
        history = long_history(root, 10)
        profiles = (profile_turns(root, 10), profile_history(root)) if args.profile else None

    print(
        f"bench_w1 --write-path (issue 23): W1 {args.sessions} sessions x {args.turns} turns, "
        f"{args.rounds} alternating rounds, medians; LangGraph: sync API + SqliteSaver"
    )
    print(f"  {'figure':<44} {'thinkray':>16} {'LangGraph':>16} {'ratio':>8}   target")
    tps = statistics.median(t for t, _ in w1["ours"])
    cpu = statistics.median(c for _, c in w1["ours"])
    ptps = statistics.median(t for t, _ in w1["peer"]) if w1["peer"] else None
    pcpu = statistics.median(c for _, c in w1["peer"]) if w1["peer"] else None
    _row("W1 in process, turns/s", f"{tps:.1f}", f"{ptps:.1f}" if ptps else "-", _ratio(tps, ptps), ">= 1.5x")  # fmt: skip
    _row("CPU per turn, in process", _ms(cpu), _ms(pcpu) if pcpu else "-", _ratio(cpu, pcpu), "<= 0.6x")  # fmt: skip
    _row("DuckDB commits per turn, no tools", f"{commits['commits']:.1f}", "-", "", "<= 3")
    _row("  more per inline tool call (W1: 1 per tool turn)", f"+{commits['tool_commits']:.1f}", "-", "", "+0 (the step's one write)")  # fmt: skip
    _row("DuckDB statements per turn, no tools / + tool", f"{commits['statements']:.0f} / +{commits['tool_statements']:.0f}", "-", "", "-")  # fmt: skip
    if isinstance(shipped, str):
        _row("durability on s3:// (moto), added p50 / p95", shipped, "-", "", "p95 <= 20 ms")
    else:
        _row("durability on s3:// (moto), added p50 / p95", f"{_ms(statistics.median(shipped))} / {_ms(pct(shipped, 0.95))}", "no durability", "", "p95 <= 20 ms")  # fmt: skip
    _row("storage after 5 turns, live (file+WAL+journal)", _kib(size["live"]), _kib(size.get("peer_live")), _ratio(size["live"], size.get("peer_live")), "<= LangGraph")  # fmt: skip
    _row("  after close (checkpointed)", _kib(size["closed"]), _kib(size.get("peer_closed")), _ratio(size["closed"], size.get("peer_closed")), "<= LangGraph")  # fmt: skip
    reads, opens = history["reads"], history["opens"]
    _row("10k realistic history, first read after wake", f"{_ms(statistics.median(reads))}", "-", "", "<= 30 ms")  # fmt: skip
    _row("  the open itself (not in the read)", _ms(statistics.median(opens)), "-", "", "-")
    _row("  p95 of the first read", _ms(pct(reads, 0.95)), "-", "", "-")
    _row("clone / branch of it", f"{_ms(statistics.median(history['clones']))} / {_ms(statistics.median(history['branches']))}", "-", "", "<= 50 ms")  # fmt: skip
    _row("  checkpoint of a branch's WAL (DuckDB: every 16 MB)", _ms(statistics.median(history["checkpoints"])), "-", "", "-")  # fmt: skip
    if not peer:
        print(f"  LangGraph peer skipped: {_peer_available() or '--no-peer'}")
    if profiles:
        print("\ncProfile, 10 W1 turns in process (own time):\n" + profiles[0])
        print("cProfile, the first read of the 10k history after a wake:\n" + profiles[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
