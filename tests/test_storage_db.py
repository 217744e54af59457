"""thinkray.storage.db.Database: the file settings, transactions, migrations and the file lock."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
from thinkray.storage.db import (
    BLOCK_SIZE,
    Database,
    DatabaseClosedError,
    DatabaseLockedError,
    Migration,
)
from thinkray.storage.types import StorageError


def _create_t(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE TABLE t (k VARCHAR, v INTEGER)")


def _table_names(db: Database) -> set[str]:
    return {
        name
        for (name,) in db.fetchall(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
        )
    }


def test_no_wal_after_close(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    db = Database(path)
    db.migrate("t", [Migration(1, _create_t)])
    with db.transaction() as con:
        con.execute("INSERT INTO t SELECT 'k' || i, i FROM range(1000) r(i)")
    assert os.path.exists(f"{path}.wal")  # the writes went to the WAL first
    db.close()
    assert not os.path.exists(f"{path}.wal")
    again = Database(path)
    assert again.fetchone("SELECT count(*) FROM t") == (1000,)
    again.close()


def test_empty_file_is_small(tmp_path: Path) -> None:
    path = tmp_path / "empty.duckdb"
    Database(path).close()
    assert os.path.getsize(path) <= 64 * 1024
    db = Database(path)
    db.migrate("t", [Migration(1, _create_t)])
    db.close()
    assert os.path.getsize(path) <= 64 * 1024


def test_block_size(tmp_path: Path) -> None:
    db = Database(tmp_path / "b.duckdb")
    assert db.fetchone(
        "SELECT block_size FROM pragma_database_size() WHERE database_name = current_database()"
    ) == (BLOCK_SIZE,)
    assert BLOCK_SIZE == 16384
    assert db.fetchone("SELECT current_setting('threads')") == (1,)
    db.close()


def test_creates_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "x.duckdb"
    Database(path).close()
    assert path.exists()


def test_transaction_commits() -> None:
    with Database() as db:
        db.migrate("t", [Migration(1, _create_t)])
        with db.transaction() as con:
            con.execute("INSERT INTO t VALUES ('a', 1)")
            con.execute("INSERT INTO t VALUES ('b', 2)")
        assert db.fetchall("SELECT k FROM t ORDER BY k") == [("a",), ("b",)]


def test_transaction_rolls_back_on_exception() -> None:
    with Database() as db:
        db.migrate("t", [Migration(1, _create_t)])
        db.execute("INSERT INTO t VALUES ('kept', 0)")
        with pytest.raises(RuntimeError), db.transaction() as con:
            con.execute("INSERT INTO t VALUES ('lost', 1)")
            raise RuntimeError("boom")
        assert db.fetchall("SELECT k FROM t") == [("kept",)]
        # A failing statement rolls back the statements before it.
        with pytest.raises(duckdb.Error), db.transaction() as con:
            con.execute("INSERT INTO t VALUES ('lost', 2)")
            con.execute("INSERT INTO missing_table VALUES (1)")
        assert db.fetchall("SELECT k FROM t") == [("kept",)]
        # And the connection is usable afterwards.
        with db.transaction() as con:
            con.execute("INSERT INTO t VALUES ('after', 3)")
        assert db.fetchone("SELECT count(*) FROM t") == (2,)


def test_nested_transaction_joins_the_outer_one() -> None:
    with Database() as db:
        db.migrate("t", [Migration(1, _create_t)])
        with db.transaction() as outer:
            outer.execute("INSERT INTO t VALUES ('outer', 1)")
            with db.transaction() as inner:
                assert inner is outer
                inner.execute("INSERT INTO t VALUES ('inner', 2)")
        assert db.fetchone("SELECT count(*) FROM t") == (2,)

        # An exception escaping the outer block undoes the inner block's writes too.
        with pytest.raises(ValueError), db.transaction() as outer:
            with db.transaction() as inner:
                inner.execute("INSERT INTO t VALUES ('inner2', 3)")
            outer.execute("INSERT INTO t VALUES ('outer2', 4)")
            raise ValueError("undo both")
        assert db.fetchone("SELECT count(*) FROM t") == (2,)

        # An exception in the inner block, propagating, rolls back the whole thing.
        with pytest.raises(ValueError), db.transaction() as outer:
            outer.execute("INSERT INTO t VALUES ('outer3', 5)")
            with db.transaction():
                raise ValueError("inner failure")
        assert db.fetchone("SELECT count(*) FROM t") == (2,)


def test_migrate_is_idempotent(tmp_path: Path) -> None:
    calls: list[int] = []

    def v1(con: duckdb.DuckDBPyConnection) -> None:
        calls.append(1)
        _create_t(con)

    path = tmp_path / "m.duckdb"
    db = Database(path)
    assert db.migrate("t", [Migration(1, v1)]) == 1
    assert db.migrate("t", [Migration(1, v1)]) == 1
    db.close()
    db = Database(path)
    assert db.migrate("t", [Migration(1, v1)]) == 1
    assert calls == [1]
    assert db.schema_versions() == {"t": 1}
    # the file's key/value table holds it (see the module); no table of its own
    assert db.fetchall("SELECT key, value FROM config WHERE key LIKE 'schema_version.%'") == [
        ("schema_version.t", b"1")
    ]
    assert _table_names(db) == {"config", "t"}
    db.close()


def test_migrate_upgrades_an_older_file(tmp_path: Path) -> None:
    applied: list[int] = []

    def v1(con: duckdb.DuckDBPyConnection) -> None:
        applied.append(1)
        _create_t(con)

    def v2(con: duckdb.DuckDBPyConnection) -> None:
        applied.append(2)
        con.execute("ALTER TABLE t ADD COLUMN extra VARCHAR")

    def v3(con: duckdb.DuckDBPyConnection) -> None:
        applied.append(3)
        con.execute("UPDATE t SET extra = 'migrated'")

    path = tmp_path / "up.duckdb"
    db = Database(path)
    db.migrate("t", [Migration(1, v1)])
    db.execute("INSERT INTO t VALUES ('old', 1)")
    db.close()

    db = Database(path)
    # Listed out of order on purpose: migrations apply by version.
    assert db.migrate("t", [Migration(3, v3), Migration(1, v1), Migration(2, v2)]) == 3
    assert applied == [1, 2, 3]
    assert db.fetchall("SELECT k, v, extra FROM t") == [("old", 1, "migrated")]
    assert db.schema_versions() == {"t": 3}
    db.close()
    with Database(path) as again:  # the file has it, not only memory
        assert again.schema_versions() == {"t": 3}


def test_components_are_versioned_independently(tmp_path: Path) -> None:
    a1 = Migration(1, lambda c: c.execute("CREATE TABLE a (x INTEGER)"))
    b1 = Migration(1, lambda c: c.execute("CREATE TABLE b (x INTEGER)"))
    b2 = Migration(2, lambda c: c.execute("ALTER TABLE b ADD COLUMN y INTEGER"))
    path = tmp_path / "ab.duckdb"
    with Database(path) as db:
        assert db.migrate("a", [a1]) == 1
        assert db.migrate("b", [b1]) == 1
    with Database(path) as db:
        assert db.migrate("b", [b1, b2]) == 2
        assert db.migrate("a", [a1]) == 1
        assert db.schema_versions() == {"a": 1, "b": 2}
    with Database(path) as db:
        assert db.schema_versions() == {"a": 1, "b": 2}


def test_failed_migration_leaves_the_old_version(tmp_path: Path) -> None:
    path = tmp_path / "f.duckdb"
    db = Database(path)
    db.migrate("t", [Migration(1, _create_t)])
    db.close()

    def broken(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("ALTER TABLE t ADD COLUMN y INTEGER")
        raise RuntimeError("bad migration")

    db = Database(path)
    with pytest.raises(RuntimeError):
        db.migrate("t", [Migration(1, _create_t), Migration(2, broken)])
    assert db.schema_versions() == {"t": 1}
    assert [c for (c,) in db.fetchall("SELECT column_name FROM duckdb_columns() WHERE table_name = 't' AND database_name = current_database()")] == ["k", "v"]  # fmt: skip
    db.close()


def test_a_migration_rolled_back_with_its_transaction_is_redone() -> None:
    """A store's tables are made on first use, which may be inside a transaction that
    then rolls back: the next migrate must make them again, not trust its memory."""
    with Database() as db:
        with pytest.raises(RuntimeError), db.transaction():
            assert db.migrate("t", [Migration(1, _create_t)]) == 1
            db.execute("INSERT INTO t VALUES ('lost', 1)")
            raise RuntimeError("boom")
        tables = "SELECT count(*) FROM information_schema.tables WHERE table_name = 't' AND table_catalog = current_database()"
        assert db.fetchone(tables) == (0,)
        assert db.migrate("t", [Migration(1, _create_t)]) == 1
        db.execute("INSERT INTO t VALUES ('kept', 2)")
        with db.transaction():  # committed: remembered, not redone
            db.migrate("u", [Migration(1, lambda con: con.execute("CREATE TABLE u (x INT)"))])
        assert db.fetchone("SELECT count(*) FROM t") == (1,)
        assert db.schema_versions() == {"t": 1, "u": 1}


def test_a_rolled_back_migration_leaves_the_versions_as_they_were(tmp_path: Path) -> None:
    """A migration that rolls back with the caller's transaction (a new component, and
    a new version of one the file has) leaves every version as it was: in memory, and
    in the file."""
    path = tmp_path / "r.duckdb"
    with Database(path) as db:
        db.migrate("t", [Migration(1, _create_t)])
    t2 = Migration(2, lambda con: con.execute("ALTER TABLE t ADD COLUMN y INTEGER"))
    u1 = Migration(1, lambda con: con.execute("CREATE TABLE u (x INTEGER)"))
    with Database(path) as db:
        with pytest.raises(RuntimeError), db.transaction():
            assert db.migrate("t", [Migration(1, _create_t), t2]) == 2
            assert db.migrate("u", [u1]) == 1
            assert db.schema_versions() == {"t": 2, "u": 1}  # inside: what it will be
            raise RuntimeError("boom")
        assert db.schema_versions() == {"t": 1}
        assert not db.has_component("u")
        assert _table_names(db) == {"config", "t"}
    with Database(path) as db:
        assert db.schema_versions() == {"t": 1}
        assert db.migrate("t", [Migration(1, _create_t), t2]) == 2  # and it is redone
    with Database(path) as db:
        assert db.schema_versions() == {"t": 2}


def test_schema_versions_is_a_copy() -> None:
    with Database() as db:
        db.migrate("t", [Migration(1, _create_t)])
        versions = db.schema_versions()
        versions["t"] = 99
        versions["x"] = 1
        assert db.schema_versions() == {"t": 1}
        assert not db.has_component("x")


def _legacy_file(path: Path, *, config: bool) -> None:
    """A file as an older build wrote it: the versions in a ``schema_version`` table of
    their own (and, with ``config``, the session store's key/value table beside it)."""
    con = duckdb.connect(str(path))
    try:
        con.execute("CREATE TABLE schema_version (component VARCHAR, version INTEGER)")
        con.execute("INSERT INTO schema_version VALUES ('t', 1), ('u', 2)")
        _create_t(con)
        con.execute("INSERT INTO t VALUES ('old', 1)")
        con.execute("CREATE TABLE u (x INTEGER, y INTEGER)")
        if config:
            con.execute("CREATE TABLE config (key VARCHAR, value BLOB)")
            con.execute("INSERT INTO config VALUES ('theirs', 'kept'::BLOB)")
    finally:
        con.close()


@pytest.mark.parametrize("config", [False, True])
@pytest.mark.parametrize("in_transaction", [False, True])
def test_an_older_builds_versions_move_to_config(
    tmp_path: Path, config: bool, in_transaction: bool
) -> None:
    """A file an older build wrote keeps its versions in a ``schema_version`` table:
    they are read from it, an open that migrates nothing leaves it be, and the first
    migration that writes moves every row into ``config`` and drops the table in its
    transaction; the versions and the file's other ``config`` rows are kept."""
    path = tmp_path / "old.duckdb"
    _legacy_file(path, config=config)
    t1 = Migration(1, _create_t)
    t2 = Migration(2, lambda con: con.execute("ALTER TABLE t ADD COLUMN extra VARCHAR"))
    with Database(path) as db:
        assert db.schema_versions() == {"t": 1, "u": 2}
        assert db.has_component("u") and not db.has_component("v")
        assert db.migrate("t", [t1]) == 1  # nothing to do: nothing written
        assert "schema_version" in _table_names(db)
    with Database(path) as db:
        if in_transaction:  # the versions are first read inside the caller's transaction
            with db.transaction():
                assert db.migrate("t", [t1, t2]) == 2
        else:
            assert db.migrate("t", [t1, t2]) == 2
        assert db.schema_versions() == {"t": 2, "u": 2}
        assert "schema_version" not in _table_names(db)
    with Database(path) as db:
        assert db.schema_versions() == {"t": 2, "u": 2}
        assert sorted(db.fetchall("SELECT key, value FROM config")) == [
            ("schema_version.t", b"2"),
            ("schema_version.u", b"2"),
            *([("theirs", b"kept")] if config else []),
        ]
        assert db.fetchall("SELECT k, v, extra FROM t") == [("old", 1, None)]
        assert _table_names(db) == {"config", "t", "u"}


def test_an_older_builds_versions_stay_if_the_migration_rolls_back(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    _legacy_file(path, config=True)

    def broken(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("ALTER TABLE t ADD COLUMN y INTEGER")
        raise RuntimeError("bad migration")

    with Database(path) as db:
        with pytest.raises(RuntimeError):
            db.migrate("t", [Migration(1, _create_t), Migration(2, broken)])
        assert db.schema_versions() == {"t": 1, "u": 2}
        assert "schema_version" in _table_names(db)
        assert db.fetchall("SELECT key FROM config") == [("theirs",)]
        # the next migration that writes moves them
        v1 = Migration(1, lambda con: con.execute("CREATE TABLE v (x INTEGER)"))
        assert db.migrate("v", [v1]) == 1
        assert db.schema_versions() == {"t": 1, "u": 2, "v": 1}
        assert "schema_version" not in _table_names(db)
    with Database(path) as db:
        assert db.schema_versions() == {"t": 1, "u": 2, "v": 1}


def test_use_after_close(tmp_path: Path) -> None:
    db = Database(tmp_path / "c.duckdb")
    db.close()
    db.close()  # idempotent
    assert db.closed
    with pytest.raises(DatabaseClosedError):
        db.execute("SELECT 1")
    with pytest.raises(DatabaseClosedError):
        db.fetchall("SELECT 1")
    with pytest.raises(DatabaseClosedError), db.transaction():
        pass
    with pytest.raises(DatabaseClosedError):
        db.migrate("x", [Migration(1, _create_t)])
    assert issubclass(DatabaseClosedError, StorageError)


HOLDER = textwrap.dedent(
    """
    import sys, time, duckdb
    con = duckdb.connect(sys.argv[1])
    print("held", flush=True)
    hold = float(sys.argv[2])
    if hold < 0:
        sys.stdin.readline()
    else:
        time.sleep(hold)
    con.close()
    """
)


def _hold(path: Path, seconds: float) -> subprocess.Popen[str]:
    """DuckDB's lock is per process: hold the file from another one."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_locked_file_raises_after_the_retry_window(tmp_path: Path) -> None:
    path = tmp_path / "locked.duckdb"
    Database(path).close()
    proc = _hold(path, -1)
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseLockedError):
            Database(path, lock_retry_seconds=0.3)
        assert time.monotonic() - started >= 0.3
        assert issubclass(DatabaseLockedError, StorageError)
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=10)
    Database(path).close()  # released


def test_lock_released_within_the_window_is_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "brief.duckdb"
    Database(path).close()
    proc = _hold(path, 0.3)
    try:
        db = Database(path, lock_retry_seconds=10)
        db.close()
    finally:
        proc.wait(timeout=10)


class _RefusingCheckpoints:
    """A cursor whose first ``refusals`` CHECKPOINTs DuckDB refuses, as it does while
    another transaction commits to the file (a plain checkpoint only tries its lock)."""

    def __init__(self, inner: Any, refusals: int) -> None:
        self._inner = inner
        self.refusals = refusals
        self.attempts = 0

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "CHECKPOINT":
            self.attempts += 1
            if self.refusals:
                self.refusals -= 1
                raise duckdb.TransactionException(
                    "TransactionContext Error: Cannot CHECKPOINT: there are other write "
                    "transactions active. Try using FORCE CHECKPOINT to wait until all active "
                    "transactions are finished"
                )
        return self._inner.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_close_retries_a_checkpoint_refused_for_a_moment(tmp_path):
    """Agents of one host close files of one DuckDB instance from several threads: a
    close whose checkpoint DuckDB refuses for a moment tries again, and leaves the file
    whole, with no WAL (an object-store root ships the file alone)."""
    path = tmp_path / "a.duckdb"
    db = Database(path)
    db.execute("CREATE TABLE t (x INTEGER)")
    db.execute("INSERT INTO t VALUES (1)")
    refusing = _RefusingCheckpoints(db._con, refusals=3)
    db._con = refusing  # type: ignore[assignment]
    db.close()
    assert refusing.attempts == 4
    assert not Path(f"{path}.wal").exists()
    with Database(path) as again:
        assert again.fetchall("SELECT x FROM t") == [(1,)]


def test_a_checkpoint_refused_for_good_fails_the_close_and_loses_nothing(tmp_path, monkeypatch):
    from thinkray.storage import db as db_module

    monkeypatch.setattr(db_module, "CHECKPOINT_RETRIES", (0.0, 0.0))
    path = tmp_path / "b.duckdb"
    db = Database(path)
    db.execute("CREATE TABLE t (x INTEGER)")
    db.execute("INSERT INTO t VALUES (2)")
    db._con = _RefusingCheckpoints(db._con, refusals=10)  # type: ignore[assignment]
    with pytest.raises(duckdb.TransactionException):
        db.close()
    assert db.closed
    with Database(path) as again:  # the file was let go of; its WAL is replayed
        assert again.fetchall("SELECT x FROM t") == [(2,)]
