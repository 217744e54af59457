"""Kept lane connections (thinkray.actors.lane_pool), without Ray: a stream read to
its END leaves its connection for the caller's next stream to the same actor; any
other ending closes it, and a kept connection the actor closed is not used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from thinkray.actors import lane, lane_pool
from thinkray.runtime.errors import SessionBusyError

from tests.helpers import wait_until
from tests.lane_support import Served, read_all, read_all_async, request_for, serving


@pytest.fixture
def served() -> Iterator[tuple[lane.LaneServer, Served, asyncio.AbstractEventLoop]]:
    with serving() as running:
        yield running
    lane_pool.SYNC.clear()


def test_streams_read_to_their_end_share_one_connection(served):
    server, serve, _ = served
    for n in range(3):
        stream = lane.SyncLaneStream(server.path, request_for(server, items=[[n], [n + 10]]))
        assert read_all(stream) == [[n], [n + 10]]
    assert server.streams == 3 and server.connections == 1
    assert [call[3]["items"][0] for call in serve.calls] == [[0], [1], [2]]


def test_a_stream_left_early_does_not_leave_its_frames_to_the_next(served):
    """A caller that leaves mid-stream closes its connection: the next stream gets a
    new one and reads only its own items (a kept connection would still hold the
    first stream's)."""
    server, serve, loop = served
    stream = lane.SyncLaneStream(server.path, request_for(server, items=[[1], [2]], hold=True))
    assert stream.next_item() == [1]
    stream.close()
    loop.call_soon_threadsafe(serve.release.set)
    assert read_all(lane.SyncLaneStream(server.path, request_for(server, items=[[7]]))) == [[7]]
    assert server.connections == 2


def test_a_stream_that_ended_on_an_error_closes_its_connection(served):
    server, _, _ = served
    stream = lane.SyncLaneStream(server.path, request_for(server, items=[[1]], **{"raise": "busy"}))
    assert stream.next_item() == [1]
    with pytest.raises(SessionBusyError):
        stream.next_item()
    assert read_all(lane.SyncLaneStream(server.path, request_for(server, items=[[2]]))) == [[2]]
    assert server.connections == 2


def test_a_kept_connection_the_actor_closed_is_not_used(served):
    """The actor closed an idle kept connection (it restarted its lane, or idled it
    out): the caller finds it closed and sends on a new one, with no error."""
    server, _, loop = served
    assert read_all(lane.SyncLaneStream(server.path, request_for(server, items=[[1]]))) == [[1]]
    wait_until(lambda: server.serving_connections == 1)  # kept, waiting for a request
    loop.call_soon_threadsafe(lambda: [writer.close() for writer in list(server._open)])
    wait_until(lambda: server.serving_connections == 0)
    assert read_all(lane.SyncLaneStream(server.path, request_for(server, items=[[2]]))) == [[2]]
    assert server.connections == 2 and server.refused == 0


def test_an_idle_connection_older_than_the_limit_is_closed_not_used(served, monkeypatch):
    server, _, _ = served
    monkeypatch.setattr(lane_pool, "IDLE_SECONDS", 0.0)
    for n in range(2):
        assert read_all(lane.SyncLaneStream(server.path, request_for(server, items=[[n]]))) == [[n]]
    assert server.connections == 2
    wait_until(lambda: server.serving_connections == 1)  # the expired one was closed


def test_a_caller_keeps_at_most_its_limit_of_idle_connections(served, monkeypatch):
    server, _, _ = served
    monkeypatch.setattr(lane_pool, "PER_LANE", 2)
    streams = [lane.SyncLaneStream(server.path, request_for(server, items=[[n]])) for n in range(4)]
    assert [read_all(stream) for stream in streams] == [[[0]], [[1]], [[2]], [[3]]]
    assert server.connections == 4
    wait_until(lambda: server.serving_connections == 2)


def test_an_event_loops_streams_share_a_connection(served):
    server, _, _ = served

    async def three() -> list[list[Any]]:
        return [await read_all_async(server, request_for(server, items=[[n]])) for n in range(3)]

    assert asyncio.run(three()) == [[[0]], [[1]], [[2]]]
    assert server.streams == 3 and server.connections == 1
    # Another loop cannot use the first one's connection (its reader is that loop's).
    assert asyncio.run(three()) == [[[0]], [[1]], [[2]]]
    assert server.connections == 2


def test_idle_connections_to_a_lane_no_longer_used_are_closed(served, monkeypatch):
    """A caller that stops streaming to a lane (its host retired) does not keep its
    connections there: returning one to another lane sweeps the expired ones."""
    server, _, _ = served
    with serving() as (other, _, _):
        assert read_all(lane.SyncLaneStream(server.path, request_for(server, items=[[1]])))
        wait_until(lambda: server.serving_connections == 1)
        monkeypatch.setattr(lane_pool, "IDLE_SECONDS", 0.0)
        assert read_all(lane.SyncLaneStream(other.path, request_for(other, items=[[2]])))
        wait_until(lambda: server.serving_connections == 0)  # swept, never taken again

        async def one_each() -> None:
            monkeypatch.setattr(lane_pool, "IDLE_SECONDS", 30.0)
            assert await read_all_async(server, request_for(server, items=[[3]]))
            monkeypatch.setattr(lane_pool, "IDLE_SECONDS", 0.0)
            assert await read_all_async(other, request_for(other, items=[[4]]))
            for _ in range(100):  # the loop's sweep, as in the blocking pool
                if server.serving_connections == 0:
                    return
                await asyncio.sleep(0.05)
            raise AssertionError("the idle connection was not swept")

        asyncio.run(one_each())


def test_an_idle_connection_is_readable_only_once_its_peer_closed():
    import socket

    mine, peer = socket.socketpair()
    try:
        assert not lane_pool._readable(mine)
        peer.close()
        assert lane_pool._readable(mine)
    finally:
        mine.close()
