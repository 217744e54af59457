"""Session lifecycle benchmark: branch, clone and rewind on long histories, in one run.

    python tests/bench/bench_lifecycle.py

Prints each figure next to its target (issue 5, "Performance"):

- branch (``branch_session``) and clone (``clone_thread``) of a 10,000-message
  history: median / p95 over repeated runs. Each copy is deleted and the database
  checkpointed (untimed) before the next run, so every run copies into a store of the
  same size with an empty WAL. Then 8 branches that are kept: their mean includes the
  DuckDB checkpoints their commits trigger (``checkpoint_threshold`` is 4 MB).
- history read after 10 rewinds of a 10,000-message session: each rewind goes back
  a few turns and a new turn is appended after it (so the tree holds 10 hidden
  branches), then ``get_history`` of the head after a reopen, median / p95.

Two shapes of message, as in ``bench_storage.py``: "realistic" (tool calls, usage
metadata, ~3 MB of parts) and "light" (one short text part each).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy  # noqa: E402,F401  (loaded in every Ray worker; the store uses it when present)
from thinkray.storage.session_store import DuckDBSessionStore  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import conversation, light, line, ms, pct  # noqa: E402

N = 10_000
RUNS = 15


def timed(fn: Callable[[], Any], undo: Callable[[Any], None], runs: int) -> list[float]:
    out: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        out.append(time.perf_counter() - started)
        undo(result)
    return out


def report(name: str, runs: list[float], target_ms: float) -> None:
    median, p95 = statistics.median(runs), pct(runs, 0.95)
    line(
        f"{name} median / p95 ({len(runs)} runs)",
        f"{ms(median)} / {ms(p95)}",
        f"<= {target_ms:.0f} ms",
        median <= target_ms / 1000,
    )


def bench_copy(tmp: Path, label: str, messages: list[dict[str, Any]]) -> None:
    path = tmp / f"copy-{label}.duckdb"
    store = DuckDBSessionStore(path)
    src = store.thread("source")
    store.append_messages(src.id, messages)
    store.close()
    store = DuckDBSessionStore(path)  # reopened, as after a wake
    src = store.get_thread("source")
    fork_at = messages[-1]["id"]
    store.branch_session(src.id, fork_at)  # warm-up (first statement plans, caches)

    def undo(delete: Callable[[], None]) -> None:
        # Untimed: drop the copy and checkpoint, so every timed run starts from an
        # empty WAL (the copy's own cost; the checkpoints are measured below).
        delete()
        store.db.execute("CHECKPOINT")

    undo(lambda: None)
    branch = timed(
        lambda: store.branch_session(src.id, fork_at),
        lambda info: undo(lambda: store.delete_session(info.id)),
        RUNS,
    )
    clone = timed(
        lambda: store.clone_thread("source", "copy"),
        lambda thread: undo(lambda: store.delete_thread("copy")),
        RUNS,
    )
    # Copies kept (a store that accumulates branches): commits now cross DuckDB's
    # checkpoint threshold (4 MB of WAL, storage/db.py), and the checkpoint runs inside
    # the commit that crossed it, so the mean shows what the median hides.
    kept = timed(lambda: store.branch_session(src.id, fork_at), lambda info: None, 8)
    # Correctness of what was timed: a full, equal copy with new ids.
    copy = store.clone_thread("source", "check")
    copied = copy.get_messages()
    original = src.get_messages()
    assert len(copied) == len(original) == N
    assert [m["parts"] for m in copied] == [m["parts"] for m in original]
    assert not {m["id"] for m in copied} & {m["id"] for m in original}
    store.close()
    print(f"  [{label}]")
    report("branch_session of 10,000 messages", branch, 50)
    report("clone_thread of 10,000 messages", clone, 50)
    line(
        "  branches kept: median / mean / max (8)",
        f"{ms(statistics.median(kept))} / {ms(statistics.fmean(kept))} / {ms(max(kept))}",
        "-",
    )


def read_history(path: Path, sid: str, runs: int = 20) -> list[float]:
    """get_history of the head after a reopen (the first read is not counted)."""
    store = DuckDBSessionStore(path)
    store.get_history(sid)
    out: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        store.get_history(sid)
        out.append(time.perf_counter() - started)
    store.close()
    return out


def bench_rewinds(tmp: Path, label: str, messages: list[dict[str, Any]]) -> None:
    path = tmp / f"rewind-{label}.duckdb"
    store = DuckDBSessionStore(path)
    sid = store.create_session("long").id
    store.append_messages(sid, messages)
    store.close()
    baseline = read_history(path, sid)  # the same session before any rewind
    store = DuckDBSessionStore(path)
    rewinds: list[float] = []
    for r in range(10):
        history = store.get_history(sid)[-12:-1]
        users = [m["id"] for m in history if m["role"] == "user"]
        target = users[-1 - r % 3]  # a user message 1-3 turns back
        started = time.perf_counter()
        store.rewind_session(sid, target)
        rewinds.append(time.perf_counter() - started)
        store.append_messages(
            sid,
            [
                {
                    "id": f"r{r}-a",
                    "role": "assistant",
                    "metadata": {"usage": {"input": 5, "output": 1}},
                    "parts": [{"type": "text", "text": f"regenerated {r}"}],
                },
                {"id": f"r{r}-u", "role": "user", "parts": [{"type": "text", "text": "next"}]},
            ],
        )
    hidden = store.message_count(sid, include_hidden=True) - store.message_count(sid)
    store.close()

    reads = read_history(path, sid)
    store = DuckDBSessionStore(path)
    assert store.get_history(sid)[-1]["id"] == "r9-u"
    unrewind_started = time.perf_counter()
    store.unrewind_session(sid)
    unrewind = time.perf_counter() - unrewind_started
    store.close()
    print(f"  [{label}] ({hidden} hidden messages on 10 abandoned branches)")
    report("get_history after 10 rewinds", reads, 30)
    line(
        "  same session before the rewinds, median",
        ms(statistics.median(baseline)),
        "-",
    )
    line("  rewind_session median", ms(statistics.median(rewinds)), "-")
    line("  unrewind_session", ms(unrewind), "-")


def main() -> None:
    started = time.perf_counter()
    shapes = (("realistic", conversation(N)), ("light", light(N)))
    with tempfile.TemporaryDirectory() as tmp:
        print("branch and clone of a 10,000-message history")
        for label, messages in shapes:
            bench_copy(Path(tmp), label, messages)
        print("history read after 10 rewinds of a 10,000-message session")
        for label, messages in shapes:
            bench_rewinds(Path(tmp), label, messages)
    try:
        import os

        load = f"; load average {os.getloadavg()[0]:.2f}"
    except OSError:
        load = ""
    print(f"(bench took {time.perf_counter() - started:.1f} s{load})")


if __name__ == "__main__":
    main()
