"""New agent files start as a copy of a blank one made once per process.

Issue 22: a brand-new agent's first bind spent ~8 of its ~14 ms of CPU creating its
tables (the session store's, the fibers', the tool-call ledger's and the jobs': four
transactions and ~15 DDL statements), and a burst of new sessions on one agent host
queues those binds on one event loop. The tables of every new file are the same, so
the first new file of a process is built the slow way in a scratch folder, its bytes
are kept, and every later new file is those bytes written under its name: ~0.2 ms.

Contract of :func:`create`:

- It creates ``path`` only if nothing is there: an existing file (another writer was
  first) is left as it is and ``False`` returned; the caller then opens what exists.
- The file appears whole or not at all: the bytes go to a temporary name beside it,
  are synced, and are then linked to ``path`` (never a half-written database under
  its name). Where hard links are not supported it returns ``False`` and leaves the
  file to DuckDB.
- The blank holds the components' tables, made by the same migrations, and their
  versions (the ``schema_version.<component>`` keys of its ``config`` table, see
  :mod:`~thinkray.storage.db`) at those of the code that runs, so an open of the copy
  migrates nothing and a later migration upgrades it like any other file. It holds no
  ``schema_version`` table and no row anywhere else: every non-empty table and every
  index costs an agent's file blocks (issue 23), and ``config`` is non-empty in every
  agent's file anyway. Its tables' indexes are only those a new file needs (the
  tool-call ledger's id index comes once the ledger is big).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

from thinkray.storage.db import Database, Migration
from thinkray.storage.layout import sync_folder

Components = Sequence[tuple[str, Sequence[Migration]]]
"""(component, its migrations) pairs, as :meth:`Database.migrate` takes them."""

_blanks: dict[tuple[tuple[str, int], ...], bytes] = {}
_lock = threading.Lock()


def _key(components: Components) -> tuple[tuple[str, int], ...]:
    return tuple((name, max((m.version for m in steps), default=0)) for name, steps in components)


def blank_bytes(components: Components) -> bytes:
    """The bytes of a closed database holding ``components``' tables (built once per
    process and set of components)."""
    key = _key(components)
    with _lock:
        blank = _blanks.get(key)
        if blank is None:
            blank = _blanks[key] = _build(components)
        return blank


def versions(components: Components) -> dict[str, int]:
    """The schema versions the blank of ``components`` holds (component → version)."""
    return dict(_key(components))


def _build(components: Components) -> bytes:
    folder = tempfile.mkdtemp(prefix="thinkray-blank-")
    try:
        path = Path(folder) / "blank.duckdb"
        db = Database(path)
        try:
            for name, migrations in components:
                db.migrate(name, migrations)
        finally:
            db.close()  # checkpointed: the file alone is the database
        return path.read_bytes()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def create(
    path: str | os.PathLike[str],
    components: Components,
    companions: Sequence[str | os.PathLike[str]] = (),
) -> bool:
    """Create ``path`` as a copy of the blank database of ``components``; False (and
    nothing written) if ``path`` exists. See the module for the contract.

    ``companions``: files to create empty beside it (those not there yet) before the
    folder is synced, so that one folder sync makes all their names durable (the
    store's journal: its first record is synced with the file it belongs to)."""
    target = Path(path)
    if target.exists():
        return False
    data = blank_bytes(components)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.blank")
    try:
        with open(scratch, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())  # the journal's first record may follow at once
        try:
            os.link(scratch, target)  # fails if another writer created it meanwhile
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: DuckDB creates the file
            return False
        for companion in companions:
            with contextlib.suppress(FileExistsError):
                os.close(os.open(companion, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        sync_folder(target.parent)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(scratch)
