"""The process's one DuckDB instance, which every agent's file is ATTACHed to.

Issue 22: a DuckDB instance per file cost ~14 ms of CPU to open (its catalog, buffer
manager and settings; measured here: ``duckdb.connect`` of a small file 14.8 ms,
``ATTACH`` of it to a running instance 0.7 ms) and a buffer pool and threads of its
own. An agent host wakes tens of agents a second and keeps hundreds open, and a pooled
dedicated actor binds one file after another: all of them now attach their file to
one in-memory instance per process and talk to it through a cursor of their own whose
default catalog is that file (``USE``), so every statement thinkray runs stays
unqualified and each file still has its own transactions, WAL and lock.

Contract of :func:`attach` / :func:`detach`:

- A file attached twice in one process (two :class:`~thinkray.storage.db.Database`
  objects on one path, as a conformance test opens a second connection) is attached
  once; each caller gets its own cursor, and the file is detached when the last one
  lets go (DuckDB's ``DETACH`` checkpoints it and releases the file's lock).
- ``:memory:`` is a private in-memory catalog per call, as ``duckdb.connect`` gave.
- Another process holding the file: :func:`attach` raises DuckDB's ``IOException``
  (the caller retries on the lock, as it did for ``connect``), and nothing is left
  attached.
- A fatal DuckDB error invalidates the whole instance (DuckDB's rule): the next
  :func:`attach` starts a new one; what was attached to the old one fails on use.
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass, field

import duckdb
from thinkray.storage.layout import sql_literal
from thinkray.storage.vacuum import vacuum_if_wasteful

MEMORY_PATH = ":memory:"
# 16 KiB blocks: an empty session file is ~28 KiB instead of ~780 KiB with the 256 KiB
# default, which matters when thousands of hibernated sessions sit on shared storage.
BLOCK_SIZE = 16384

# Instance-wide settings (DuckDB has no per-file ones for these).
CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "threads": 1,
    # no pool of async I/O threads: with threads=1 alone an instance still starts ~8
    "async_threads": 0,
    "default_block_size": str(BLOCK_SIZE),  # for the files it creates
    # The storage format of the files it creates. DuckDB 2.0 writes its own by default,
    # whose catalog metadata takes ~1.5 slots of 256 bytes per column of a table with
    # rows: a session file's 66 slots spill into a second metadata block (16 KiB). The
    # 1.5 format takes 63 (one block); it reads the 10k-message history no slower, and
    # any DuckDB from 1.5 opens it. Files written in another format keep theirs.
    "storage_compatibility_version": "v1.5.0",
    # DuckDB's default. A lower threshold checkpoints mid-stream, and with 16 KiB blocks
    # a checkpoint of a large history stalls writes for 0.3-2 s; a file is compacted by
    # the checkpoint at close (hibernation) anyway.
    "checkpoint_threshold": "16MB",
}


@dataclass
class _File:
    alias: str  # its catalog's name in the instance
    path: str | None  # resolved (a symlink is kept); None: a private in-memory catalog
    users: int = 0  # cursors on it


@dataclass
class _Instance:
    con: duckdb.DuckDBPyConnection
    lock: threading.Lock = field(default_factory=threading.Lock)
    files: dict[str, _File] = field(default_factory=dict)  # by resolved path
    names: itertools.count[int] = field(default_factory=itertools.count)
    pid: int = field(default_factory=os.getpid)


_current: _Instance | None = None
_current_lock = threading.Lock()


def _instance() -> _Instance:
    global _current
    with _current_lock:
        if _current is None or _current.pid != os.getpid():
            _current = _Instance(duckdb.connect(MEMORY_PATH, config=CONFIG))
        return _current


def invalidated() -> None:
    """A fatal error invalidated the instance: the next attach starts a new one."""
    global _current
    with _current_lock:
        _current = None


@dataclass
class Attached:
    """One caller's hold on an attached file: its cursor (default catalog: the file)."""

    cursor: duckdb.DuckDBPyConnection
    key: str
    alias: str
    instance: _Instance


def attach(path: str) -> Attached:
    """Attach ``path`` (or a private ``:memory:`` catalog) and return a cursor on it.

    Raises:
        duckdb.IOException: the file is locked by another process, or unreadable.
    """
    inst = _instance()
    with inst.lock:
        if path == MEMORY_PATH:
            held = None
        else:
            key = os.path.realpath(path)
            held = inst.files.get(key)
        if held is None:
            alias = f"f{next(inst.names)}"
            inst.con.execute(f"ATTACH {sql_literal(path)} AS {alias}")
            if path == MEMORY_PATH:
                key = alias  # private: nobody else finds it
            held = inst.files[key] = _File(alias, None if path == MEMORY_PATH else key)
        held.users += 1
        try:
            cursor = inst.con.cursor()
            cursor.execute(f"USE {held.alias}")
        except BaseException:
            _release(inst, key)
            raise
    return Attached(cursor, key, held.alias, inst)


def detach(held: Attached) -> None:
    """Let go of ``held``: close its cursor, and detach the file if nobody else holds
    it (which checkpoints it and releases its lock). The last holder's detach also
    rewrites a small file compactly if its checkpoints left it wasteful (see
    :mod:`~thinkray.storage.vacuum`; the caller checkpointed it)."""
    try:
        held.cursor.close()
    finally:
        with held.instance.lock:
            _release(held.instance, held.key)


def _release(inst: _Instance, key: str) -> None:
    held = inst.files.get(key)
    if held is None:
        return
    held.users -= 1
    if held.users <= 0:
        del inst.files[key]
        # Still under the instance's lock: nobody in the process attaches the file
        # again until the copy has replaced it.
        try:
            if held.path is not None:
                vacuum_if_wasteful(inst.con, held.alias, held.path)
        finally:
            inst.con.execute(f"DETACH {held.alias}")
