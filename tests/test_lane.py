"""The stream lane's transport (thinkray.actors.lane), without Ray: a LaneServer on an
event loop in a thread, read by the blocking and the asyncio client.

What a Ray stream guarantees must hold over the lane: the items in order with their
types, the actor's errors as the same classes, a closed connection as a dead actor,
and a caller that leaves detaching (the serving generator is closed, nothing aborted).
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import struct
import threading
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import ray
from thinkray.actors import lane
from thinkray.actors.errors import NotBoundError
from thinkray.runtime.errors import SessionBusyError

from tests.lane_support import TYPED, Served, read_all, read_all_async, request_for, serving


@pytest.fixture
def served() -> Iterator[tuple[lane.LaneServer, Served, asyncio.AbstractEventLoop]]:
    with serving() as running:
        yield running


def test_items_arrive_in_order_with_their_types(served):
    server, serve, _ = served
    items = [
        {"run_id": "r1", "items": [{"type": "start"}]},
        [{"type": "text-delta", "delta": "hé"}, {"type": "text-end"}],
        [b"\x00bytes", 2**63 - 1, -1.5, None, True],
    ]
    stream = lane.SyncLaneStream(server.path, request_for(server, items=items))
    assert read_all(stream) == items
    assert serve.calls == [("agent-a", "count", (1,), {"items": items}, None)]
    assert server.streams == 1


def test_what_msgpack_would_change_travels_pickled(served):
    """msgpack would turn a tuple into a list and refuses a set: those items are
    pickled, so the caller gets what a Ray stream gives it."""
    server, _, _ = served
    got = read_all(lane.SyncLaneStream(server.path, request_for(server, typed=True)))
    assert got == TYPED
    assert type(got[0][0]) is tuple and type(got[2][0]["nested"]) is tuple


def test_arguments_that_are_not_plain_data_are_not_sent_over_the_lane(served):
    server, _, _ = served
    address = server.address
    assert lane.request_bytes(address, "a", "m", ((1, 2),), {}, None) is None  # a tuple
    assert lane.request_bytes(address, "a", "m", (), {"x": {1}}, None) is None  # a set
    assert lane.request_bytes(address, "a", "m", (object(),), {}, None) is None

    class Text(str):
        pass

    assert lane.request_bytes(address, "a", "m", (Text("x"),), {}, None) is None
    assert lane.request_bytes(address, "a", "m", ("x", [1]), {"k": {"v": 1}}, None)


def test_thinkray_errors_arrive_as_themselves_after_the_items_before_them(served):
    server, _, _ = served
    stream = lane.SyncLaneStream(server.path, request_for(server, items=[[1]], **{"raise": "busy"}))
    assert stream.next_item() == [1]
    with pytest.raises(SessionBusyError, match="session s1 is busy"):
        stream.next_item()
    stream = lane.SyncLaneStream(server.path, request_for(server, **{"raise": "unbound"}))
    with pytest.raises(NotBoundError):
        stream.next_item()


def test_other_errors_arrive_as_a_ray_task_error_of_their_class(served):
    server, _, _ = served
    stream = lane.SyncLaneStream(server.path, request_for(server, **{"raise": "value"}))
    with pytest.raises(ray.exceptions.RayTaskError) as caught:
        stream.next_item()
    assert isinstance(caught.value, ValueError)
    assert "a plain bug" in str(caught.value)


def test_a_connection_closed_mid_stream_is_a_dead_actor(tmp_path):
    """The actor's process died between frames: the caller sees a RayActorError, so
    the handle's crash rules (never run a turn twice) apply as for a Ray stream."""
    path = str(tmp_path / "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def serve_half() -> None:
        conn, _ = listener.accept()
        conn.recv(64)  # the request
        body = msgpack.packb([1])
        conn.sendall(struct.pack(">IB", len(body), lane.ITEM) + body)
        conn.sendall(struct.pack(">IB", 100, lane.ITEM) + b"partial")
        conn.close()

    thread = threading.Thread(target=serve_half)
    thread.start()
    stream = lane.SyncLaneStream(path, b"request")
    assert stream.next_item() == [1]
    with pytest.raises(ray.exceptions.RayActorError):
        stream.next_item()
    thread.join(5)
    listener.close()


def test_a_caller_that_leaves_detaches_the_served_stream(served):
    server, serve, loop = served
    stream = lane.SyncLaneStream(server.path, request_for(server, items=[[1]], hold=True))
    assert stream.next_item() == [1]
    stream.close()
    loop.call_soon_threadsafe(serve.release.set)
    assert serve.closed.wait(10)  # the serving generator was closed, not left hanging


def test_the_async_client_reads_the_same_stream(served):
    server, _, _ = served

    assert asyncio.run(read_all_async(server, request_for(server, typed=True))) == TYPED


def test_the_socket_is_private_and_removed_when_closed(served):
    server, _, _ = served
    folder = os.path.dirname(server.path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
    assert server.address.secret.hex() not in server.path
    other = lane.LaneServer(Served(), "node-1")
    other.close()
    assert not os.path.exists(os.path.dirname(other.path))


def test_only_a_caller_on_the_actors_node_uses_its_lane(served, monkeypatch):
    """A socket path names a file on the actor's machine: a caller on another node
    (whose path may exist there for another reason) goes through Ray."""
    server, _, _ = served
    monkeypatch.setattr(lane, "_node", ["node-2"])
    assert lane._usable(server.address) is None
    monkeypatch.setattr(lane, "_node", ["node-1"])
    assert lane._usable(server.address) == server.address
    assert lane._usable({"path": server.path}) is None  # not an address at all
    server.close()
    assert lane._usable(server.address) is None  # its socket is gone


def test_an_item_only_cloudpickle_can_carry_arrives():
    """Ray sends items with cloudpickle: an instance of a class defined in a function
    (plain pickle refuses it) still arrives over the lane."""

    class Local:
        def __init__(self, value: int) -> None:
            self.value = value

    frame = lane._pack_items([Local(7)])
    size, kind = struct.unpack(">IB", frame[:5])
    assert kind == lane.ITEM_PICKLED and size == len(frame) - 5
    (item,) = lane._decode(kind, frame[5:])
    assert type(item).__name__ == "Local" and item.value == 7


def test_a_burst_of_connections_waits_for_a_busy_actor_instead_of_failing(served):
    """300 streams opened at once while the actor's loop is busy (it accepts none):
    they queue in the socket's backlog and are all served once it is free. With
    asyncio's default backlog of 100, the excess failed to connect."""
    import time

    server, _, loop = served
    loop.call_soon_threadsafe(time.sleep, 1.0)  # the actor's loop, busy for 1 s

    async def burst() -> list[Any]:
        async def one() -> Any:
            stream = await lane.AsyncLaneStream.open(server.path, request_for(server, items=[[1]]))
            return await stream.anext_item()

        return await asyncio.gather(*(one() for _ in range(300)), return_exceptions=True)

    results = asyncio.run(burst())
    assert results == [[1]] * 300


class _FakeActor:
    """What StreamCall needs of an actor handle to fall back to Ray."""

    def __init__(self) -> None:
        self._actor_id = bytes.fromhex("ab" * 16)
        self.ray_calls = 0
        outer = self

        class _Method:
            def remote(self, *args: Any) -> Any:
                outer.ray_calls += 1
                return iter(())

        self.invoke_stream = _Method()


def test_a_lane_that_cannot_be_reached_sends_the_call_through_ray(tmp_path, monkeypatch):
    """A socket that is gone: the call goes through Ray and the address is asked again
    next time. A socket that refuses for now (its backlog full): Ray this time, and the
    address is kept."""
    actor = _FakeActor()
    gone = lane.LaneAddress("node-1", str(tmp_path / "gone"), b"s" * lane.SECRET_BYTES)
    monkeypatch.setattr(lane, "_node", ["node-1"])
    lane._remember(actor, gone)
    call = lane.StreamCall("a", "count", (), {}, None)
    monkeypatch.setattr(lane, "_usable", lambda found: found)
    assert isinstance(call.open_sync(actor), lane.RayItems)
    assert actor.ray_calls == 1 and lane._known(actor) == (False, None)

    busy_path = str(tmp_path / "busy")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(busy_path)
    listener.listen(0)
    held = []
    for _ in range(64):  # fill the backlog (nothing accepts) until a connect is refused
        extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        extra.setblocking(False)
        held.append(extra)
        try:
            extra.connect(busy_path)
        except OSError:
            break
    busy = lane.LaneAddress("node-1", busy_path, b"s" * lane.SECRET_BYTES)
    lane._remember(actor, busy)

    async def open_it() -> Any:
        return await call.open_async(actor)

    assert isinstance(asyncio.run(open_it()), lane.RayItems)
    assert actor.ray_calls == 2 and lane._known(actor) == (True, busy)
    for sock in (*held, listener):
        sock.close()
    lane.forget(actor)


def test_concurrent_callers_ask_an_actor_for_its_lane_once(monkeypatch):
    """A burst of first turns to one host: the callers waiting for its lane address
    share one ``lane()`` call (it cost each of them a Ray round trip)."""
    address = lane.LaneAddress("node-1", "/nowhere", b"s" * lane.SECRET_BYTES)
    monkeypatch.setattr(lane, "_usable", lambda found: found)
    asked: list[int] = []

    class _Asked:
        def remote(self) -> Any:
            asked.append(1)

            async def answer() -> lane.LaneAddress:
                await asyncio.sleep(0.01)
                return address

            return answer()

    actor = _FakeActor()
    actor._actor_id = bytes.fromhex("cd" * 16)
    actor.lane = _Asked()  # type: ignore[attr-defined]

    async def burst() -> list[Any]:
        return await asyncio.gather(*(lane.address_async(actor) for _ in range(20)))

    try:
        assert asyncio.run(burst()) == [address] * 20
        assert len(asked) == 1
        assert asyncio.run(burst()) == [address] * 20 and len(asked) == 1  # known now
        lane.forget(actor)
        assert asyncio.run(burst()) == [address] * 20 and len(asked) == 2
        assert not lane._asking  # nothing left behind
    finally:
        lane.forget(actor)
