"""Vacuum: a small file is rewritten compactly as it is closed (issue 23: small sessions
stay small).

DuckDB gives no space back by itself. A checkpoint writes each changed table's new
blocks and the new catalog metadata before it frees the old ones (so that a crash
mid-checkpoint leaves the previous state whole), and what it frees is reused only by a
later checkpoint. A small file therefore carries about one checkpoint's worth of free
blocks plus a second, mostly empty, metadata block. Measured here (16 KiB blocks): a
session closed after 5 turns took 140 KiB where a copy takes 108, and one woken and
closed seven times for 23 turns grew to 220-284 KiB with 5-7 of its 14-17 blocks free.

So when the last holder of a file in the process lets go of it (see
:func:`thinkray.storage.instance.detach`), right after the closing checkpoint:

- A file of at most :data:`VACUUM_UP_TO_BYTES` that wastes at least
  :data:`MIN_WASTED_BLOCKS` (free blocks, and metadata blocks beyond what its used
  metadata needs) is copied (``COPY FROM DATABASE``, same block size and storage
  format) into a scratch file next to it, which replaces it by ``rename`` once synced.
  Larger files are left alone: their waste is a small share, and a copy's cost grows
  with the file (~6 ms of CPU for a small one).
- Crash safety: the original is checkpointed (no ``.wal``) before the copy starts and is
  replaced only by a complete, synced copy, so a crash at any point leaves one whole
  file at the path, either the old or the new one. A scratch file a crash left behind
  is removed by the next vacuum of that file (or with the agent).
- The file's DuckDB lock is held until the rename: no other process can open it
  between the copy and the rename, and one that retries the lock afterwards opens the
  copy.
- Any error leaves the original in place (the scratch file is removed) and is logged:
  a vacuum is an optimisation, never a reason for a close to fail.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import duckdb
from thinkray.storage.layout import sql_literal, sync_folder

__all__ = [
    "MIN_WASTED_BLOCKS",
    "VACUUM_UP_TO_BYTES",
    "Shape",
    "leftovers",
    "scratch_path",
    "shape",
    "vacuum_if_wasteful",
]

_log = logging.getLogger(__name__)

VACUUM_UP_TO_BYTES = 1 << 20
"""Files of at most this size (64 blocks of 16 KiB) are vacuumed."""

MIN_WASTED_BLOCKS = 2
"""A file is vacuumed when a copy would need at least this many blocks fewer."""

_METADATA_SLOTS = 64  # a metadata block holds 64 slots of 256 bytes


@dataclass(frozen=True)
class Shape:
    """An attached file's blocks: how many, of what size, how many a copy would not
    need (free blocks, and metadata blocks beyond those its used slots fill), and
    its storage format (DuckDB's ``storage_version`` tag without the ``+``)."""

    blocks: int
    block_size: int
    wasted: int
    storage_version: str | None


def shape(con: duckdb.DuckDBPyConnection, alias: str) -> Shape | None:
    """The :class:`Shape` of the file attached as ``alias`` (None: not a file)."""
    row = con.execute(
        "SELECT total_blocks, free_blocks, block_size FROM pragma_database_size() "
        "WHERE database_name = ?",
        [alias],
    ).fetchone()
    if row is None:
        return None
    blocks, free, block_size = (int(v) for v in row)
    metadata, used = con.execute(
        "SELECT count(*), coalesce(sum(total_blocks - free_blocks), 0) "
        f"FROM pragma_metadata_info('{alias}')"  # an alias of the instance's own making
    ).fetchone() or (0, 0)
    needed = -(-int(used) // _METADATA_SLOTS)
    tags = con.execute(
        "SELECT tags['storage_version'] FROM duckdb_databases() WHERE database_name = ?",
        [alias],
    ).fetchone()
    version = tags[0].rstrip("+") if tags and tags[0] else None
    return Shape(blocks, block_size, free + max(int(metadata) - needed, 0), version)


def scratch_path(path: str | os.PathLike[str]) -> Path:
    """Where the copy of ``path`` is built (a hidden file beside it)."""
    target = Path(path)
    return target.with_name(f".{target.name}.vacuum")


def leftovers(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """What a vacuum of ``path`` that a crash cut short can leave: the scratch copy and
    its log."""
    scratch = scratch_path(path)
    return scratch, Path(f"{scratch}.wal")


def vacuum_if_wasteful(con: duckdb.DuckDBPyConnection, alias: str, path: str) -> bool:
    """Replace the checkpointed file ``path`` (attached as ``alias`` and held by no one
    else in the process) by a compact copy if it is small and wasteful (see the
    module). The caller detaches ``alias`` afterwards either way. True if replaced."""
    try:
        found = shape(con, alias)
        if found is None or found.wasted < MIN_WASTED_BLOCKS:
            return False
        if found.blocks * found.block_size > VACUUM_UP_TO_BYTES:
            return False
        if os.path.exists(f"{path}.wal"):
            return False  # not checkpointed: the log belongs to the old file
        return _rewrite(con, alias, path, found)
    except (duckdb.Error, OSError):
        _log.warning("vacuuming %s failed; the file is kept as it is", path, exc_info=True)
        return False


def _rewrite(con: duckdb.DuckDBPyConnection, alias: str, path: str, found: Shape) -> bool:
    scratch = scratch_path(path)
    _remove(path)
    copy = f"{alias}_vacuum"
    # The copy keeps the file's block size and format: an older DuckDB that reads the
    # file reads its copy.
    options = f"BLOCK_SIZE {found.block_size}"
    if found.storage_version:
        options += f", STORAGE_VERSION {sql_literal(found.storage_version)}"
    replaced = False
    try:
        con.execute(f"ATTACH {sql_literal(scratch)} AS {copy} ({options})")
        try:
            con.execute(f"COPY FROM DATABASE {alias} TO {copy}")
        finally:
            con.execute(f"DETACH {copy}")  # checkpoints the copy: no .wal is left
        with open(scratch, "rb+") as out:
            # the original's permissions (DuckDB creates the copy with the umask's)
            os.fchmod(out.fileno(), stat.S_IMODE(os.stat(path).st_mode))
            os.fsync(out.fileno())
        os.replace(scratch, path)
        replaced = True
        sync_folder(Path(path).parent)
        return True
    finally:
        if not replaced:
            _remove(path)


def _remove(path: str) -> None:
    for leftover in leftovers(path):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
