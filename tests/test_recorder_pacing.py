"""Progress flushes stretch with the runs streaming in one process
(``Recorder.progress_interval``): with hundreds of runs on one event loop (an agent
host), a 30 ms progress batch per run took most of a core. Durable batches are never
delayed. No wall-clock assertion: the armed timer's deadline is read from the loop."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from thinkray.runtime.turn import recorder as recorder_module
from thinkray.runtime.turn.persistence import PersistCache
from thinkray.runtime.turn.recorder import (
    DEFAULT_FLUSH_INTERVAL,
    PROGRESS_INTERVAL_PER_RUN,
    Recorder,
)
from thinkray.storage.session_store import DuckDBSessionStore

BASE = 0.01


@pytest.fixture(autouse=True)
def own_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A count of this test's recorders only: a run another test of this process left
    streaming (until the GC drops it) would count too."""
    monkeypatch.setattr(recorder_module, "_WAITING", weakref.WeakSet())


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DuckDBSessionStore]:
    s = DuckDBSessionStore(tmp_path / "agent.duckdb")
    yield s
    s.close()


def _recorders(store: DuckDBSessionStore, count: int, interval: float = BASE) -> list[Recorder]:
    sid = store.create_session().id
    cache = PersistCache()
    return [
        Recorder(store, sid, f"r{i}", f"m{i}", parent_id=None, cache=cache, flush_interval=interval)
        for i in range(count)
    ]


async def test_the_interval_stretches_with_the_runs_that_wait_to_flush(
    store: DuckDBSessionStore,
) -> None:
    assert not recorder_module._WAITING  # nothing streams in this process
    recorders = _recorders(store, 100)
    assert recorders[0].progress_interval == BASE  # open, nothing waiting: not counted
    loop = asyncio.get_running_loop()
    for r in recorders:
        armed_at = loop.time()
        r.record({"type": "start"})
    assert len(recorder_module._WAITING) == 100
    stretched = 100 * PROGRESS_INTERVAL_PER_RUN
    assert all(r.progress_interval == pytest.approx(stretched) for r in recorders)
    last = recorders[-1]._timer
    assert last is not None and last.when() >= armed_at + stretched - 1e-6
    first = recorders[0]._timer  # armed while it alone waited
    assert first is not None and first.when() < last.when()
    recorders[0].flush()  # a durable batch: written now, whatever the interval
    assert recorders[0].flushes == 1 and recorders[0] not in recorder_module._WAITING
    for r in recorders:
        r.close()
    assert not recorder_module._WAITING
    assert recorders[1].progress_interval == BASE


async def test_up_to_15_runs_keep_the_default_interval(store: DuckDBSessionStore) -> None:
    recorders = _recorders(store, 15, DEFAULT_FLUSH_INTERVAL)
    for r in recorders:
        r.record({"type": "start"})
    assert len(recorder_module._WAITING) == 15
    assert {r.progress_interval for r in recorders} == {DEFAULT_FLUSH_INTERVAL}
    extra = _recorders(store, 1, DEFAULT_FLUSH_INTERVAL)[0]
    extra.record({"type": "start"})  # the 16th stretches everyone's
    assert recorders[0].progress_interval == pytest.approx(16 * PROGRESS_INTERVAL_PER_RUN)
    for r in [*recorders, extra]:
        r.close()


async def test_a_recorder_dropped_without_close_stops_counting(
    store: DuckDBSessionStore,
) -> None:
    kept, dropped = _recorders(store, 2)
    kept.record({"type": "start"})
    dropped.record({"type": "start"})
    assert len(recorder_module._WAITING) == 2
    kept.close()
    assert dropped._timer is not None
    dropped._timer.cancel()  # the loop's reference to it
    del dropped
    gc.collect()
    assert not recorder_module._WAITING
