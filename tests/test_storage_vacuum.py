"""A small file is vacuumed as it is closed (thinkray.storage.vacuum, issue 23): no free
block or half-empty metadata block is left behind, nothing is lost, and nothing goes
wrong around it (a second holder, a failure, a crash's leftover, a symlink, a format)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import duckdb
import pytest
from thinkray.storage import vacuum
from thinkray.storage.db import Database
from thinkray.storage.removal import remove_agent
from thinkray.storage.session_store import DuckDBSessionStore


def _talk(path: Path, turns: int, sid: str | None = None) -> str:
    """Open the store at ``path``, add ``turns`` user/assistant pairs to one session
    (created if ``sid`` is None) and close it: one wake/hibernate cycle."""
    store = DuckDBSessionStore(path)
    try:
        if sid is None:
            sid = store.create_session("chat").id
        for _ in range(turns):
            n = len(store.get_history(sid))
            for role in ("user", "assistant"):
                store.append_message(
                    sid,
                    {"id": f"m{n}", "role": role, "parts": [{"type": "text", "text": "hi " * 20}]},
                )
                n += 1
        store.add_usage(sid, {"input": 10, "output": 5})
    finally:
        store.close()
    return sid


def _blocks(path: Path) -> tuple[int, int, int]:
    """(total blocks, free blocks, metadata blocks) of the closed file at ``path``."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        total, free = con.execute(
            "SELECT total_blocks, free_blocks FROM pragma_database_size()"
        ).fetchone()
        name = con.execute("SELECT current_database()").fetchone()[0]
        metadata = con.execute(f"SELECT count(*) FROM pragma_metadata_info('{name}')").fetchone()
        return total, free, metadata[0]
    finally:
        con.close()


def _contents(path: Path) -> dict[str, Any]:
    """Every table's rows (sorted) and the catalog: columns, constraints, indexes."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        out: dict[str, Any] = {}
        for (table,) in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall():
            out[table] = sorted(con.execute(f'SELECT * FROM "{table}"').fetchall(), key=repr)
        out["columns"] = con.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default "
            "FROM duckdb_columns() ORDER BY table_name, column_index"
        ).fetchall()
        out["constraints"] = sorted(
            con.execute(
                "SELECT table_name, constraint_type, constraint_column_names "
                "FROM duckdb_constraints()"
            ).fetchall(),
            key=repr,
        )
        out["indexes"] = con.execute(
            "SELECT table_name, index_name, expressions FROM duckdb_indexes() ORDER BY 2"
        ).fetchall()
        return out
    finally:
        con.close()


def _version(path: Path) -> str:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(
            "SELECT tags['storage_version'] FROM duckdb_databases() "
            "WHERE database_name = current_database()"
        ).fetchone()[0]
    finally:
        con.close()


def test_wake_and_close_cycles_leave_a_small_file_without_waste(tmp_path):
    """Without the vacuum every cycle's checkpoint left the blocks it replaced free and
    a second, mostly empty metadata block: the file grew with each cycle."""
    path = tmp_path / "agent.duckdb"
    sid = _talk(path, 5)
    sizes = [path.stat().st_size]
    for _ in range(5):
        _talk(path, 1, sid)
        total, free, metadata = _blocks(path)
        assert free == 0, (total, free, metadata)
        assert metadata == 1
        sizes.append(path.stat().st_size)
    assert sizes[-1] <= sizes[0] + 16384  # ten messages more need at most a block
    with DuckDBSessionStore(path) as store:
        assert len(store.get_history(sid)) == 20


def test_the_copy_keeps_every_row_constraint_and_index(tmp_path, monkeypatch):
    path = tmp_path / "agent.duckdb"
    db = Database(path)
    db.execute(
        "CREATE TABLE files (ns VARCHAR, path VARCHAR NOT NULL, body BLOB, "
        "n INTEGER DEFAULT 7, PRIMARY KEY (ns, path))"
    )
    db.execute("CREATE TABLE calls (id VARCHAR NOT NULL, status VARCHAR, t DOUBLE)")
    db.execute("CREATE INDEX calls_id ON calls (id)")
    db.execute("INSERT INTO files (ns, path, body) VALUES ('a', 'x', 'b'::BLOB), ('a', 'y', NULL)")
    db.execute("INSERT INTO calls SELECT 'c' || i, 'done', i FROM range(300) t(i)")
    db.close()
    monkeypatch.setattr(vacuum, "MIN_WASTED_BLOCKS", 0)  # every close copies the file
    for _ in range(3):
        db = Database(path)
        db.execute("UPDATE calls SET t = t + 1")
        db.execute("UPDATE files SET n = n + 1")
        before = _contents_of_open(db)
        inode = path.stat().st_ino
        db.close()
        assert path.stat().st_ino != inode  # replaced by its copy
        assert _contents(path) == before
    db = Database(path)
    with pytest.raises(duckdb.ConstraintException):  # the key still holds
        db.execute("INSERT INTO files (ns, path) VALUES ('a', 'x')")
    db.close()


def _contents_of_open(db: Database) -> dict[str, Any]:
    """:func:`_contents` of a file still open in this process: read from a copy."""
    db.execute("CHECKPOINT")
    snapshot = Path(f"{db.path}.snapshot")
    snapshot.write_bytes(Path(db.path).read_bytes())
    try:
        return _contents(snapshot)
    finally:
        snapshot.unlink()


def test_a_file_held_twice_is_vacuumed_only_by_its_last_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(vacuum, "MIN_WASTED_BLOCKS", 1)
    path = tmp_path / "agent.duckdb"
    db = Database(path)
    db.execute("CREATE TABLE t (v INTEGER)")
    db.execute("INSERT INTO t VALUES (1)")
    db.close()
    first, second = Database(path), Database(path)
    first.execute("INSERT INTO t VALUES (2)")
    inode = path.stat().st_ino
    first.close()
    assert path.stat().st_ino == inode  # not renamed under the other holder
    second.execute("INSERT INTO t VALUES (3)")
    second.close()
    assert path.stat().st_ino != inode
    db = Database(path)
    assert db.fetchall("SELECT v FROM t ORDER BY v") == [(1,), (2,), (3,)]
    db.close()


def test_a_file_above_the_limit_is_left_alone(tmp_path, monkeypatch):
    path = tmp_path / "agent.duckdb"
    sid = _talk(path, 5)
    monkeypatch.setattr(vacuum, "VACUUM_UP_TO_BYTES", 16384)
    inode = path.stat().st_ino
    _talk(path, 1, sid)
    assert path.stat().st_ino == inode
    assert _blocks(path)[1] > 0  # its free blocks stay, for later checkpoints to reuse


def test_a_failed_rename_keeps_the_original_whole_and_the_close_succeeds(tmp_path, monkeypatch):
    path = tmp_path / "agent.duckdb"
    sid = _talk(path, 3)

    def refuse(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(vacuum.os, "replace", refuse)
    inode = path.stat().st_ino
    _talk(path, 2, sid)
    assert path.stat().st_ino == inode
    assert not vacuum.scratch_path(path).exists()
    with DuckDBSessionStore(path) as store:
        assert len(store.get_history(sid)) == 10


def test_a_scratch_file_a_crash_left_is_replaced_and_removed_with_the_agent(tmp_path):
    root = tmp_path / "root"
    path = root / "ns" / "agent.duckdb"
    sid = _talk(path, 3)
    scratch = vacuum.scratch_path(path)
    scratch.write_bytes(b"half a copy, then the process died")
    _talk(path, 1, sid)
    assert not scratch.exists()
    with DuckDBSessionStore(path) as store:
        assert len(store.get_history(sid)) == 8
    scratch.write_bytes(b"another crash")
    Path(f"{scratch}.wal").write_bytes(b"and its log")
    remove_agent(root, "ns", "agent")
    assert not path.exists() and not scratch.exists()
    assert not Path(f"{scratch}.wal").exists()


def test_the_copy_keeps_the_files_permissions(tmp_path):
    path = tmp_path / "agent.duckdb"
    sid = _talk(path, 3)
    path.chmod(0o600)
    inode = path.stat().st_ino
    _talk(path, 2, sid)
    assert path.stat().st_ino != inode  # vacuumed
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_symlinked_file_stays_a_symlink(tmp_path):
    real = tmp_path / "data" / "agent.duckdb"
    sid = _talk(real, 3)
    link = tmp_path / "agent.duckdb"
    link.symlink_to(real)
    _talk(link, 2, sid)
    assert link.is_symlink()
    assert _blocks(real)[1] == 0
    with DuckDBSessionStore(link) as store:
        assert len(store.get_history(sid)) == 10


def test_new_files_use_the_compact_format_and_old_ones_keep_theirs(tmp_path):
    new = tmp_path / "new.duckdb"
    _talk(new, 2)
    assert _version(new) == "v1.5.0+"
    old = tmp_path / "old.duckdb"
    con = duckdb.connect()
    con.execute(f"ATTACH '{old}' AS o (BLOCK_SIZE 16384, STORAGE_VERSION 'v1.2.0')")
    con.close()
    sid = _talk(old, 3)
    _talk(old, 2, sid)
    assert _version(old) == "v1.2.0+"
    assert _blocks(old)[1] == 0
    with DuckDBSessionStore(old) as store:
        assert len(store.get_history(sid)) == 10


def test_a_new_session_after_five_turns_fits_in_six_blocks(tmp_path):
    """Issue 23's figure at the storage level: 5 user/assistant pairs in one session
    close into the header and six 16 KiB blocks (sessions, messages and config data
    and one metadata block, here with room to spare)."""
    path = tmp_path / "agent.duckdb"
    _talk(path, 5)
    total, free, metadata = _blocks(path)
    assert (free, metadata) == (0, 1)
    assert path.stat().st_size == 12288 + total * 16384
    assert os.path.getsize(path) <= 12288 + 6 * 16384
