"""Attacks on the stream lane (thinkray.actors.lane): a process on the node that
connects to an actor's socket without the secret, or with a request crafted to make
the actor unpickle, read without bound, or call what its Ray method would not.

Each must be refused before anything is served: nothing runs, nothing is unpickled.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
from typing import Any

import msgpack
import pytest
from thinkray.actors import lane

from tests.lane_support import serving


def _send(path: str, frame: bytes) -> bytes:
    """Send ``frame`` and read until the actor closes the connection, or until the
    stream's END frame (a served stream's connection stays open for the next)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(frame)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
            if _ends(out):
                break
        return out


def _ends(frames: bytes) -> bool:
    """Whether ``frames`` holds whole frames, the last an END."""
    kind = None
    while len(frames) >= 5:
        size, kind = struct.unpack(">IB", frames[:5])
        if len(frames) < 5 + size:
            return False
        frames = frames[5 + size :]
    return not frames and kind == lane.END


def _frame(kind: int, body: bytes) -> bytes:
    return struct.pack(">IB", len(body), kind) + body


def _request(secret: Any, **extra: Any) -> bytes:
    request = {"secret": secret, "name": "a", "method": "count", "args": [], "kwargs": {}}
    request.update(extra)
    return _frame(lane.ITEM, msgpack.packb(request, use_bin_type=True))


@pytest.mark.parametrize(
    "secret",
    [b"", b"\x00" * lane.SECRET_BYTES, "not-bytes", None],
    ids=["empty", "zeros", "text", "none"],
)
def test_a_wrong_secret_is_refused_and_nothing_runs(secret):
    with serving() as (server, serve, _):
        assert _send(server.path, _request(secret)) == b""
        assert serve.calls == [] and server.refused == 1 and server.streams == 0


def test_a_near_miss_of_the_secret_is_refused():
    with serving() as (server, serve, _):
        real = server.address.secret
        assert _send(server.path, _request(real[:-1] + bytes([real[-1] ^ 1]))) == b""
        assert _send(server.path, _request(real + b"x")) == b""
        assert serve.calls == [] and server.refused == 2
        assert _send(server.path, _request(real, kwargs={"items": [[1]]})) != b""
        assert len(serve.calls) == 1  # the real secret opens it: the test can fail


def test_every_request_on_a_kept_connection_needs_the_secret():
    """A caller keeps a connection whose stream ended for its next stream. One that
    carried the secret once is not trusted for it: a next request on it with a wrong
    secret is refused, nothing runs, and the connection is closed."""
    with serving() as (server, serve, _):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(server.path)
            real = server.address.secret
            sock.sendall(_request(real, kwargs={"items": [[1]]}))
            out = b""
            while not _ends(out):
                chunk = sock.recv(65536)
                assert chunk, "the first stream ended without its END frame"
                out += chunk
            sock.sendall(_request(b"x" * lane.SECRET_BYTES, kwargs={"items": [[2]]}))
            assert sock.recv(65536) == b""  # closed, nothing served
        assert len(serve.calls) == 1 and server.refused == 1 and server.connections == 1


def test_a_pickled_request_is_never_unpickled(tmp_path):
    """A request body that is a pickle whose loading would write a file: the actor
    reads requests as msgpack only, so the file is never written."""
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> Any:
            return (open, (str(marker), "w"))

    body = pickle.dumps(Exploit())
    with serving() as (server, serve, _):
        for kind in (lane.ITEM, lane.ITEM_PICKLED, lane.ERROR):
            assert _send(server.path, _frame(kind, body)) == b""
        assert not marker.exists() and serve.calls == []
        assert server.refused == 3


def test_an_oversized_request_is_refused_before_it_is_read():
    """A length header of 4 GiB: refused at once, not buffered."""
    with serving() as (server, serve, _):
        header = struct.pack(">IB", 0xFFFFFFFF, lane.ITEM)
        assert _send(server.path, header + b"x" * 1024) == b""
        assert serve.calls == [] and server.refused == 1


@pytest.mark.parametrize(
    "body",
    [b"\xc1", msgpack.packb([1, 2]), msgpack.packb("text"), b""],
    ids=["invalid", "array", "string", "empty"],
)
def test_a_malformed_request_is_refused(body):
    with serving() as (server, serve, _):
        assert _send(server.path, _frame(lane.ITEM, body)) == b""
        assert serve.calls == []


@pytest.mark.parametrize(
    "fields",
    [
        {"name": 1},
        {"method": None},
        {"args": "not a list"},
        {"kwargs": [1]},
        {"kwargs": {1: "non-text key"}},
        {"trace": "x"},
    ],
    ids=["name", "method", "args", "kwargs", "kwargs-key", "trace"],
)
def test_a_request_of_the_wrong_shape_is_refused_with_the_right_secret(fields):
    """Even with the secret, fields of the wrong type are refused before the call."""
    with serving() as (server, serve, _):
        request = {
            "secret": server.address.secret,
            "name": "a",
            "method": "count",
            "args": [],
            "kwargs": {},
        }
        request.update(fields)
        body = msgpack.packb(request, use_bin_type=True)
        assert _send(server.path, _frame(lane.ITEM, body)) == b""
        assert serve.calls == [] and server.refused == 1


def test_another_user_cannot_reach_the_socket():
    """The socket's folder is this user's only (0700): the file system refuses any
    other user before the secret is even asked for."""
    with serving() as (server, _, _):
        folder = os.stat(os.path.dirname(server.path))
        assert folder.st_mode & 0o077 == 0 and folder.st_uid == os.getuid()


def test_a_connection_that_sends_nothing_is_closed(monkeypatch):
    """Connections held open without a request (to exhaust the actor) are dropped."""
    monkeypatch.setattr(lane, "REQUEST_TIMEOUT", 0.2)
    with serving() as (server, serve, _):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(server.path)
            sock.sendall(b"\x00\x00")  # half a header, then silence
            assert sock.recv(1) == b""  # closed by the actor
        assert serve.calls == [] and server.refused == 1


def _real_lane(namespace_factory: Any, name: str) -> tuple[Any, Any]:
    """A hosted agent that answered once, and its host's lane address (as any Ray
    caller gets it)."""
    import ray

    ns = namespace_factory(None, placement="hosts", host_capacity=4, max_live=3)
    assert ns.get(name).chat.remote("hi").result().status == "completed"
    address = ray.get(ns.get(name)._actor_sync().lane.remote())
    assert isinstance(address, lane.LaneAddress)
    return ns, address


def _history_length(ns: Any, name: str) -> int:
    return len(ns.get(name).get_history.remote().result())


@pytest.mark.ray
def test_a_real_host_runs_nothing_for_a_wrong_secret(namespace_factory):
    ns, address = _real_lane(namespace_factory, "victim")
    wire = {"id": "m-evil", "role": "user", "parts": [{"type": "text", "text": "pwned"}]}
    frame = _request(b"\x01" * lane.SECRET_BYTES, name="victim", method="stream_chat")
    frame_with_message = _frame(
        lane.ITEM,
        msgpack.packb(
            {
                "secret": b"\x01" * lane.SECRET_BYTES,
                "name": "victim",
                "method": "stream_chat",
                "args": [wire],
                "kwargs": {},
            }
        ),
    )
    for attack in (frame, frame_with_message):
        assert _send(address.path, attack) == b""
    assert _history_length(ns, "victim") == 2  # still only "hi" and its answer


@pytest.mark.ray
@pytest.mark.parametrize("method", ["get_history", "hibernate", "_call", "__init__"])
def test_the_lane_serves_only_remote_stream_methods(namespace_factory, method):
    """With the secret (what any Ray caller of the host can get), the lane still
    serves only what ``invoke_stream`` serves through Ray: not a plain @remote call,
    not the actor's own methods."""
    from thinkray.actors.errors import RemoteCallError

    ns, address = _real_lane(namespace_factory, "target")
    request = lane.request_bytes(address, "target", method, (), {}, None)
    assert request is not None
    stream = lane.SyncLaneStream(address.path, request)
    with pytest.raises(RemoteCallError):
        stream.next_item()
    assert ns.where("target") is not None  # still bound: nothing ran
