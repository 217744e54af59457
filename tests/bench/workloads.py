"""The benchmark workloads of issue 10, without Ray: their models, tool and agent, and
the in-process run that ``tests/bench/bench_w1.py`` (:mod:`tests.bench.w1`) measures.

- **W1**: an offline model streams :data:`W1_CHUNKS` text chunks a turn, with no delay
  between them. Every :data:`W1_TOOL_EVERY`-th turn of a session it first calls the
  ``lookup`` tool, then streams the 200 chunks; after the tool result a second step
  streams :data:`W1_AFTER_TOOL` more.
- **W2**: real model latency: the first chunk :data:`W2_FIRST` seconds after the
  request, 200 chunks spread over :data:`W2_SPAN` seconds (one every 20 ms), the step
  finishing at ``W2_FIRST + W2_SPAN``. Chunks are scheduled against the request's
  start, so a busy event loop shows up as added latency rather than as a slower model.

:class:`WorkloadAgent` is the agent the benchmark runs in process and in session actors
(it lives in the package so Ray workers can import it by name).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from thinkray.runtime.agents.think import Think
from thinkray.runtime.chunks import UIChunk
from thinkray.runtime.models.base import (
    Model,
    ModelEvent,
    ModelRequest,
    StepFinish,
    TextDelta,
    TextEnd,
    TextStart,
)
from thinkray.runtime.models.testing import FunctionModel, Reply, reply, tool_call
from thinkray.runtime.tools.base import Tool, tool
from thinkray.runtime.usage import Usage

__all__ = [
    "W1_AFTER_TOOL",
    "W1_CHUNKS",
    "W1_TOOL_EVERY",
    "W2_CHUNKS",
    "W2_FIRST",
    "W2_SPAN",
    "RunFigures",
    "Workload",
    "WorkloadAgent",
    "chunk_text",
    "file_bytes",
    "in_process_w1",
    "is_tool_turn",
    "lookup",
    "w1_model",
    "w1_text_chunks",
    "w2_model",
]

W1_CHUNKS = 200
W1_AFTER_TOOL = 50
W1_TOOL_EVERY = 5
W2_CHUNKS = 200
W2_FIRST = 0.5
W2_SPAN = 4.0

Workload = Literal["w1", "w2"]
"""Which model a :class:`WorkloadAgent` runs: ``w1`` (no delay) or ``w2`` (timed)."""


def chunk_text(i: int) -> str:
    """The ``i``-th text chunk of a workload reply (the same on both systems)."""
    return f"w{i} "


def is_tool_turn(turn: int) -> bool:
    """Whether the ``turn``-th turn (1-based) of a session calls the tool."""
    return turn % W1_TOOL_EVERY == 0


def w1_text_chunks(turn: int) -> int:
    """How many text chunks the ``turn``-th turn (1-based) of a W1 session streams."""
    return W1_CHUNKS + (W1_AFTER_TOOL if is_tool_turn(turn) else 0)


@tool
def lookup(query: str) -> dict:
    """A trivial tool: echoes the query with a fixed hit count."""
    return {"query": query, "hits": 3}


def _w1_step(request: ModelRequest, step: int) -> Reply:
    last = request.messages[-1] if request.messages else None
    if last is not None and last.role == "tool":
        return reply(*[chunk_text(i) for i in range(W1_AFTER_TOOL)])
    turn = sum(1 for m in request.messages if m.role == "user")
    chunks = [chunk_text(i) for i in range(W1_CHUNKS)]
    if is_tool_turn(turn):
        return reply(tool_call("lookup", {"query": f"turn {turn}"}), *chunks)
    return reply(*chunks)


def w1_model() -> Model:
    """The W1 model: 200 chunks a turn, a ``lookup`` call every 5th turn first, then
    50 chunks after its result; zero delay between chunks."""
    return FunctionModel(_w1_step, model_id="w1")


def w2_model(first: float = W2_FIRST, span: float = W2_SPAN, chunks: int = W2_CHUNKS) -> Model:
    """The W2 model: the first chunk ``first`` seconds after the request, ``chunks``
    chunks evenly over ``span`` seconds, the step ending at ``first + span``."""
    gap = span / chunks

    async def events(request: ModelRequest, step: int) -> AsyncIterator[ModelEvent]:
        start = time.monotonic()

        async def until(offset: float) -> None:
            await asyncio.sleep(max(0.0, start + offset - time.monotonic()))

        await until(first)
        yield TextStart(id="w2")
        for i in range(chunks):
            await until(first + i * gap)
            yield TextDelta(id="w2", delta=chunk_text(i))
        await until(first + span)
        yield TextEnd(id="w2")
        yield StepFinish(finish_reason="stop", usage=Usage(input=10, output=chunks))

    return FunctionModel(events, model_id="w2")


class WorkloadAgent(Think):
    """The benchmark's agent: a plain :class:`Think` with the W1 (or W2) model and the
    ``lookup`` tool. ``workload`` picks the model (``agent_kwargs={"workload": "w2"}``
    in a namespace)."""

    def __init__(self, store: Any = None, *, workload: Workload = "w1") -> None:
        self.workload = workload
        super().__init__(store)

    def get_model(self) -> Model:
        """The workload's model (:func:`w1_model` or :func:`w2_model`)."""
        return w2_model() if self.workload == "w2" else w1_model()

    def get_tools(self) -> dict[str, Tool]:
        """The one tool, ``lookup``."""
        return {"lookup": lookup}


SYNC_DELAY_ENV = "THINKRAY_BENCH_SYNC_DELAY"
"""Seconds every ``fsync``/``fdatasync`` of a :class:`SlowDiskAgent`'s process takes
longer: a networked disk's latency on this machine's local one. The benchmark sets it
before Ray starts, so the actor processes inherit it."""
_slowed: list[bool] = []


def _slow_the_disk() -> None:
    """Slow this process's syncs by :data:`SYNC_DELAY_ENV` seconds (once; none unset)."""
    delay = float(os.environ.get(SYNC_DELAY_ENV) or 0)
    if _slowed or delay <= 0:
        return
    _slowed.append(True)
    fsync, fdatasync = os.fsync, os.fdatasync

    def slow_fsync(fd: int) -> None:
        time.sleep(delay)
        fsync(fd)

    def slow_fdatasync(fd: int) -> None:
        time.sleep(delay)
        fdatasync(fd)

    os.fsync, os.fdatasync = slow_fsync, slow_fdatasync


class SlowDiskAgent(WorkloadAgent):
    """The W2 agent on a slow disk (:data:`SYNC_DELAY_ENV`); its turns sync where the
    placement says (off an agent host's loop)."""

    def __init__(self, store: Any = None, *, workload: Workload = "w2") -> None:
        _slow_the_disk()
        super().__init__(store, workload=workload)


class SlowDiskInPlaceAgent(SlowDiskAgent):
    """:class:`SlowDiskAgent` syncing on its event loop even in a host (as hosts did
    before they synced off it)."""

    syncs_off_loop = False


def file_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes on disk of a database file and its logs (``.wal`` and ``.journal`` for
    thinkray's DuckDB files, ``-wal`` for SQLite), whichever exist."""
    total = 0
    for candidate in (str(path), f"{path}.wal", f"{path}.journal", f"{path}-wal"):
        if os.path.exists(candidate):
            total += os.path.getsize(candidate)
    return total


@dataclass
class RunFigures:
    """What one measured run produced: per-turn time to first text chunk and turn
    latency (seconds), the wall time, the process CPU time, and its first session's
    database size (bytes on disk, file and write-ahead log) by turns done, and once
    closed."""

    turns: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    ttfc: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    sizes: dict[int, int] = field(default_factory=dict)
    closed_bytes: int = 0

    @property
    def turns_per_s(self) -> float:
        """Turns completed per second of wall time."""
        return self.turns / self.wall if self.wall else 0.0

    @property
    def cpu_per_turn(self) -> float:
        """Process CPU seconds per turn."""
        return self.cpu / self.turns if self.turns else 0.0


class _Watch:
    """A stream callback that notes when the first text chunk arrived and counts them."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.texts = 0
        self.error: str | None = None

    def on_event(self, chunk: UIChunk) -> None:
        """Note the first text delta's time; count text deltas."""
        if chunk["type"] == "text-delta":
            if self.first is None:
                self.first = time.perf_counter()
            self.texts += 1

    def on_done(self) -> None:
        """Nothing to do: the caller awaits the turn."""

    def on_error(self, error: str) -> None:
        """Keep the error for the caller to raise."""
        self.error = error


async def w1_turn(agent: Think, turn: int) -> tuple[float, float]:
    """W1's turn ``turn`` on an in-process agent: (TTFC, latency) in seconds, from
    calling ``chat`` to the first text chunk the stream callback sees, and to its end.

    Raises:
        RuntimeError: the turn did not complete or streamed the wrong number of chunks.
    """
    watch = _Watch()
    t0 = time.perf_counter()
    result = await agent.chat(f"turn {turn}", watch)
    t1 = time.perf_counter()
    if result.status != "completed" or watch.error:
        raise RuntimeError(f"W1 turn {turn} ended {result.status}: {watch.error}")
    if watch.texts != w1_text_chunks(turn) or watch.first is None:
        raise RuntimeError(
            f"W1 turn {turn} streamed {watch.texts} text chunks, expected {w1_text_chunks(turn)}"
        )
    return watch.first - t0, t1 - t0


async def in_process_w2(
    root: str | os.PathLike[str],
    sessions: int,
    turns: int,
    *,
    agent_factory: Callable[[Any], Think] | None = None,
    chunks: int = W2_CHUNKS,
) -> list[tuple[int, float, float]]:
    """W2 with no Ray: ``sessions`` brand-new agents at once in this process, each
    opening its new DuckDB file under ``root`` in a worker thread and waking (what an
    agent host's bind does), then taking ``turns`` turns. Returns ``(turn, TTFC,
    latency)`` per turn, in seconds; a first turn's are counted from before its file
    was opened, as an actor's first turn includes its bind. The floor a file per
    agent sets for the actor runs' first turns on this machine. ``agent_factory``
    (store → agent) and ``chunks`` (text chunks a turn streams): for tests.

    Raises:
        RuntimeError: a turn did not complete or streamed the wrong number of chunks.
    """
    from thinkray.storage.session_store import DuckDBSessionStore

    async def session(index: int) -> list[tuple[int, float, float]]:
        began = time.perf_counter()
        path = Path(root) / f"w2-{index:03d}" / "db.duckdb"
        store = await asyncio.to_thread(DuckDBSessionStore, path)
        agent = agent_factory(store) if agent_factory else WorkloadAgent(store, workload="w2")
        figures = []
        try:
            await agent.on_wake()
            for turn in range(1, turns + 1):
                watch = _Watch()
                t0 = began if turn == 1 else time.perf_counter()
                result = await agent.chat(f"turn {turn}", watch)
                t1 = time.perf_counter()
                if result.status != "completed" or watch.first is None or watch.texts != chunks:
                    raise RuntimeError(f"W2 turn {turn} ended {result.status}: {watch.error}")
                figures.append((turn, watch.first - t0, t1 - t0))
        finally:
            agent.close()
        return figures

    await _warm_up(Path(root) / "warm-up")  # as an agent host warms up when it starts
    done = await asyncio.gather(*(session(i) for i in range(sessions)))
    return [figure for figures in done for figure in figures]


class _WarmUpAgent(Think):
    def get_model(self) -> Model:
        return w2_model(first=0.0, span=0.0, chunks=1)


async def _warm_up(folder: Path) -> None:
    """One throwaway agent and turn: what a process pays once (pydantic completing its
    models and reading its plugins' entry points: tens of ms here) is not a burst's."""
    from thinkray.storage.session_store import DuckDBSessionStore

    agent = _WarmUpAgent(DuckDBSessionStore(folder / "db.duckdb"))
    try:
        await agent.on_wake()
        await agent.chat("warm up", _Watch())
    finally:
        agent.close()


async def in_process_w1(
    root: str | os.PathLike[str],
    sessions: int,
    turns: int,
    *,
    sizes_at: Sequence[int] = (),
    agent_factory: Callable[[Path], Think] | None = None,
) -> RunFigures:
    """W1 on in-process agents: ``sessions`` agents, each on its own DuckDB file under
    ``root``, take ``turns`` turns each, one turn at a time (round-robin). Records TTFC
    (from calling ``chat`` to the first text chunk the stream callback sees) and turn
    latency; ``sizes_at`` lists the turn counts after which the first session's file
    size is recorded.

    Raises:
        RuntimeError: a turn did not complete or streamed the wrong number of chunks.
    """
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    make = agent_factory or (lambda path: WorkloadAgent(path))
    paths = [base / f"s{i:03d}.duckdb" for i in range(sessions)]
    agents = [make(p) for p in paths]
    figures = RunFigures()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        for turn in range(1, turns + 1):
            for index, agent in enumerate(agents):
                ttfc, latency = await w1_turn(agent, turn)
                figures.ttfc.append(ttfc)
                figures.latency.append(latency)
                figures.turns += 1
                if index == 0 and turn in sizes_at:
                    figures.sizes[turn] = file_bytes(paths[0])
        figures.cpu = time.process_time() - cpu0
        figures.wall = time.perf_counter() - wall0
    finally:
        for agent in agents:
            agent.close()
    figures.closed_bytes = file_bytes(paths[0]) if paths else 0
    return figures
