"""How long a tool keeps the event loop from running anything else.

A ticker task runs beside the awaited call and records, between two of its turns, both
the wall time and the CPU time the loop's thread spent. CPU time is the measure that
survives a loaded machine: a process waiting for a core accrues wall time but no CPU
time, while work done on the loop without yielding (a backtracking regex) accrues both.
The wall figure is recorded too (a synchronous wait burns no CPU), but not asserted: a
loaded 2-core machine can deschedule the whole process for seconds, and a test must not
flake on that.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

MAX_LOOP_CPU = 0.1
"""The design's rule: nothing runs on an actor's loop for more than 100 ms at a time."""


@dataclass
class LoopLag:
    """The worst gaps between two turns of the ticker while the call ran."""

    cpu: float = 0.0
    wall: float = 0.0
    ticks: int = 0


async def measure_loop_lag(call: Awaitable[T], *, interval: float = 0.005) -> tuple[T, LoopLag]:
    """Await ``call`` while ticking every ``interval`` seconds; returns its result and
    the largest gaps seen (the ticker's own sleep is not counted as lag)."""
    lag = LoopLag()
    stop = asyncio.Event()

    async def tick() -> None:
        wall, cpu = time.monotonic(), time.thread_time()
        while not stop.is_set():
            await asyncio.sleep(interval)
            now_wall, now_cpu = time.monotonic(), time.thread_time()
            lag.wall = max(lag.wall, now_wall - wall - interval)
            lag.cpu = max(lag.cpu, now_cpu - cpu)
            lag.ticks += 1
            wall, cpu = now_wall, now_cpu

    # What earlier tests left on this worker's heap is not the call's: a full collection
    # of it, triggered by the call's allocations, ran ~0.4 s on the loop thread once in a
    # whole suite. Collect it now and freeze it, so the measure counts the call's work
    # (a collection of what the call allocates still counts).
    gc.collect()
    gc.freeze()
    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)  # the ticker takes its first reading before the call starts
    try:
        result = await call
    finally:
        stop.set()
        await ticker
        gc.unfreeze()
    return result, lag


def assert_loop_free(lag: LoopLag, what: Any) -> None:
    """The call never held the loop: under 100 ms of the loop thread's CPU between two
    turns of the ticker."""
    assert lag.ticks > 0, f"{what}: the loop never ran the ticker"
    assert lag.cpu < MAX_LOOP_CPU, f"{what} ran {lag.cpu:.3f} s of CPU on the event loop"
