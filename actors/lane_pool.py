"""Idle lane connections, kept for the caller's next stream to the same actor.

Why: a stream over a fresh connection pays a connect on the caller's side and an
accept, a transport and a task on the actor's (~0.1 ms of round trip on this 2-core
machine, about a tenth of what a bound turn through an agent host adds over the same
turn in process). A connection whose stream ended cleanly (its END frame read) carries
the next request instead.

The contract:

- Only a connection whose stream was read to its END frame is put back: one a caller
  left early, or that ended on an error or a lost connection, is closed, so a reused
  connection never holds a frame of an earlier stream.
- A connection is taken at most once (last in, first out) and only within
  :data:`IDLE_SECONDS` of its return; older ones are closed as they are met, and
  those of lanes the caller no longer streams to (a retired host's) by a sweep at
  most every :data:`IDLE_SECONDS`, as connections are returned. At most
  :data:`PER_LANE` idle connections are kept per lane and process (or event loop).
- One whose actor closed it while idle (readable: its end of file) is closed, not
  used. A request whose send fails on a kept connection is sent on a fresh one; a
  connection that fails after its request was sent is a lost stream, as on a fresh
  one (the caller cannot know whether the actor read it).
- The actor waits for a kept connection's next request without the first request's
  timeout, up to its own idle limit (``lane.KEPT_IDLE``), longer than
  :data:`IDLE_SECONDS`, so a caller never sends on a connection the actor is closing
  for idling.

Each request still carries the lane's secret: a kept connection is not trusted for
having carried one before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
import weakref
from typing import IO, Any

IDLE_SECONDS = 30.0
"""How long a caller keeps an idle connection before closing it."""
PER_LANE = 8
"""Idle connections kept per lane (socket path), per process or event loop."""

_Sync = tuple[socket.socket, IO[bytes]]
_Async = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _readable(sock: socket.socket) -> bool:
    """Whether an idle connection has something to read: only its end of file (the
    actor closed it) can be there, as the actor sends nothing between streams. (A
    peek, not ``select``, which refuses descriptors above 1023.)"""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False  # open, and nothing sent
    except OSError:
        return True
    return True  # its end of file (or bytes it should not have sent)


class SyncPool:
    """Idle blocking connections by socket path, shared by a process's threads."""

    def __init__(self) -> None:
        self._idle: dict[str, list[tuple[float, _Sync]]] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._swept = time.monotonic()

    def take(self, path: str) -> _Sync | None:
        """An idle connection to ``path`` that is still open, or None."""
        while True:
            with self._lock:
                if self._pid != os.getpid():  # a forked child: the parent's sockets
                    self._idle, self._pid = {}, os.getpid()
                kept = self._idle.get(path)
                if not kept:
                    return None
                since, conn = kept.pop()
            if time.monotonic() - since < IDLE_SECONDS and not _readable(conn[0]):
                return conn
            close_sync(conn)

    def put(self, path: str, conn: _Sync) -> None:
        """Keep ``conn`` (its stream read to the end) for the next stream to ``path``;
        close what idled too long on any lane (one this caller no longer streams to:
        its host retired) at most once per :data:`IDLE_SECONDS`."""
        now = time.monotonic()
        expired: list[_Sync] = []
        with self._lock:
            if now - self._swept >= IDLE_SECONDS:
                self._swept = now
                expired = _sweep(self._idle, now)
            kept = self._idle.setdefault(path, [])
            if len(kept) < PER_LANE and self._pid == os.getpid():
                kept.append((now, conn))
            else:
                expired.append(conn)
        for old in expired:
            close_sync(old)

    def clear(self) -> None:
        """Close every idle connection (tests; a process that is done streaming)."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for kept in idle.values():
            for _, conn in kept:
                close_sync(conn)


def _sweep(idle: dict[str, list[tuple[float, Any]]], now: float) -> list[Any]:
    """Remove from ``idle`` the connections kept :data:`IDLE_SECONDS` or longer (and
    the lanes left with none); return them, to be closed."""
    expired = []
    for path in list(idle):
        fresh = [(since, conn) for since, conn in idle[path] if now - since < IDLE_SECONDS]
        expired += [conn for since, conn in idle[path] if now - since >= IDLE_SECONDS]
        if fresh:
            idle[path] = fresh
        else:
            del idle[path]
    return expired


def close_sync(conn: _Sync) -> None:
    """Close a blocking connection (its reader first), whatever state it is in."""
    with contextlib.suppress(OSError):
        conn[1].close()
    with contextlib.suppress(OSError):
        conn[0].close()


class AsyncPool:
    """Idle asyncio connections by event loop and socket path: a connection's reader
    and writer belong to the loop that opened it."""

    def __init__(self) -> None:
        self._idle: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, list[tuple[float, _Async]]]
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # loops in several threads share the map
        self._swept: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, float] = (
            weakref.WeakKeyDictionary()
        )

    def _loops(self) -> dict[str, list[tuple[float, _Async]]]:
        """The running loop's idle connections by path (only its own thread changes
        them)."""
        with self._lock:
            return self._idle.setdefault(asyncio.get_running_loop(), {})

    def _kept(self, path: str) -> list[tuple[float, _Async]]:
        return self._loops().setdefault(path, [])

    def take(self, path: str) -> _Async | None:
        """An idle connection to ``path`` opened on the running loop, or None."""
        kept = self._kept(path)  # this loop's alone: only its own thread changes it
        while kept:
            since, (reader, writer) = kept.pop()
            if (
                time.monotonic() - since < IDLE_SECONDS
                and not writer.is_closing()
                and not reader.at_eof()
                and not reader._buffer  # type: ignore[attr-defined]  # nothing between streams
            ):
                return reader, writer
            writer.close()
        return None

    def put(self, path: str, conn: _Async) -> None:
        """Keep ``conn`` (its stream read to the end) for the running loop's next
        stream to ``path``, sweeping as :meth:`SyncPool.put` does."""
        now, loop, by_path = time.monotonic(), asyncio.get_running_loop(), self._loops()
        with self._lock:
            due = now - self._swept.setdefault(loop, now) >= IDLE_SECONDS
            if due:
                self._swept[loop] = now
        if due:
            for _, writer in _sweep(by_path, now):
                writer.close()
        kept = by_path.setdefault(path, [])
        if len(kept) < PER_LANE and not conn[1].is_closing():
            kept.append((now, conn))
        else:
            conn[1].close()


SYNC = SyncPool()
ASYNC = AsyncPool()
