"""One DuckDB file, opened the way every thinkray actor opens it.

A session actor owns exactly one database file for as long as it is bound to the
session; DuckDB's file lock guarantees a single writer. Every store in this package
(sessions, workspace, fibers, ...) shares one :class:`Database` so that a stream flush
that touches several tables commits in one transaction.

Each store owns its tables through a :class:`Migration` list registered under a
component name, with a version per component, so stores can be added (or grow)
independently and a file written by an older build is upgraded in place on open.

``config(key VARCHAR, value BLOB)`` is the file's one key/value table (issue 23: every
non-empty table costs the file a whole block, so nothing small gets a table of its
own). Whoever uses it creates it with that exact statement
(:data:`CONFIG_TABLE`); a key's prefix says whose it is:

- ``schema_version.<component>``: this module's. The component's schema version, as
  the ASCII digits of the number (``b"3"``). Read once per connection, written by
  :meth:`Database.migrate` in the migration's transaction; no one else writes them.
- ``sessions.``: the session store's (its journal mark, rewind logs and default
  settings); ``search.``: the search index's; ``fleet_index.``: the fleet index's.
- any other key: whoever calls the session store's
  :meth:`~thinkray.storage.protocols.SessionStore.set_config` (all but this module's
  keys are written through it, or as it does).

A file written by an older build keeps the versions in a table of their own,
``schema_version(component VARCHAR, version INTEGER)``: they are read from it while
``config`` holds none, and the first migration that writes moves them into ``config``
and drops that table, in its transaction.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

import duckdb
from thinkray.storage import instance as _instance
from thinkray.storage.errors import (
    CorruptDatabaseError,
    DatabaseFileError,
)
from thinkray.storage.errors import (
    DatabaseClosedError as DatabaseClosedError,
)
from thinkray.storage.errors import (  # re-exported: the errors live in thinkray.storage.errors
    DatabaseLockedError as DatabaseLockedError,
)

_log = logging.getLogger(__name__)

CHECKPOINT_RETRIES = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3)
"""Pauses (seconds) between the attempts of a close's ``CHECKPOINT`` that DuckDB
refused for a moment (see :func:`_checkpoint`)."""


def _checkpoint(con: duckdb.DuckDBPyConnection) -> None:
    """``CHECKPOINT`` the cursor's file, retried while DuckDB refuses it for another
    transaction's commit on it: a plain checkpoint only tries the file's checkpoint
    lock, and agents of one host close files of one instance from several threads at
    once (seen in a host's shutdown). Not ``FORCE CHECKPOINT``: it waits, without a
    bound, until every other transaction on the file has ended, holding new ones back
    meanwhile. Still refused after the retries: raised (nothing is lost: the WAL stays
    and is replayed on the next open)."""
    for pause in CHECKPOINT_RETRIES:
        try:
            con.execute("CHECKPOINT")
            return
        except duckdb.TransactionException as exc:
            if "other write transactions" not in str(exc):
                raise
            time.sleep(pause)
    con.execute("CHECKPOINT")


BLOCK_SIZE = _instance.BLOCK_SIZE
MEMORY_PATH = _instance.MEMORY_PATH
AGENT_FILE_SUFFIX = ".duckdb"

CONFIG_TABLE = "CREATE TABLE IF NOT EXISTS config (key VARCHAR, value BLOB)"
"""The file's key/value table, as every user of it creates it (see the module)."""
VERSION_KEY = "schema_version."
"""Prefix of the ``config`` keys that hold the components' schema versions."""

_READ_VERSIONS = f"SELECT key, value FROM config WHERE starts_with(key, '{VERSION_KEY}')"
# A file written by an older build: one table of (component, version) rows.
_LEGACY_TABLE = "schema_version"
_HAS_LEGACY = (
    "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
    f"AND schema_name = 'main' AND table_name = '{_LEGACY_TABLE}'"
)
_READ_LEGACY = f"SELECT component, version FROM {_LEGACY_TABLE}"
_MOVE_LEGACY = (
    f"INSERT INTO config SELECT '{VERSION_KEY}' || component, "
    f"encode(CAST(version AS VARCHAR)) FROM {_LEGACY_TABLE}"
)

# What DuckDB says of a file that is not (or no longer) a database it can read.
_CORRUPT_SIGNS = (
    "not a valid duckdb database",
    "could not read enough bytes",
    "checksum",
    "corrupt",
)


def file_error(path: str, exc: BaseException) -> DatabaseFileError:
    """DuckDB's I/O error on ``path`` as a typed error naming the agent and the file
    (``root/<namespace>/<agent>.duckdb``): a bare ``IOException`` says neither, and
    the caller of a wake only knows the agent's name."""
    reason = str(exc)
    file = Path(path)
    agent = namespace = None
    if file.name.endswith(AGENT_FILE_SUFFIX):
        agent, namespace = file.name[: -len(AGENT_FILE_SUFFIX)], file.parent.name or None
    who = f"agent {namespace}/{agent}" if agent else "database"
    if any(sign in reason.lower() for sign in _CORRUPT_SIGNS):
        return CorruptDatabaseError(
            f"{who}: its file {path!r} is corrupt or truncated and cannot be read "
            f"({reason}). thinkray does not repair or replace it: restore the file from a "
            "backup, or move it aside to start the agent empty",
            path,
            agent,
            namespace,
            reason,
        )
    return DatabaseFileError(
        f"{who}: its file {path!r} cannot be used ({reason})", path, agent, namespace, reason
    )


def _check_fatal(exc: BaseException) -> None:
    if isinstance(exc, duckdb.FatalException):
        _instance.invalidated()  # DuckDB's rule: the whole instance is unusable now


@dataclass(frozen=True)
class Migration:
    """One schema step of a component. ``apply`` runs inside the migration transaction."""

    version: int
    apply: Callable[[duckdb.DuckDBPyConnection], None]


_READS = ("SELECT", "WITH", "BEGIN", "COMMIT", "ROLLBACK", "PRAGMA", "DESCRIBE", "SHOW")


@dataclass
class StatementCount:
    """What :meth:`Database.counting` saw: every statement sent to DuckDB, and the
    commits among them that wrote (a ``COMMIT`` of a transaction with a write in it,
    or a write run in autocommit: each is one durable write of the file's log; a
    read-only transaction writes nothing)."""

    statements: int = 0
    commits: int = 0
    transactions: int = 0  # every COMMIT, read-only ones included
    writes: int = 0  # INSERT/UPDATE/DELETE/DDL statements, in or out of a transaction
    log: list[str] = field(default_factory=list)

    def reset(self) -> None:
        """Start counting from zero again."""
        self.statements = self.commits = self.transactions = self.writes = 0
        self.log.clear()


class _CountingConnection:
    """A DuckDB connection that counts what goes through ``execute`` (everything the
    stores send does: they hold the connection :attr:`Database.con` hands out)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, count: StatementCount) -> None:
        self._inner = con
        self._count = count
        self._in_tx = False
        self._wrote = False

    def execute(self, sql: str, *args: Any) -> Any:
        count = self._count
        head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        count.statements += 1
        count.log.append(" ".join(sql.split())[:80])
        if head == "BEGIN":
            self._in_tx, self._wrote = True, False
        elif head in ("COMMIT", "ROLLBACK"):
            count.transactions += head == "COMMIT"
            count.commits += head == "COMMIT" and self._wrote
            self._in_tx = False
        elif head not in _READS:
            count.writes += 1
            self._wrote = True
            if not self._in_tx:
                count.commits += 1
        return self._inner.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Database:
    """A DuckDB connection with the settings, locking and lifecycle thinkray needs.

    Contract:
    - ``execute``/``transaction`` may be called from any thread; calls are serialized
      by an internal re-entrant lock (DuckDB connections are not thread-safe).
    - ``transaction()`` commits on normal exit and rolls back on exception; nested
      use joins the outer transaction.
    - ``close()`` checkpoints so that no ``.wal`` file is left behind, and is
      idempotent. Any use after close raises :class:`DatabaseClosedError`.
    - ``rollbacks`` counts transactions that did not commit: a store that keeps what
      it wrote in memory compares it to learn that its last writes may not have landed.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = MEMORY_PATH,
        *,
        lock_retry_seconds: float = 2.0,
        fresh: bool = False,
        versions: Mapping[str, int] | None = None,
    ) -> None:
        """``fresh``: the caller just made the file as a copy of the blank one (see
        :attr:`fresh`); ``versions``: the components' schema versions, when the caller
        knows them (the blank's), so that no statement reads them."""
        self.path = str(path)
        self._fresh = fresh
        # Tables a probe found empty (see known_empty): forgotten with the first write.
        self._empty: frozenset[str] = frozenset()
        self._lock = threading.RLock()
        self._depth = 0
        self.rollbacks = 0
        # What stores of one component keep in memory about this file, shared by every
        # store on this connection (see DuckDBSessionStore).
        self.state: dict[str, Any] = {}
        self._migrated: set[str] = set()
        # The components' versions, once read (config's schema_version.* keys)
        self._versions: dict[str, int] | None = None if versions is None else dict(versions)
        # Whether they were read from an older build's schema_version table (moved to
        # config by the next migration that writes)
        self._legacy = False
        # Work a component left in memory to write at close (see before_close).
        self._before_close: dict[str, Callable[[], None]] = {}
        # Components migrated inside the open transaction: a rollback takes their
        # tables with it, so they are forgotten and migrated again on next use.
        self._migrated_in_tx: set[str] = set()
        # Told how the open outermost transaction ended (see after_transaction).
        self._tx_end: list[Callable[[bool], None]] = []
        if self.path != MEMORY_PATH:
            parent = Path(self.path).parent
            if not parent.exists():
                parent.mkdir(parents=True, exist_ok=True)
        self._held = self._attach(lock_retry_seconds)
        self._con: duckdb.DuckDBPyConnection | None = self._held.cursor

    def _attach(self, lock_retry_seconds: float) -> _instance.Attached:
        """The file attached to the process's DuckDB instance (see
        :mod:`~thinkray.storage.instance`), with a cursor of this database's own."""
        # DuckDB's file lock lingers briefly after the previous owner was killed
        # (~50 ms after ray.kill): retry instead of failing a wake.
        deadline = time.monotonic() + lock_retry_seconds
        delay = 0.01
        while True:
            try:
                return _instance.attach(self.path)
            except duckdb.FatalException:
                _instance.invalidated()
                raise
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower():
                    raise file_error(self.path, exc) from exc
                if time.monotonic() >= deadline:
                    raise DatabaseLockedError(
                        f"database {self.path!r} is held by another process: {exc}"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.2)

    # -- lifecycle -----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._con is None

    def before_close(self, component: str, write: Callable[[], None]) -> None:
        """Have :meth:`close` call ``write`` first (once per component: a later call
        replaces it). For work a component batches in memory and can also recover
        without (the search index's pending documents): if ``write`` raises, the
        close goes on and the error is logged."""
        self._before_close[component] = write

    def close(self) -> None:
        """Checkpoint and close. Leaves no ``.wal`` file. Idempotent."""
        with self._lock:
            if self._con is None:
                return
            # A hook may register another (the journal's fold feeds the search index's
            # batch): run them until none is left, each component once per round.
            while self._before_close:
                hooks, self._before_close = list(self._before_close.values()), {}
                for write in hooks:
                    try:
                        write()
                    except Exception:  # noqa: BLE001 - the component recovers on next open
                        _log.warning("a write before closing %s failed", self.path, exc_info=True)
            con, self._con = self._con, None
            try:
                _checkpoint(con)
            finally:
                _instance.detach(self._held)

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def fresh(self) -> bool:
        """Whether every table in the file is known to be empty without a query: the
        opener made the file as a copy of the blank one (:mod:`~thinkray.storage.blank`)
        and nothing was written since. Any transaction, a statement other than a
        ``SELECT``, or a write that goes another way (:meth:`wrote`: the session store's
        journal) ends it. Readers answer from it instead of querying, so a brand-new
        agent's wake (its recovery reads: interrupted fibers, jobs, tool calls, open
        generations) runs no statement."""
        return self._fresh

    def known_empty(self, table: str) -> bool:
        """Whether ``table`` is known to hold no row without a query: the file is
        :attr:`fresh`, or a probe found it empty (:meth:`note_empty`) and nothing was
        written since (what ends :attr:`fresh` ends this too). An agent's wake counts
        the tables its recovery reads in the session store's first statement, so a
        wake with nothing to recover reads none of them."""
        return self._fresh or table in self._empty

    def note_empty(self, tables: Iterable[str]) -> None:
        """A query outside any transaction just found ``tables`` empty (see
        :meth:`known_empty`); inside one it says nothing (a rollback may undo it)."""
        if not self._depth:
            self._empty = self._empty.union(tables)

    def wrote(self) -> None:
        """Say that rows of this file were written another way (the session store's
        journal, folded later): it is no longer :attr:`fresh`."""
        self._may_write()

    def _may_write(self) -> None:
        """Something may write from now on: no table is known empty any more."""
        self._fresh = False
        self._empty = frozenset()

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (on any thread: callers hold :attr:`lock`)."""
        return self._depth > 0

    @property
    def lock(self) -> threading.RLock:
        """The lock every use of the connection holds (re-entrant): a component that
        keeps state about the file in memory changes it under this lock too."""
        return self._lock

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The raw DuckDB connection (callers hold the lock: use :meth:`execute` or
        :meth:`transaction`).

        Raises:
            DatabaseClosedError: the database is closed.
        """
        con = self._con
        if con is None:
            raise DatabaseClosedError(f"database {self.path!r} is closed")
        return con

    @contextmanager
    def counting(self) -> Iterator[StatementCount]:
        """Count the statements and commits sent to DuckDB while the block runs (a
        seam for tests and benchmarks: a regression in the write path shows up as a
        count, without timing anything)."""
        with self._lock:
            inner = self.con
            count = StatementCount()
            self._con = cast(duckdb.DuckDBPyConnection, _CountingConnection(inner, count))
        try:
            yield count
        finally:
            with self._lock:
                if self._con is not None:
                    self._con = inner

    # -- queries -------------------------------------------------------------------

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> Any:
        """Run one statement under the lock (in autocommit, unless a
        :meth:`transaction` is open) and return the DuckDB cursor.

        Raises:
            DatabaseClosedError: the database is closed.
        """
        with self._lock, self._file_errors():
            if (self._fresh or self._empty) and sql.lstrip()[:6].upper() != "SELECT":
                self._may_write()
            if params is None:
                return self.con.execute(sql)
            return self.con.execute(sql, params)

    def fetchall(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """:meth:`execute` a query and return all its rows."""
        with self._lock, self._file_errors():
            return self.execute(sql, params).fetchall()

    def fetchone(self, sql: str, params: Sequence[Any] | None = None) -> tuple[Any, ...] | None:
        """:meth:`execute` a query and return its first row, or ``None``."""
        with self._lock, self._file_errors():
            return self.execute(sql, params).fetchone()

    @contextmanager
    def _file_errors(self) -> Iterator[None]:
        """DuckDB's I/O errors on this file (a damaged block read lazily, long after
        the open) as :class:`DatabaseFileError`."""
        try:
            yield
        except duckdb.IOException as exc:
            raise file_error(self.path, exc) from exc
        except duckdb.FatalException:
            _instance.invalidated()  # DuckDB's rule: the whole instance is unusable now
            raise

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One transaction; nested calls join the outermost one."""
        with self._lock:
            con = self.con
            self._may_write()
            if self._depth:
                self._depth += 1
                try:
                    yield con
                finally:
                    self._depth -= 1
                return
            con.execute("BEGIN TRANSACTION")
            self._depth = 1
            try:
                yield con
            except BaseException as exc:
                self._depth = 0
                self.rollbacks += 1
                self._forget_migrations()
                try:
                    con.execute("ROLLBACK")
                finally:
                    self._ended(False)
                _check_fatal(exc)
                if isinstance(exc, duckdb.IOException):
                    raise file_error(self.path, exc) from exc
                raise
            self._depth = 0
            try:
                con.execute("COMMIT")
            except BaseException as exc:
                self.rollbacks += 1
                self._forget_migrations()
                self._ended(False)
                _check_fatal(exc)
                if isinstance(exc, duckdb.IOException):
                    raise file_error(self.path, exc) from exc
                raise
            self._migrated_in_tx.clear()
            self._ended(True)

    def after_transaction(self, told: Callable[[bool], None]) -> None:
        """Call ``told(committed)`` once the open outermost transaction has ended
        (after its ``COMMIT`` succeeded, or after it rolled back). For a component that
        keeps what it wrote in memory until the file really has it (the session store's
        journal). Outside a transaction: raises ``RuntimeError``."""
        if not self._depth:
            raise RuntimeError("after_transaction needs an open transaction")
        self._tx_end.append(told)

    def _ended(self, committed: bool) -> None:
        hooks, self._tx_end = self._tx_end, []
        for told in hooks:
            told(committed)

    def _forget_migrations(self) -> None:
        self._migrated -= self._migrated_in_tx
        self._migrated_in_tx.clear()
        self._versions = None

    def has_component(self, component: str) -> bool:
        """Whether ``component``'s tables were ever made in this file (no statement
        once the versions were read)."""
        with self._lock, self._file_errors():
            return component in self._schema_versions()

    def schema_versions(self) -> dict[str, int]:
        """Every component's schema version in this file (component → version; a
        copy). Read once per connection, like :meth:`migrate` does."""
        with self._lock, self._file_errors():
            return dict(self._schema_versions())

    def _schema_versions(self) -> dict[str, int]:
        """Every component's version, read once per connection (one query for all the
        stores a wake opens, instead of two statements each)."""
        if self._versions is None:
            con = self.con
            if self._depth:  # a failed statement would spoil the open transaction
                con.execute(CONFIG_TABLE)
                rows = con.execute(_READ_VERSIONS).fetchall()
            else:
                try:  # every wake reads it; only a new file lacks it (one statement less)
                    rows = con.execute(_READ_VERSIONS).fetchall()
                except duckdb.CatalogException:
                    con.execute(CONFIG_TABLE)
                    rows = []
            versions = {key[len(VERSION_KEY) :]: int(bytes(value)) for key, value in rows}
            # None in config: a file no component was migrated in yet, or one an older
            # build wrote (its versions in a table of their own).
            legacy = None if versions else self._legacy_versions(con)
            self._legacy = legacy is not None
            self._versions = versions if legacy is None else legacy
        return self._versions

    def _legacy_versions(self, con: duckdb.DuckDBPyConnection) -> dict[str, int] | None:
        """The versions in the ``schema_version`` table of an older build (None: the
        file has no such table)."""
        if self._depth:  # a failed statement would spoil the open transaction
            found = con.execute(_HAS_LEGACY).fetchone()
            if not (found and found[0]):
                return None
        else:
            try:  # cheaper than a look at the catalog, which lists every attached file
                return dict(con.execute(_READ_LEGACY).fetchall())
            except duckdb.CatalogException:
                return None
        return dict(con.execute(_READ_LEGACY).fetchall())

    # -- migrations ----------------------------------------------------------------

    def migrate(self, component: str, migrations: Sequence[Migration]) -> int:
        """Bring ``component``'s tables to the newest version. Returns that version.

        Idempotent and cheap after the first call on this connection. Inside an open
        transaction the migration is part of it: if that transaction rolls back, the
        next call migrates again (stores call this before each use for that reason).
        The version goes to ``config`` in the same transaction; a file an older build
        wrote has its ``schema_version`` table moved there and dropped then too.
        """
        if component in self._migrated:
            return migrations[-1].version if migrations else 0
        with self._lock, self._file_errors():
            versions = self._schema_versions()
            current = versions.get(component, 0)
            pending = [m for m in migrations if m.version > current]
            if pending:
                with self.transaction() as con:
                    for migration in sorted(pending, key=lambda m: m.version):
                        migration.apply(con)
                    newest = max(m.version for m in pending)
                    if self._legacy:  # the older build's versions: into config, in place
                        con.execute(_MOVE_LEGACY)
                        con.execute(f"DROP TABLE {_LEGACY_TABLE}")
                        self._legacy = False  # a rollback forgets it with the versions
                    key, value = VERSION_KEY + component, str(newest).encode()
                    if component in versions:
                        con.execute("UPDATE config SET value = ? WHERE key = ?", [value, key])
                    else:
                        con.execute("INSERT INTO config VALUES (?, ?)", [key, value])
                    versions[component] = newest  # a rollback forgets every version read
                current = newest
            self._migrated.add(component)
            if self._depth:
                self._migrated_in_tx.add(component)
            return current


class MigratedStore:
    """Base of the stores that keep one component's tables in a shared :class:`Database`.

    Subclasses set ``component`` and ``migrations``. The tables are made on first use,
    which may happen inside a transaction; if that transaction rolls back it takes them
    along, so :attr:`db` migrates again before each use (a dict lookup once done)."""

    component: ClassVar[str]
    migrations: ClassVar[Sequence[Migration]]

    def __init__(self, db: Database) -> None:
        self._db = db
        db.migrate(self.component, self.migrations)

    @property
    def db(self) -> Database:
        """The database, with this store's tables."""
        return self._migrated()

    def _migrated(self) -> Database:
        """The database, with this store's tables (what :attr:`db` is unless a
        subclass adds to it)."""
        self._db.migrate(self.component, self.migrations)
        return self._db

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction on the database; joins one that is open."""
        with self.db.transaction():
            yield
