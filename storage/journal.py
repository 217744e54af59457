"""An append-only journal beside an agent's DuckDB file (``<name>.duckdb.journal``).

Why it exists: a DuckDB statement costs 0.25-0.45 ms of CPU here whatever it writes,
so a turn written straight to DuckDB (a dozen statements, two commits) costs more than
the rest of the turn. The session store appends a turn's writes to this file instead
(one ``write`` and one ``fdatasync`` per durable point, as a DuckDB commit does) and
folds many of them into DuckDB later in one transaction (see
:mod:`thinkray.storage.write_behind`).

Format: frames of ``<length u32 LE><crc32 u32 LE><msgpack payload>``. Each payload is
one record (a map with an increasing ``n``). A frame is appended with one ``write`` of
the whole frame and made durable with ``fdatasync`` before :meth:`Journal.append`
returns, so an acknowledged record is on disk whole. A crash mid-append leaves a torn
last frame (short, or a checksum that does not match): :func:`read_records` drops it,
because it was never acknowledged. A bad frame followed by good ones is damage, not a
torn append, and raises :class:`~thinkray.storage.errors.CorruptDatabaseError`.

The journal never holds the only copy of anything for long: the store folds it at
close, before any read that needs it, and when it grows past a bound; the fold records
the last folded ``n`` in the database in the same transaction, so a crash between the
fold's commit and the journal's truncation replays nothing twice.
"""

from __future__ import annotations

import contextlib
import os
import struct
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


def frame(record: Any) -> bytes:
    """One record as a frame (header and msgpack payload)."""
    payload = msgpack.packb(record, use_bin_type=True)
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


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
            if at + _HEAD.size + length >= end:
                break  # the last frame, written partly: never acknowledged
            raise CorruptDatabaseError(
                f"the journal {str(path)!r} is damaged at byte {at} (a frame's checksum "
                "does not match and more frames follow); thinkray does not repair it: "
                "restore the agent's files from a backup",
                str(path),
                None,
                None,
                "journal checksum",
            )
        records.append(msgpack.unpackb(body, raw=False, strict_map_key=False))
        at += _HEAD.size + length
    return records


class Journal:
    """The append side of one journal file. Not thread-safe: the store calls it under
    its database's lock.

    Contract: :meth:`append` returns once the record is durable (``fdatasync``, and
    the folder's entry when the append created the file); :meth:`clear` forgets every
    record (called once they were folded and that fold committed) and removes the
    file, so an agent that is not writing holds no descriptor for it; :meth:`close`
    is idempotent and keeps a non-empty file (the next open replays it)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self.size = 0  # bytes in the file (as this process wrote them)

    def _open(self) -> int:
        if self._fd is None:
            created = not self.path.exists()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self.size = os.fstat(self._fd).st_size
            if created:  # the new name must survive a power loss with what it holds
                folder = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
        return self._fd

    def append(self, record: Any) -> None:
        """Append one record and make it durable."""
        fd = self._open()
        data = frame(record)
        try:
            written = os.write(fd, data)
            while written < len(data):  # a short write (signals, full disks): finish it
                written += os.write(fd, data[written:])
            os.fdatasync(fd)
        except BaseException:
            # Not acknowledged: take the frame back, so that a later open does not replay
            # a write its caller was told failed (if this fails too, the tail is torn or
            # whole; the caller saw an error either way).
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self.size)
            raise
        self.size += len(data)

    def clear(self) -> None:
        """Drop every record (they are in the database now) and the file."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.size = 0

    def close(self) -> None:
        """Close the file (idempotent); an empty journal is removed."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            if self.path.stat().st_size == 0:
                self.path.unlink()
