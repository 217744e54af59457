"""Storage benchmark: the session store's hot paths, measured in one run.

    python tests/bench/bench_storage.py

Prints each figure next to its target (DESIGN.md, "Measured on this machine"):

- stream flush: a recorder folding 10,000 text/reasoning deltas arriving at a fast
  10,000 chunks/s, flushing when its oldest pending chunk is 30 ms old (or 1,000 chunks
  are pending). Amortized cost per chunk = time inside ``flush_stream`` / chunks.
  Durability latency = commit of the flush holding a chunk - the chunk's arrival
  time (its scheduled time, so a flush that stalls the producer counts against it).
- history of a 10,000-message branch, after a reopen (numpy is loaded, as in every Ray
  worker; the fetchall path used without numpy is shown too), for realistic messages
  and for the light shape DESIGN.md's figure was measured with, next to the cost of
  just msgpack-decoding the same messages (the part of the time no store can remove).
- file sizes: empty store, 20-message session after close, and after 50 open/close
  cycles that write nothing.
- wake: open (with the migrate check) + get_session + get_history of that session.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy  # noqa: E402,F401  (loaded in every Ray worker; the store uses it when present)
from thinkray.storage.session_store import DuckDBSessionStore  # noqa: E402
from thinkray.storage.types import ChunkWrite, PartWrite, StreamFlush  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RNG, WORDS, conversation, kib, light, line, ms, pct  # noqa: E402

# -- stream flush --------------------------------------------------------------------


def bench_flush(tmp: Path) -> None:
    n_chunks, rate, interval, max_batch = 10_000, 10_000.0, 0.030, 1000
    store = DuckDBSessionStore(tmp / "flush.duckdb")
    sid = store.create_session("stream").id
    store.append_message(sid, {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "go"}]})  # fmt: skip
    mid, run = "a1", "run-1"
    parts: list[dict[str, Any]] = [
        {"type": "step-start"},
        {"type": "reasoning", "text": "", "state": "streaming"},
        {"type": "text", "text": "", "state": "streaming"},
    ]
    reasoning_until = 2000
    deltas = [RNG.choice(WORDS) + " " for _ in range(n_chunks)]

    pending: list[tuple[ChunkWrite, float]] = []
    dirty: set[int] = set()
    inserted = False
    flush_seconds: list[float] = []
    batch_sizes: list[int] = []
    latencies: list[float] = []

    def flush() -> None:
        nonlocal inserted
        envelope = None
        if not inserted:
            envelope = {"id": mid, "role": "assistant", "metadata": {"runId": run}, "parts": []}
        writes = [PartWrite(mid, idx, parts[idx]) for idx in sorted(dirty)]
        started = time.perf_counter()
        store.flush_stream(
            StreamFlush(
                sid,
                message=envelope,
                parent_id="u1",
                use_head=False,
                parts=writes,
                chunks=[c for c, _ in pending],
            )
        )
        done = time.perf_counter()
        flush_seconds.append(done - started)
        batch_sizes.append(len(pending))
        latencies.extend(done - due for _, due in pending)
        inserted = True
        dirty.clear()
        pending.clear()

    t0 = time.perf_counter() + 0.01
    for i in range(n_chunks):
        due = t0 + i / rate
        while (wait := due - time.perf_counter()) > 0:
            if wait > 0.0005:
                time.sleep(wait / 2)
        if i == 0:
            chunk: dict[str, Any] = {"type": "start", "messageId": mid}
        elif i == 1:
            chunk = {"type": "start-step"}
            dirty.add(0)
        elif i < reasoning_until:
            chunk = {"type": "reasoning-delta", "id": "r1", "delta": deltas[i]}
            parts[1]["text"] += deltas[i]
            dirty.add(1)
        elif i == reasoning_until:
            chunk = {"type": "reasoning-end", "id": "r1"}
            parts[1]["state"] = "done"
            dirty.add(1)
        elif i < n_chunks - 1:
            chunk = {"type": "text-delta", "id": "t1", "delta": deltas[i]}
            parts[2]["text"] += deltas[i]
            dirty.add(2)
        else:
            chunk = {"type": "finish", "finishReason": "stop"}
            parts[2]["state"] = "done"
            dirty.add(2)
        pending.append((ChunkWrite(run, i, chunk, i == n_chunks - 1), due))
        if time.perf_counter() - pending[0][1] >= interval or len(pending) >= max_batch:
            flush()
    if pending:
        flush()
    elapsed = time.perf_counter() - t0

    message = store.get_message(mid)
    assert message is not None and message["parts"] == parts
    assert len(store.get_chunks(run)) == n_chunks
    store.close()

    per_chunk = sum(flush_seconds) / n_chunks
    print(f"stream flush ({n_chunks:,} chunks at {rate:,.0f}/s, 30 ms flush interval)")
    line(
        "flushes / chunks per flush (median)",
        f"{len(flush_seconds)} / {statistics.median(batch_sizes):.0f}",
        "-",
    )
    line("flush_stream p50 / p95", f"{ms(pct(flush_seconds, 0.5))} / {ms(pct(flush_seconds, 0.95))}", "-")  # fmt: skip
    line("amortized storage cost per chunk", f"{per_chunk * 1000:.4f} ms", "<= 0.1 ms", per_chunk <= 0.0001)  # fmt: skip
    line("storage share of the stream's wall time", f"{sum(flush_seconds) / elapsed:.1%}", "-")
    p50, p95 = pct(latencies, 0.5), pct(latencies, 0.95)
    line("durability latency p50 / p95", f"{ms(p50)} / {ms(p95)}", "p95 <= 50 ms", p95 <= 0.050)
    line("durability latency max", ms(max(latencies)), "-")


# -- history -------------------------------------------------------------------------


def time_history(path: Path, sid: str, runs: int) -> tuple[list[float], list[float]]:
    """get_history of the session's head: (each run the first call after opening the
    file, as on a wake; later calls on the same store, served from what it keeps in
    memory)."""
    cold: list[float] = []
    for _ in range(runs):
        store = DuckDBSessionStore(path)
        started = time.perf_counter()
        history = store.get_history(sid)
        cold.append(time.perf_counter() - started)
        del history
        store.close()
    store = DuckDBSessionStore(path)
    store.get_history(sid)
    cached: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        history = store.get_history(sid)
        cached.append(time.perf_counter() - started)
        del history
    store.close()
    return cold, cached


def bench_history(tmp: Path) -> None:
    import msgpack

    print("history of a 10,000-message branch (numpy loaded, as in a Ray worker)")
    for label, messages in (
        ("realistic: 17,000 parts, 3 MB", conversation(10_000)),
        ("light: 1 short text part each", light(10_000)),
    ):
        path = tmp / f"history-{label[:5]}.duckdb"
        store = DuckDBSessionStore(path)
        sid = store.create_session("long").id
        started = time.perf_counter()
        store.append_messages(sid, messages)
        imported = time.perf_counter() - started
        assert store.get_history(sid) == messages
        store.close()

        runs, cached = time_history(path, sid, 20)
        median, p95 = statistics.median(runs), pct(runs, 0.95)
        # What no store can beat: decoding the same messages from one msgpack buffer.
        packed = msgpack.packb(messages)
        floor: list[float] = []
        for _ in range(10):
            gc.disable()  # as get_history does while it builds
            started = time.perf_counter()
            decoded = msgpack.unpackb(packed)
            floor.append(time.perf_counter() - started)
            gc.enable()
            del decoded
        saved = sys.modules.pop("numpy")
        try:
            no_numpy, _ = time_history(path, sid, 10)
        finally:
            sys.modules["numpy"] = saved

        print(f"  [{label}]")
        line("get_history from the file, median / p95 (20 opens)", f"{ms(median)} / {ms(p95)}", "<= 30 ms", median <= 0.030)  # fmt: skip
        line("  again on the same store (kept in memory), median", ms(statistics.median(cached)), "-")  # fmt: skip
        line("  msgpack decode floor (same messages)", ms(statistics.median(floor)), "-")
        line("  without numpy (fetchall path), median", ms(statistics.median(no_numpy)), "-")
        line("  bulk import (append_messages)", ms(imported), "-")


# -- files and wake --------------------------------------------------------------------


def build_session(path: Path, turns: int = 10) -> str:
    """A realistic hibernated session: turns through the real write paths, usage,
    config, and the chunk logs the runtime keeps (the last two runs)."""
    store = DuckDBSessionStore(path)
    store.set_config("think.current_session", "chat")
    sid = store.create_session("chat", session_id="chat", model={"id": "claude"}).id
    source = conversation(turns * 2, prefix="t")
    for turn in range(turns):
        user, reply = source[2 * turn], source[2 * turn + 1]
        store.append_message(sid, user)
        run = f"run-{turn}"
        pieces = reply["parts"][-1]["text"].split(" ")
        chunks = [ChunkWrite(run, 0, {"type": "start", "messageId": reply["id"]})]
        chunks += [
            ChunkWrite(run, i + 1, {"type": "text-delta", "id": "t", "delta": p + " "})
            for i, p in enumerate(pieces)
        ]
        half = len(chunks) // 2
        envelope = {k: v for k, v in reply.items() if k != "parts"}
        store.flush_stream(
            StreamFlush(
                sid,
                message=envelope,
                parent_id=user["id"],
                use_head=False,
                parts=[PartWrite(reply["id"], i, p) for i, p in enumerate(reply["parts"])],
                chunks=chunks[:half],
            )
        )
        store.flush_stream(
            StreamFlush(
                sid,
                parts=[PartWrite(reply["id"], len(reply["parts"]) - 1, reply["parts"][-1])],
                chunks=chunks[half:],
            )
        )
        store.add_usage(sid, {"input": 1200, "output": 80, "cache_read": 900})
        generations = store.chunk_generations()
        if len(generations) > 2:
            store.delete_chunks(generations[:-2])
    assert store.get_history(sid) == source
    store.close()
    return sid


def bench_files(tmp: Path) -> None:
    empty = tmp / "empty.duckdb"
    DuckDBSessionStore(empty).close()
    empty_size = os.path.getsize(empty)
    one = tmp / "one-session.duckdb"
    store = DuckDBSessionStore(one)
    store.create_session("empty")
    store.close()
    one_size = os.path.getsize(one)

    path = tmp / "session.duckdb"
    sid = build_session(path)
    size = os.path.getsize(path)
    wakes: list[float] = []
    opens: list[float] = []
    closes: list[float] = []
    for _ in range(50):
        started = time.perf_counter()
        store = DuckDBSessionStore(path)
        opened = time.perf_counter()
        store.get_session(sid)
        history = store.get_history(sid)
        woke = time.perf_counter()
        store.close()
        closes.append(time.perf_counter() - woke)
        opens.append(opened - started)
        wakes.append(woke - started)
        assert len(history) == 20
    after = os.path.getsize(path)
    wal = os.path.exists(f"{path}.wal")

    print("files (16 KiB blocks)")
    line("empty store after close", kib(empty_size), "<= 64 KiB", empty_size <= 64 * 1024)
    line("one empty session after close", kib(one_size), "<= 64 KiB", one_size <= 64 * 1024)
    line("20-message session after close", kib(size), "<= 128 KiB", size <= 128 * 1024)
    ratio = after / size
    line(
        "after 50 no-write open/close cycles",
        f"{kib(after)} (x{ratio:.2f}){' + WAL' if wal else ''}",
        "<= x1.25",
        ratio <= 1.25 and not wal,
    )
    print("wake (open + migrate check + get_session + get_history, 20 messages)")
    median, p95 = statistics.median(wakes), pct(wakes, 0.95)
    line("wake median / p95 (50 runs)", f"{ms(median)} / {ms(p95)}", "~30 ms", median <= 0.030)
    line("  of which open + migrate check, median", ms(statistics.median(opens)), "-")
    line("hibernate (close, no writes) median", ms(statistics.median(closes)), "-")


def main() -> None:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="thinkray-bench-") as name:
        tmp = Path(name)
        bench_flush(tmp)
        bench_history(tmp)
        bench_files(tmp)
    print(f"(bench took {time.perf_counter() - started:.1f} s; load average {os.getloadavg()[0]:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
