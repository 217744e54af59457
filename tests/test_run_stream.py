"""RunStream's followers: what a relay across a process boundary sends, and when.

A coalescing follower gathers chunks into fewer batches, but the first content chunk
(the reader's time to first token) goes at once, and a producer about to block drains
what is buffered first. The coalesce windows here are far longer than the tests' own
timeouts, so a follower that waited them out fails instead of passing slowly."""

from __future__ import annotations

import asyncio

import pytest
from thinkray.runtime.turn.stream import Pacing, RunStream

LONG = 30.0  # a coalesce window no test may wait out


async def _next(batches, timeout: float = 2.0):  # type: ignore[no-untyped-def]
    return await asyncio.wait_for(anext(batches), timeout)


async def test_the_first_content_chunk_ends_the_first_batch_at_once() -> None:
    stream = RunStream("r", "s")
    batches = stream.follow(coalesce=LONG)
    stream.push({"type": "start"})
    stream.push({"type": "start-step"})
    first = asyncio.ensure_future(_next(batches))
    await asyncio.sleep(0.01)
    assert not first.done()  # no content yet: the follower gathers
    stream.push({"type": "text-start", "id": "t"})
    stream.push({"type": "text-delta", "id": "t", "delta": "Hi"})
    batch = await first
    assert [c["type"] for c in batch] == ["start", "start-step", "text-start", "text-delta"]


async def test_after_the_first_content_the_follower_gathers_until_drained() -> None:
    stream = RunStream("r", "s")
    batches = stream.follow(coalesce=LONG)
    stream.push({"type": "text-delta", "id": "t", "delta": "a"})
    assert len(await _next(batches)) == 1
    nxt = asyncio.ensure_future(_next(batches))
    for i in range(5):
        stream.push({"type": "text-delta", "id": "t", "delta": str(i)})
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    assert not nxt.done()  # gathering: content already went out
    stream.drain()
    assert [c["delta"] for c in await nxt] == ["0", "1", "2", "3", "4"]


async def test_closing_the_stream_sends_what_is_gathered_and_ends() -> None:
    stream = RunStream("r", "s")
    batches = stream.follow(coalesce=LONG)
    stream.push({"type": "text-delta", "id": "t", "delta": "a"})
    await _next(batches)
    stream.push({"type": "finish"})
    stream.close()
    assert [c["type"] for c in await _next(batches)] == ["finish"]
    with pytest.raises(StopAsyncIteration):
        await _next(batches)


async def test_delivered_waits_until_every_follower_took_everything() -> None:
    stream = RunStream("r", "s")
    taken: list[int] = []

    async def relay() -> None:
        async for batch in stream.follow(coalesce=LONG):
            taken.extend(c["i"] for c in batch)

    task = asyncio.ensure_future(relay())
    stream.push({"type": "text-delta", "i": 0})
    await asyncio.sleep(0.01)
    for i in range(1, 4):
        stream.push({"type": "text-delta", "i": i})
    await stream.delivered(timeout=LONG)
    assert taken == [0, 1, 2, 3]
    stream.close()
    await task


async def test_delivered_returns_at_once_without_followers() -> None:
    stream = RunStream("r", "s")
    stream.push({"type": "text-delta"})
    await asyncio.wait_for(stream.delivered(timeout=LONG), 1.0)


async def test_a_late_follower_replays_from_the_start_once() -> None:
    stream = RunStream("r", "s")
    for i in range(3):
        stream.push({"type": "text-delta", "i": i})
    stream.close()
    seen = [c["i"] async for batch in stream.follow(coalesce=LONG) for c in batch]
    assert seen == [0, 1, 2]


def test_pacing_widens_the_window_while_the_consumer_is_slow_and_narrows_after() -> None:
    pacing = Pacing(base=0.002, limit=0.1, factor=4.0)
    assert pacing.window() == 0.002  # nothing known yet: the base
    for _ in range(20):
        pacing.took(0.015)  # a loaded consumer: 15 ms to take each batch
    assert 0.05 < pacing.window() <= 0.1
    for _ in range(5):
        pacing.took(1.0)
    assert pacing.window() == 0.1  # never beyond the limit
    for _ in range(40):
        pacing.took(0.0002)  # the load went away
    assert pacing.window() == 0.002


async def test_a_paced_follower_learns_how_long_its_consumer_takes() -> None:
    stream = RunStream("r", "s")
    pacing = Pacing(base=0.001, limit=LONG)
    batches = stream.follow(coalesce=pacing)
    stream.push({"type": "text-delta", "id": "t", "delta": "a"})
    await _next(batches)
    await asyncio.sleep(0.02)  # the consumer is slow to come back
    stream.push({"type": "text-delta", "id": "t", "delta": "b"})
    stream.drain()
    nxt = asyncio.ensure_future(_next(batches))
    await asyncio.sleep(0)
    stream.drain()
    await nxt
    assert pacing.average >= 0.005


async def test_the_window_widens_with_the_relays_streaming_in_the_process(monkeypatch) -> None:
    """Each paced relay following a run counts: 40 of them gather for 40 ms each (one
    Ray item per ~40 ms per stream instead of one per chunk); when they end, a lone
    relay is back to its base."""
    import weakref

    from thinkray.runtime.turn import stream as stream_module

    # This test's relays only (one another test left following counts until collected).
    monkeypatch.setattr(stream_module, "_RELAYING", weakref.WeakSet())
    streams = [RunStream(f"r{i}", "s") for i in range(40)]
    pacings = [Pacing(base=0.002, limit=0.1, per_stream=0.001) for _ in streams]
    followers = [s.follow(coalesce=p) for s, p in zip(streams, pacings, strict=True)]
    for stream in streams:
        stream.push({"type": "text-delta", "id": "t", "delta": "a"})
    for follower in followers:
        assert len(await _next(follower)) == 1  # the first content chunk: never held
    assert pacings[0].window() == pytest.approx(0.04)
    assert Pacing(base=0.002, per_stream=0.003).window() == pytest.approx(0.1)  # the limit
    for stream, follower in zip(streams, followers, strict=True):
        stream.close()
        assert await anext(follower, None) is None
    # (each old pacing also learnt its consumer's take times meanwhile)
    assert Pacing(base=0.002, limit=0.1, per_stream=0.001).window() == 0.002
