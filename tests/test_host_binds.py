"""A directory's binds to one agent host, coalesced (``thinkray.actors.host_binds``):
order, per-bind outcomes, a failed call, a cancelled caller. No Ray: the host is a
fake whose ``bind_many`` calls the test completes one by one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from thinkray.actors.errors import ActorBusyError
from thinkray.actors.host_binds import HostBinds


class FakeHost:
    """``bind_many.remote(binds)``: an awaitable the test settles (``calls``)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Any], asyncio.Future[Any]]] = []
        self.bind_many = self

    def remote(self, binds: list[tuple[Any, Any]]) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self.calls.append(([spec for spec, _ in binds], future))
        return future

    def answer(self, index: int, fail: set[Any] = frozenset()) -> None:
        specs, future = self.calls[index]
        future.set_result(
            [
                (False, ActorBusyError("full", s)) if s in fail else (True, f"bound {s}")
                for s in specs
            ]
        )


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _start(binds: HostBinds, *specs: str) -> list[asyncio.Task[Any]]:
    return [asyncio.ensure_future(binds.bind(spec)) for spec in specs]


async def test_a_lone_bind_goes_at_once_in_a_call_of_its_own():
    host = FakeHost()
    sizes: list[int] = []
    binds = HostBinds(host, on_call=sizes.append)
    (task,) = _start(binds, "a")
    await _settle()
    assert [specs for specs, _ in host.calls] == [["a"]] and sizes == [1]
    host.answer(0)
    assert await task == "bound a"


async def test_binds_meeting_busy_calls_share_the_next_one_in_order():
    host = FakeHost()
    sizes: list[int] = []
    binds = HostBinds(host, in_flight=2, on_call=sizes.append)
    first = _start(binds, "a", "b")  # one call each: two in flight
    await _settle()
    rest = _start(binds, "c", "d", "e")
    await _settle()
    assert len(host.calls) == 2 and binds.queued == 3
    host.answer(1)
    await _settle()
    assert [specs for specs, _ in host.calls] == [["a"], ["b"], ["c", "d", "e"]]
    assert sizes == [1, 1, 3] and binds.queued == 0
    host.answer(2)
    host.answer(0)
    assert [await t for t in first + rest] == [f"bound {s}" for s in "abcde"]


async def test_a_call_carries_at_most_batch_binds():
    host = FakeHost()
    binds = HostBinds(host, in_flight=1, batch=2)
    tasks = _start(binds, "a", "b", "c", "d", "e")
    await _settle()
    for index in range(3):
        host.answer(index)
        await _settle()
    assert [specs for specs, _ in host.calls] == [["a"], ["b", "c"], ["d", "e"]]
    assert [await t for t in tasks] == [f"bound {s}" for s in "abcde"]


async def _a_then_b_and_c() -> tuple[FakeHost, list[asyncio.Task[Any]]]:
    """Three binds on one call in flight: ``a`` in the first, ``b`` and ``c`` waiting."""
    host = FakeHost()
    tasks = _start(HostBinds(host, in_flight=1), "a", "b", "c")
    await _settle()
    return host, tasks


async def test_one_binds_failure_is_its_own():
    host, tasks = await _a_then_b_and_c()
    host.answer(0)
    await _settle()
    host.answer(1, fail={"b"})
    assert await tasks[0] == "bound a" and await tasks[2] == "bound c"
    with pytest.raises(ActorBusyError) as refused:
        await tasks[1]
    assert refused.value.session == "b"


async def test_a_failed_call_fails_its_binds_and_the_next_call_goes():
    host, tasks = await _a_then_b_and_c()
    host.calls[0][1].set_exception(ConnectionError("the host died"))
    await _settle()
    with pytest.raises(ConnectionError):
        await tasks[0]
    assert [specs for specs, _ in host.calls] == [["a"], ["b", "c"]]  # not lost
    host.answer(1)
    assert [await t for t in tasks[1:]] == ["bound b", "bound c"]


async def test_a_cancelled_caller_leaves_the_call_and_its_siblings():
    host, tasks = await _a_then_b_and_c()
    host.answer(0)
    await _settle()
    tasks[1].cancel()  # its bind is on the way (the directory undoes it)
    await _settle()
    host.answer(1)
    assert await tasks[2] == "bound c"
    assert tasks[1].cancelled()
    assert [specs for specs, _ in host.calls] == [["a"], ["b", "c"]]
