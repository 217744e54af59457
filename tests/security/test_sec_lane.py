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
    """Send ``frame`` and read until the actor closes the connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(frame)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


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
