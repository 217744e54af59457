"""Every file is ATTACHed to the process's one DuckDB instance (issue 22: a wake opened
a DuckDB instance of its own, ~14 ms of CPU and a buffer pool per agent). What must
hold: each Database still sees only its own file, two Databases on one path share it
until the last lets go, nothing stays attached after a close (the lock is released
for the next process), ``:memory:`` stays private, and the instance is shared."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from thinkray.storage import instance
from thinkray.storage.db import Database
from thinkray.storage.session_store import DuckDBSessionStore


def _attached() -> set[str]:
    con = instance._instance().con  # noqa: SLF001
    with instance._instance().lock:  # noqa: SLF001
        rows = con.execute("SELECT path FROM duckdb_databases() WHERE path IS NOT NULL").fetchall()
    return {str(Path(p).resolve()) for (p,) in rows}


def _opens_in_another_process(path: Path) -> bool:
    code = "import sys, duckdb; duckdb.connect(sys.argv[1]).close()"
    return subprocess.run([sys.executable, "-c", code, str(path)]).returncode == 0


def test_each_database_sees_only_its_own_file(tmp_path: Path) -> None:
    one, two = Database(tmp_path / "one.duckdb"), Database(tmp_path / "two.duckdb")
    try:
        one.execute("CREATE TABLE t (x INTEGER)")
        one.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(duckdb.CatalogException):
            two.execute("SELECT * FROM t")
        two.execute("CREATE TABLE t (x INTEGER)")  # the same name in another file
        with two.transaction() as con:
            con.execute("INSERT INTO t VALUES (2)")
        assert one.fetchall("SELECT x FROM t") == [(1,)]
        assert two.fetchall("SELECT x FROM t") == [(2,)]
        assert instance._instance().con is not None  # noqa: SLF001
    finally:
        one.close()
        two.close()


def test_two_databases_on_one_path_share_it_until_the_last_closes(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    first, second = Database(path), Database(path)
    first.execute("CREATE TABLE t (x INTEGER)")
    first.execute("INSERT INTO t VALUES (1)")
    assert second.fetchall("SELECT x FROM t") == [(1,)]
    first.close()
    assert second.fetchall("SELECT x FROM t") == [(1,)]
    assert str(path.resolve()) in _attached()
    assert not _opens_in_another_process(path)  # still held by this process
    second.close()
    assert str(path.resolve()) not in _attached()
    assert not Path(f"{path}.wal").exists()  # checkpointed when let go
    assert _opens_in_another_process(path)


def test_a_closed_store_leaves_nothing_attached(tmp_path: Path) -> None:
    before = _attached()
    for i in range(5):
        store = DuckDBSessionStore(tmp_path / f"s{i}.duckdb")
        store.create_session()
        store.close()
    assert _attached() == before


def test_memory_databases_are_private(tmp_path: Path) -> None:
    a, b = DuckDBSessionStore(":memory:"), DuckDBSessionStore(":memory:")
    try:
        a.create_session(session_id="x")
        assert [s.id for s in b.list_sessions()] == []
    finally:
        a.close()
        b.close()


def test_a_file_that_is_not_a_database_attaches_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bad.duckdb"
    path.write_bytes(b"not a database" * 1000)
    before = _attached()
    with pytest.raises(Exception, match="corrupt"):
        Database(path)
    assert _attached() == before
    path.unlink()
    Database(path).close()  # the name is free again
