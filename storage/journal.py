"""An append-only journal beside an agent's DuckDB file (``<name>.duckdb.journal``).

Why it exists: a DuckDB statement costs 0.25-0.45 ms of CPU here whatever it writes,
so a turn written straight to DuckDB (a dozen statements, two commits) costs more than
the rest of the turn. The session store appends a turn's writes to this file instead
(one ``write`` and one ``fdatasync`` per durable point, as a DuckDB commit does) and
folds many of them into DuckDB later in one transaction (see
:mod:`thinkray.storage.write_behind`).

Format: frames of ``<length u32 LE><crc32 u32 LE><msgpack payload>``. Each payload is
``[synced, record]``: the record (a map with an increasing ``n``) and how many bytes of
the file were durable when it was written (older journals hold the bare record). A
frame is appended with one ``write`` of the whole frame. A synced append (the default:
every durable point of a turn) calls ``fdatasync`` before :meth:`Journal.append`
returns, so an acknowledged record is on disk whole. An unsynced append (a progress
flush in the middle of a stream, SQLite's ``synchronous=NORMAL`` for such writes) is
written through to the OS: a crash of the process keeps it, a power loss may lose it,
and the next synced append makes it durable along with itself, in order. Agent hosts
stream hundreds of agents from one event loop; an ``fdatasync`` per progress flush
(every 30 ms per streaming agent) left the loop waiting on the disk.

A crash mid-append leaves a torn last frame (short, or a checksum that does not
match): :func:`read_records` drops it, because it was never acknowledged. A power loss
may also tear an unsynced frame while a later one reached the disk: a bad frame that
no later frame says was synced is such a tear, and it and what follows are dropped
(none of it was acknowledged as durable). A bad frame that a later frame says was
synced is damage, and raises :class:`~thinkray.storage.errors.CorruptDatabaseError`.
(Media damage to a progress frame that the very last, synced, frame made durable
reads as a tear and drops that last frame: like SQLite's WAL, which stops at its first
bad frame, the journal cannot tell these apart.)

The journal never holds the only copy of anything for long: the store folds it at
close, before any read that needs it, and when it grows past a bound; the fold records
the last folded ``n`` in the database in the same transaction, so a crash between the
fold's commit and the journal's truncation replays nothing twice.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import msgpack
from thinkray.storage.errors import CorruptDatabaseError

SUFFIX = ".journal"
_HEAD = struct.Struct("<II")


def journal_path(db_path: str | os.PathLike[str]) -> Path:
    """Where the journal of the database file ``db_path`` lives."""
    path = Path(db_path)
    return path.with_name(path.name + SUFFIX)


def frame(record: Any, synced: int = 0) -> bytes:
    """One record as a frame (header and msgpack payload), saying that ``synced``
    bytes of the file were durable when it was written."""
    payload = msgpack.packb([synced, record], use_bin_type=True)
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def _parse(body: bytes) -> tuple[int, Any]:
    """``(synced, record)`` of a frame's payload (a bare record: an older journal,
    every frame of which was synced)."""
    value = msgpack.unpackb(body, raw=False, strict_map_key=False)
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], int):
        return value[0], value[1]
    return -1, value


def _synced_past(data: bytes, at: int, bad: int) -> bool:
    """Whether a whole frame from ``at`` on says that byte ``bad`` was durable when
    it was written (an older journal's frames say so of everything before them)."""
    end = len(data)
    while end - at >= _HEAD.size:
        length, crc = _HEAD.unpack_from(data, at)
        body = data[at + _HEAD.size : at + _HEAD.size + length]
        if len(body) == length and zlib.crc32(body) == crc:
            with contextlib.suppress(ValueError, msgpack.UnpackException):
                synced, _ = _parse(body)
                if synced < 0 or synced > bad:
                    return True
        at += _HEAD.size + length
    return False


def read_records(path: str | os.PathLike[str]) -> list[Any]:
    """Every whole record of the journal at ``path``, in order ([] when there is none).

    Raises:
        CorruptDatabaseError: a damaged frame is followed by more data (not a torn
            last append).
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    records: list[Any] = []
    at, end = 0, len(data)
    while at < end:
        if end - at < _HEAD.size:
            break  # a torn header: the last append never finished
        length, crc = _HEAD.unpack_from(data, at)
        body = data[at + _HEAD.size : at + _HEAD.size + length]
        if len(body) < length:
            break  # a torn payload
        if zlib.crc32(body) != crc:
            if not _synced_past(data, at + _HEAD.size + length, at):
                break  # never made durable (a torn append): neither is what follows
            raise CorruptDatabaseError(
                f"the journal {str(path)!r} is damaged at byte {at} (a frame's checksum "
                "does not match, and a later frame says it was on disk); thinkray does "
                "not repair it: "
                "restore the agent's files from a backup",
                str(path),
                None,
                None,
                "journal checksum",
            )
        records.append(_parse(body)[1])
        at += _HEAD.size + length
    return records


_SYNC_WEIGHT = 0.2
_typical_sync = [0.0]  # this process's syncs' recent duration (seconds), weighted


def typical_sync_seconds() -> float:
    """How long this process's journal syncs took lately (an exponentially weighted
    mean of their durations, 0 before the first): what a caller deciding whether to
    wait for the disk off its event loop weighs against a thread hop."""
    return _typical_sync[0]


def _timed_fdatasync(fd: int) -> None:
    started = time.perf_counter()
    os.fdatasync(fd)
    took = time.perf_counter() - started
    _typical_sync[0] += _SYNC_WEIGHT * (took - _typical_sync[0])


class Journal:
    """The append side of one journal file. Not thread-safe, except :meth:`sync`: the
    store calls the rest under its database's lock.

    Contract: :meth:`append` returns once the record is durable (``fdatasync``, and
    the folder's entry when the append created the file), or with ``sync=False`` once
    it is written to the OS (durable with the next synced append, in order); every
    record is on disk in the order appended, a prefix of them after a power loss;
    :meth:`clear` forgets every
    record (called once they were folded and that fold committed) and removes the
    file, so an agent that is not writing holds no descriptor for it; :meth:`close`
    is idempotent and keeps a non-empty file (the next open replays it).

    :meth:`sync` makes everything appended so far durable and may run in another
    thread while appends go on (an agent host syncs off its event loop, so that one
    agent's wait for the disk never stalls its siblings): it syncs a duplicate of the
    descriptor, so a :meth:`close` or :meth:`clear` meanwhile cannot make it sync
    another file, and it never lowers :attr:`synced`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self.size = 0  # bytes in the file (as this process wrote them)
        self.synced = 0  # bytes of it known durable (see the module: frames say it)
        self.syncs = 0  # fdatasync calls (a seam for tests)
        # sync() from another thread: the lock guards size/synced/_opened; _opened
        # counts opens, so a sync that outlived its file (cleared, closed) changes nothing.
        self._sync_lock = threading.Lock()
        self._opened = 0

    def _open(self) -> int:
        if self._fd is None:
            created = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with self._sync_lock:
                self._fd, self._opened = fd, self._opened + 1
                self.size = os.fstat(fd).st_size
            if created:  # the new name must survive a power loss with what it holds
                folder = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
            elif self.size:  # left by a crashed process: what it holds may be unsynced
                self._sync(self._fd)
            self.synced = self.size
        return self._fd

    def _sync(self, fd: int) -> None:
        _timed_fdatasync(fd)
        self.syncs += 1

    def open(self) -> None:
        """Open the file now rather than at the first append (creating it, and syncing
        its folder, if it is not there): the store opens a new agent's journal with
        its file, off the caller's event loop."""
        self._open()

    def sync(self) -> None:
        """Make every record appended before this call durable (a no-op when they are).
        Safe from another thread while the owner appends (see the class)."""
        with self._sync_lock:
            fd, target, opened = self._fd, self.size, self._opened
            if fd is None or self.synced >= target:
                return
            fd = os.dup(fd)  # the file stays open for this sync whatever the owner does
        try:
            _timed_fdatasync(fd)
        finally:
            os.close(fd)
        with self._sync_lock:
            self.syncs += 1
            if self._opened == opened and self._fd is not None:
                self.synced = max(self.synced, target)

    def append(self, record: Any, *, sync: bool = True) -> None:
        """Append one record; durable when this returns, or with ``sync=False``
        written to the OS and durable with the next synced append (see the class)."""
        fd = self._open()
        data = frame(record, self.synced)
        try:
            written = os.write(fd, data)
            while written < len(data):  # a short write (signals, full disks): finish it
                written += os.write(fd, data[written:])
            if sync:
                self._sync(fd)
        except BaseException:
            # Not acknowledged: take the frame back, so that a later open does not replay
            # a write its caller was told failed (if this fails too, the tail is torn or
            # whole; the caller saw an error either way).
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self.size)
            raise
        with self._sync_lock:
            self.size += len(data)
            if sync:
                self.synced = self.size

    def clear(self) -> None:
        """Drop every record (they are in the database now) and the file."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        with self._sync_lock:
            self.size = self.synced = 0

    def close(self) -> None:
        """Close the file (idempotent); an empty journal is removed."""
        with self._sync_lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                if self.synced < self.size:  # kept for the next open: whole on disk
                    with contextlib.suppress(OSError):
                        self._sync(fd)
            finally:
                os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            if self.path.stat().st_size == 0:
                self.path.unlink()
