"""The stream lane: a turn's stream from an actor to a caller on the same node over a
Unix socket, instead of a Ray streaming call.

Why: a Ray streaming call costs ~2.5 ms of latency and ~3 ms of CPU (both sides) for a
call and two items on a 2-core machine: more than a whole W1 turn (~3.7 ms in
process). A turn through an actor took 2.4-2.7x its in-process time, nearly all of it
Ray's transport. Over a Unix socket the same stream costs a few frames (and a connect,
unless the caller kept one: :mod:`~thinkray.actors.lane_pool`).

What travels the lane, and what does not:

- Only :meth:`SessionActor.invoke_stream` (every ``@remote`` stream method: a chat
  turn, a resume, the agent's own streams), and only to a caller on the actor's node
  whose arguments are plain data (msgpack). Anything else, and every call when the
  lane is off (``THINKRAY_STREAM_LANE=0``) or cannot be reached, goes through Ray as
  before: the lane is a fast path, never the only path.
- Aborts, wakes, binds and every other call still go through Ray.

The contract of a lane stream is the Ray stream's: the same items in the same order
(the header first), the actor's errors raised as the same classes
(:func:`_raise_remote`), and a lost connection is a dead actor
(:class:`LaneLost`, a ``RayActorError``), so the handle's exactly-once rules apply
unchanged. Leaving early closes the connection: the run goes on (detach, never abort),
as when a Ray stream's consumer leaves. A connection read to its stream's end is
kept for the caller's next stream to the actor.

Security: the socket lives in a folder only the actor's user can enter (0700), and
each connection must open with the actor's 32-byte secret, which only reaches callers
through a Ray call to the actor (never argv, URLs or logs). The actor reads requests
of bounded size, one stream after another on a connection, as msgpack (never
pickle), checks each one's secret, and serves only what its Ray method would serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import pickle
import secrets
import socket
import struct
import tempfile
import threading
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import ray
from thinkray.actors import lane_pool
from thinkray.actors.errors import NotBoundError
from thinkray.runtime.errors import ThinkrayError

log = logging.getLogger("thinkray.lane")

ENV = "THINKRAY_STREAM_LANE"
"""Set to ``0`` to send every stream through Ray (the caller's side decides)."""
MAX_REQUEST = 8 << 20
"""Largest request frame an actor reads (bytes): a bigger one closes the connection."""
SECRET_BYTES = 32
BACKLOG = 1024
"""Connections a lane's socket queues before the actor accepts them. A caller's burst
of streams (an ingress taking 200 chats at once) connects faster than one loop
accepts; asyncio's default of 100 made the excess fail to connect (they then went
through Ray)."""
REQUEST_TIMEOUT = 10.0
"""Seconds a connection has to send its first request (a caller sends it with the
connect), and any request once its first byte came: one that idles is closed, so
connections that never ask cannot pile up in the actor."""
KEPT_IDLE = 300.0
"""Seconds a connection whose stream ended may idle before its next request (callers
keep it for :data:`~thinkray.actors.lane_pool.IDLE_SECONDS`, less than this, so none
sends on a connection the actor is closing)."""

_HEAD = struct.Struct(">IB")  # frame: payload length, kind; then the payload
ITEM, ITEM_PICKLED, ERROR, END = b"i"[0], b"p"[0], b"e"[0], b"x"[0]

Serve = Callable[..., AsyncIterator[Any]]
"""``invoke_stream(name, method, args, kwargs, trace)`` of the serving actor."""


class LaneLost(ray.exceptions.RayActorError):
    """The lane's connection closed before the stream ended: the actor died (or
    closed it). Handled exactly as a Ray call to a dead actor."""


@dataclass(frozen=True)
class LaneAddress:
    """Where an actor's lane listens: its node, socket path and secret."""

    node_id: str
    path: str
    secret: bytes


def _frame(kind: int, payload: bytes) -> bytes:
    return _HEAD.pack(len(payload), kind) + payload


def _pack_items(item: Any) -> bytes:
    """One stream item as a frame: msgpack, or what msgpack cannot carry pickled by
    Ray's cloudpickle, as Ray would send it (the caller trusts the actor's pickles
    exactly as it trusts Ray's)."""
    try:
        return _frame(ITEM, msgpack.packb(item, use_bin_type=True, strict_types=True))
    except (TypeError, ValueError, OverflowError):
        return _frame(ITEM_PICKLED, ray.cloudpickle.dumps(item, protocol=5))


def _pack_error(exc: BaseException) -> bytes:
    text = "".join(traceback.format_exception(exc))
    try:
        body = ray.cloudpickle.dumps((exc, text), protocol=5)
    except Exception:  # an exception that does not pickle: its text, as Ray would
        body = pickle.dumps((RuntimeError(f"{type(exc).__name__}: {exc}"), text))
    return _frame(ERROR, body)


# -- the actor's side ------------------------------------------------------------------


def _socket_folder() -> str:
    """A fresh folder only this user can enter, short enough for a socket path: in
    Ray's session folder beside Ray's own sockets (an actor killed by SIGKILL leaves
    its empty folder and dead socket there, as Ray's own workers leave theirs), else
    the system's temp folder."""
    base = None
    with contextlib.suppress(Exception):  # Ray's internals: any failure, the temp folder
        node = ray._private.worker.global_worker.node
        if node is not None:
            base = os.path.join(node.get_session_dir_path(), "sockets")
    if base is None or len(base) > 70 or not os.path.isdir(base):
        base = tempfile.gettempdir()
    return tempfile.mkdtemp(prefix="tr-lane-", dir=base)  # mode 0700


def _check_shape(request: dict[str, Any]) -> None:
    """Raise ValueError unless ``request`` has the fields a caller sends, typed."""
    kwargs, trace = request.get("kwargs"), request.get("trace")
    if not (
        isinstance(request.get("name"), str)
        and isinstance(request.get("method"), str)
        and isinstance(request.get("args"), list)
        and isinstance(kwargs, dict)
        and all(isinstance(key, str) for key in kwargs)
        and (trace is None or isinstance(trace, dict))
    ):
        raise ValueError("malformed lane request")


class LaneServer:
    """Serves one actor's lane on the running loop (the loop its streams run on)."""

    def __init__(self, serve: Serve, node_id: str) -> None:
        self._serve = serve
        self._secret = secrets.token_bytes(SECRET_BYTES)
        self._folder = _socket_folder()
        self.path = os.path.join(self._folder, "lane")
        self.node_id = node_id
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.StreamWriter] = set()  # connections being served or kept
        self.streams = 0  # streams served (the actor's ready() reports it)
        self.connections = 0  # connections accepted (a kept one serves several streams)
        self.refused = 0  # connections closed for a bad secret or request

    async def start(self) -> LaneAddress:
        """Listen (the socket readable and writable by this user only)."""
        self._server = await asyncio.start_unix_server(
            self._connection, path=self.path, backlog=BACKLOG
        )
        os.chmod(self.path, 0o600)
        return self.address

    @property
    def serving_connections(self) -> int:
        """Connections open now: streaming, or kept for their caller's next stream."""
        return len(self._open)

    @property
    def address(self) -> LaneAddress:
        """What a caller needs to connect: sent only as a Ray call's answer."""
        return LaneAddress(self.node_id, self.path, self._secret)

    def close(self) -> None:
        """Stop listening, close every connection and remove the socket's folder
        (streams in flight end as their actor's would: the caller sees the connection
        close; a kept one is found closed and not used)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self._folder)

    async def _request(
        self, reader: asyncio.StreamReader, kept: bool = False
    ) -> dict[str, Any] | None:
        """The connection's next request, or None (and counted, if it is not valid).
        ``kept``: a stream ended on this connection already; its caller may idle up to
        :data:`KEPT_IDLE` before sending the next request, or close it."""
        head = None
        if kept:
            try:
                async with asyncio.timeout(KEPT_IDLE):
                    head = await reader.readexactly(_HEAD.size)
            except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
                return None  # the caller closed it, or let it idle: no request
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                if head is None:
                    head = await reader.readexactly(_HEAD.size)
                size, kind = _HEAD.unpack(head)
                if kind != ITEM or size > MAX_REQUEST:
                    raise ValueError("bad request frame")
                body = await reader.readexactly(size)
            request = msgpack.unpackb(body, raw=False)
            if not isinstance(request, dict):
                raise ValueError("request is not a map")
            secret = request.pop("secret", b"")
            if not isinstance(secret, bytes) or not hmac.compare_digest(secret, self._secret):
                raise PermissionError("wrong lane secret")
            _check_shape(request)
            return request
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        except Exception as exc:
            self.refused += 1
            log.warning("lane connection refused: %s", type(exc).__name__)
            return None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve the connection's streams one after another: its caller keeps it open
        after a stream's END for its next request (:mod:`~thinkray.actors.lane_pool`).
        Every request is checked as the first was: its secret and its shape."""
        self.connections += 1
        self._open.add(writer)
        try:
            request = await self._request(reader)
            while request is not None:
                self.streams += 1
                await self._stream(request, writer)
                request = await self._request(reader, kept=True)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the caller left: the run goes on (detached)
        finally:
            self._open.discard(writer)
            writer.close()

    async def _stream(self, request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        items = self._serve(
            request["name"],
            request["method"],
            tuple(request["args"]),
            request["kwargs"],
            request.get("trace"),
        )
        try:
            async for item in items:
                writer.write(_pack_items(item))
                await writer.drain()
            writer.write(_frame(END, b""))
        except ConnectionError:  # the caller left: not an error of the stream's
            raise
        except Exception as exc:
            writer.write(_pack_error(exc))
        finally:
            await items.aclose()  # type: ignore[attr-defined]
        await writer.drain()


async def start_lane(serve: Serve, node_id: str, owner: str) -> LaneServer | None:
    """A started lane serving ``serve`` on the running loop, or None (logged: callers
    then use Ray) when the socket cannot be made. ``owner`` names the actor in logs."""
    lane = None
    try:
        lane = LaneServer(serve, node_id)
        await lane.start()
        return lane
    except OSError as exc:
        log.warning("%s: no stream lane: %s", owner, exc)
        if lane is not None:
            lane.close()
        return None


# -- the caller's side -----------------------------------------------------------------

_addresses: dict[str, LaneAddress | None] = {}  # actor id -> its lane (None: none / off)
_addresses_lock = threading.Lock()
# (event loop id, actor id) -> the lane() call in flight there (address_async)
_asking: dict[tuple[int, str], asyncio.Future[LaneAddress | None]] = {}
_node: list[str] = []


def enabled() -> bool:
    """Whether this process sends streams over lanes (``THINKRAY_STREAM_LANE``)."""
    return os.environ.get(ENV, "1") != "0"


def _this_node() -> str:
    if not _node:
        _node.append(ray.get_runtime_context().get_node_id())
    return _node[0]


def _usable(found: Any) -> LaneAddress | None:
    """An actor's answer to ``lane()``, if this caller can use it: same node, socket
    there."""
    if not isinstance(found, LaneAddress) or found.node_id != _this_node():
        return None
    return found if os.path.exists(found.path) else None


def _known(actor: Any) -> tuple[bool, LaneAddress | None]:
    with _addresses_lock:
        key = actor._actor_id.hex()
        return key in _addresses, _addresses.get(key)


def _remember(actor: Any, address: LaneAddress | None) -> None:
    with _addresses_lock:
        if len(_addresses) > 4096:  # actors come and go: keep the map bounded
            _addresses.clear()
        _addresses[actor._actor_id.hex()] = address


def forget(actor: Any) -> None:
    """Drop what is known of ``actor``'s lane (it could not be reached)."""
    with _addresses_lock:
        _addresses.pop(actor._actor_id.hex(), None)


def address_sync(actor: Any) -> LaneAddress | None:
    """``actor``'s lane if this caller may use it (asks the actor once)."""
    known, address = _known(actor)
    if not known:
        try:
            address = _usable(ray.get(actor.lane.remote()))
        except Exception:  # an actor without a lane (or gone): Ray it is
            address = None
        _remember(actor, address)
    return address


async def address_async(actor: Any) -> LaneAddress | None:
    """:func:`address_sync` for async callers. Concurrent askers in one event loop
    share one ``lane()`` call: a burst's first turns to one host asked it once each
    (~2 ms of CPU across both processes per ask)."""
    known, address = _known(actor)
    if known:
        return address
    key = (id(asyncio.get_running_loop()), actor._actor_id.hex())
    asking = _asking.get(key)
    if asking is None:
        asking = _asking[key] = asyncio.ensure_future(_ask_lane(actor))
        asking.add_done_callback(lambda _: _asking.pop(key, None))
    return await asyncio.shield(asking)


async def _ask_lane(actor: Any) -> LaneAddress | None:
    try:
        address = _usable(await actor.lane.remote())
    except Exception:  # an actor without a lane (or gone): Ray it is
        address = None
    _remember(actor, address)
    return address


def request_bytes(
    address: LaneAddress,
    name: str,
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    trace: dict[str, str] | None,
) -> bytes | None:
    """The request frame, or None when the arguments are not plain data (Ray then)."""
    request = {
        "secret": address.secret,
        "name": name,
        "method": method,
        "args": list(args),
        "kwargs": kwargs,
        "trace": trace,
    }
    try:
        return _frame(ITEM, msgpack.packb(request, use_bin_type=True, strict_types=True))
    except (TypeError, ValueError, OverflowError):
        return None


def _raise_remote(body: bytes) -> None:
    """Raise the actor's error as a Ray call would: thinkray's own errors as
    themselves, others as a ``RayTaskError`` that is also an instance of the cause."""
    exc, text = pickle.loads(body)
    if isinstance(exc, ThinkrayError | NotBoundError):
        raise exc
    raise ray.exceptions.RayTaskError("invoke_stream", text, exc).as_instanceof_cause()


def _decode(kind: int, body: bytes) -> Any:
    if kind == ITEM:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    if kind == ITEM_PICKLED:
        return pickle.loads(body)
    if kind == ERROR:
        _raise_remote(body)
    raise LaneLost(error_msg=f"lane: unknown frame kind {kind}")


def _settle(stream: SyncLaneStream | AsyncLaneStream, kind: int, body: bytes, end: type) -> Any:
    """The item a frame carries; at the end (raising ``end``) the connection is kept
    for the next stream, on an error it is closed first."""
    if kind == END:
        stream.keep()
        raise end
    try:
        return _decode(kind, body)
    except BaseException:
        stream.close()
        raise


class SyncLaneStream:
    """A stream's items from a blocking socket: ``next_item()`` until StopIteration.
    The connection is a kept one (:mod:`~thinkray.actors.lane_pool`) when one is
    idle, else a new one; read to its END it is kept again."""

    def __init__(self, path: str, request: bytes) -> None:
        self._path = path
        kept = lane_pool.SYNC.take(path)
        if kept is not None:
            try:
                kept[0].sendall(request)
            except OSError:  # the actor closed it as we took it: nothing was read
                lane_pool.close_sync(kept)
                kept = None
        if kept is None:
            kept = _connect_sync(path, request)
        self._sock, self._file = kept
        self._done = False

    def next_item(self) -> Any:
        """The next item; StopIteration at the end, :class:`LaneLost` if the
        connection closed before it, the actor's error as a Ray call raises it."""
        if self._done:
            raise StopIteration
        try:
            head = self._file.read(_HEAD.size)
            if len(head) < _HEAD.size:
                raise LaneLost(error_msg="lane closed mid-stream: the actor died")
            size, kind = _HEAD.unpack(head)
            body = self._file.read(size)
            if len(body) < size:
                raise LaneLost(error_msg="lane closed mid-stream: the actor died")
        except OSError as exc:
            self.close()
            raise LaneLost(error_msg=f"lane failed mid-stream: {exc}") from None
        except LaneLost:
            self.close()
            raise
        return _settle(self, kind, body, StopIteration)

    def keep(self) -> None:
        """The stream was read to its END: its connection serves the next one."""
        if not self._done:
            self._done = True
            lane_pool.SYNC.put(self._path, (self._sock, self._file))

    def close(self) -> None:
        """Close the connection (the actor stops relaying; the run goes on)."""
        if not self._done:
            self._done = True
            lane_pool.close_sync((self._sock, self._file))


def _connect_sync(path: str, request: bytes) -> tuple[socket.socket, Any]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        sock.sendall(request)
    except OSError:
        sock.close()
        raise
    return sock, sock.makefile("rb")


CONNECT_RETRIES = (0.001, 0.002, 0.005, 0.01, 0.02)
"""Pauses (s) between connects to a lane whose backlog is full, before Ray is used."""


async def _connected(path: str) -> socket.socket:
    """A connected, non-blocking Unix socket to ``path``.

    asyncio's own connect takes a full backlog's EAGAIN for a connect in progress and
    then reports success on an unconnected socket; the first write fails, which reads
    as a dead actor (a turn reported interrupted that never reached it). Here EAGAIN is
    retried briefly, then raised (an OSError: the call goes through Ray)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        for pause in CONNECT_RETRIES:
            try:
                sock.connect(path)
                return sock
            except BlockingIOError:
                await asyncio.sleep(pause)
        sock.connect(path)
        return sock
    except BaseException:
        sock.close()
        raise


class AsyncLaneStream:
    """A stream's items from an asyncio connection: ``await anext_item()`` until
    StopAsyncIteration. Kept and reused as :class:`SyncLaneStream`'s, per event loop."""

    def __init__(
        self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._path, self._reader, self._writer = path, reader, writer
        self._done = False

    @classmethod
    async def open(cls, path: str, request: bytes) -> AsyncLaneStream:
        """Send ``request`` to the socket at ``path`` on a kept connection, else a new
        one; OSError if it is not there or still refuses (its backlog full) after a
        few retries."""
        kept = lane_pool.ASYNC.take(path)
        if kept is not None:
            reader, writer = kept
            with contextlib.suppress(OSError):
                writer.write(request)
            if not writer.is_closing():  # a failed send closes the transport at once
                return cls(path, reader, writer)
            writer.close()  # the actor closed it as we took it: nothing was read
        reader, writer = await asyncio.open_unix_connection(sock=await _connected(path))
        writer.write(request)
        return cls(path, reader, writer)

    async def anext_item(self) -> Any:
        """:meth:`SyncLaneStream.next_item`, ending with StopAsyncIteration."""
        if self._done:
            raise StopAsyncIteration
        try:
            size, kind = _HEAD.unpack(await self._reader.readexactly(_HEAD.size))
            body = await self._reader.readexactly(size)
        except (asyncio.IncompleteReadError, OSError) as exc:
            self.close()
            raise LaneLost(error_msg=f"lane closed mid-stream: the actor died ({exc})") from None
        return _settle(self, kind, body, StopAsyncIteration)

    def keep(self) -> None:
        """The stream was read to its END: its connection serves the loop's next one."""
        if not self._done:
            self._done = True
            lane_pool.ASYNC.put(self._path, (self._reader, self._writer))

    def close(self) -> None:
        """Close the connection (the actor stops relaying; the run goes on)."""
        if not self._done:
            self._done = True
            self._writer.close()


# -- opening a stream: the lane when it can, else Ray ---------------------------------


class RayItems:
    """A Ray streaming call's items, fetched: the lane streams' interface over an
    ``ObjectRefGenerator``."""

    def __init__(self, refs: Any) -> None:
        self._refs = refs

    def next_item(self) -> Any:
        """The next item, fetched (blocks)."""
        return ray.get(next(self._refs))  # StopIteration ends the stream

    async def anext_item(self) -> Any:
        """The next item, awaited."""
        return await (await self._refs.__anext__())  # StopAsyncIteration ends it

    def close(self) -> None:
        """Nothing to release: Ray drops an unread stream's items with its refs."""


class StreamCall:
    """One ``invoke_stream`` call, opened on an actor: over its lane when the caller
    is on its node and the arguments are plain data, else as a Ray streaming call.
    Re-opening (after a re-resolve) sends the same call again."""

    def __init__(
        self,
        name: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        trace: dict[str, str] | None,
    ) -> None:
        self.name, self.method, self.args, self.kwargs, self.trace = (
            name,
            method,
            args,
            kwargs,
            trace,
        )

    def _ray(self, actor: Any) -> RayItems:
        return RayItems(
            actor.invoke_stream.remote(self.name, self.method, self.args, self.kwargs, self.trace)
        )

    def _request(self, address: LaneAddress | None) -> bytes | None:
        if address is None:
            return None
        return request_bytes(address, self.name, self.method, self.args, self.kwargs, self.trace)

    def open_sync(self, actor: Any) -> SyncLaneStream | RayItems:
        """Send the call to ``actor`` (blocking caller); its items to read."""
        address = address_sync(actor) if enabled() else None
        request = self._request(address)
        if address is not None and request is not None:
            try:
                return SyncLaneStream(address.path, request)
            except (FileNotFoundError, ConnectionRefusedError):  # the socket is gone
                forget(actor)  # (its actor died or restarted): ask it again next time
            except OSError:  # busy: Ray this time, the lane next time
                pass
        return self._ray(actor)

    async def open_async(self, actor: Any) -> AsyncLaneStream | RayItems:
        """:meth:`open_sync` for async callers."""
        address = await address_async(actor) if enabled() else None
        request = self._request(address)
        if address is not None and request is not None:
            try:
                return await AsyncLaneStream.open(address.path, request)
            except (FileNotFoundError, ConnectionRefusedError):
                forget(actor)
            except OSError:
                pass
        return self._ray(actor)
