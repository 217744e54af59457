"""A new agent file is a copy of a blank one (issue 22: a burst of new sessions on an
agent host queued ~8 ms of table creation each on one event loop). What must hold: the
copy has exactly the tables and versions the migrations would have made (and nothing
more: no versions table, no index, issue 23), opening it migrates nothing, an existing file is never overwritten, nothing half-written appears
under the file's name, and without hard links DuckDB creates the file as before."""

from __future__ import annotations

import os
from pathlib import Path

from thinkray.storage import blank
from thinkray.storage.db import BLOCK_SIZE, Database
from thinkray.storage.session_store import _NEW_FILE_COMPONENTS, DuckDBSessionStore


def _schema(db: Database) -> list[tuple[str, ...]]:
    rows = db.fetchall(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_catalog = current_database() ORDER BY table_name, ordinal_position"
    )
    indexes = db.fetchall(
        "SELECT index_name, table_name FROM duckdb_indexes() "
        "WHERE database_name = current_database() ORDER BY index_name"
    )
    versions = sorted(db.schema_versions().items())
    return [*rows, *indexes, *((c, str(v)) for c, v in versions)]


def test_a_copied_file_has_the_tables_the_migrations_make(tmp_path: Path) -> None:
    made = Database(tmp_path / "migrated.duckdb")
    try:
        for component, migrations in _NEW_FILE_COMPONENTS:
            made.migrate(component, migrations)
        expected = _schema(made)
    finally:
        made.close()
    assert blank.create(tmp_path / "copied.duckdb", _NEW_FILE_COMPONENTS)
    copied = Database(tmp_path / "copied.duckdb")
    try:
        assert _schema(copied) == expected
        assert {"sessions", "tool_calls", "fibers", "jobs"} <= {row[0] for row in expected}
    finally:
        copied.close()


def test_the_blank_is_small(tmp_path: Path) -> None:
    """Issue 23: every non-empty table costs the file a block, an index two. The blank
    keeps its versions in ``config`` (the file's key/value table, which every agent
    fills anyway): no ``schema_version`` table, no index (the tool-call ledger's comes
    once it is big), no other row."""
    path = tmp_path / "blank.duckdb"
    assert blank.create(path, _NEW_FILE_COMPONENTS)
    db = Database(path)
    try:
        here = "WHERE database_name = current_database()"
        tables = [t for (t,) in db.fetchall(f"SELECT table_name FROM duckdb_tables() {here}")]
        assert "schema_version" not in tables
        assert "config" in tables
        assert db.fetchall(f"SELECT index_name FROM duckdb_indexes() {here}") == []
        filled = [t for t in tables if db.fetchone(f"SELECT count(*) FROM {t}") != (0,)]
        assert filled == ["config"]
        assert db.fetchall("SELECT key FROM config WHERE key NOT LIKE 'schema_version.%'") == []
        assert db.schema_versions() == blank.versions(_NEW_FILE_COMPONENTS)
        size = db.fetchone(f"SELECT block_size, total_blocks FROM pragma_database_size() {here}")
        assert size == (BLOCK_SIZE, 2)  # config's block and the metadata's
    finally:
        db.close()


def test_a_new_store_and_its_wake_stores_migrate_nothing(tmp_path: Path) -> None:
    store = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        stores = store.stores()
        with store.db.counting() as count:
            stores.fibers()
            stores.tool_calls()
            stores.jobs()
        assert not [s for s in count.log if "CREATE" in s.upper()], count.log
        assert count.commits == 0
        store.create_session("first", session_id="s1")  # and the copy is a working store
    finally:
        store.close()
    again = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        assert [s.id for s in again.list_sessions()] == ["s1"]
    finally:
        again.close()


def test_an_existing_file_is_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    store = DuckDBSessionStore(path)
    store.create_session("kept", session_id="s1")
    store.close()
    before = path.read_bytes()
    assert blank.create(path, _NEW_FILE_COMPONENTS) is False
    assert path.read_bytes() == before
    reopened = DuckDBSessionStore(path)
    try:
        assert [s.id for s in reopened.list_sessions()] == ["s1"]
    finally:
        reopened.close()


def test_a_writer_that_wins_the_race_keeps_its_file(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "a.duckdb"
    real_link = os.link

    def racing_link(src: str, dst: str) -> None:
        Path(dst).write_bytes(b"the other writer's file")  # created between check and link
        real_link(src, dst)

    monkeypatch.setattr(blank.os, "link", racing_link)
    assert blank.create(path, _NEW_FILE_COMPONENTS) is False
    assert path.read_bytes() == b"the other writer's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.duckdb"]  # no scratch left


def test_without_hard_links_duckdb_creates_the_file(tmp_path: Path, monkeypatch) -> None:
    def no_links(src: str, dst: str) -> None:
        raise PermissionError(1, "hard links are not supported here")

    monkeypatch.setattr(blank.os, "link", no_links)
    store = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        store.create_session("made by DuckDB", session_id="s1")
        assert [p.name for p in tmp_path.iterdir() if p.suffix == ".blank"] == []
    finally:
        store.close()


def test_the_blank_is_built_once_per_set_of_components(tmp_path: Path, monkeypatch) -> None:
    built: list[int] = []
    real_build = blank._build  # noqa: SLF001

    def counting_build(components: blank.Components) -> bytes:
        built.append(len(components))
        return real_build(components)

    monkeypatch.setattr(blank, "_build", counting_build)
    monkeypatch.setattr(blank, "_blanks", {})
    for i in range(3):
        assert blank.create(tmp_path / f"a{i}.duckdb", _NEW_FILE_COMPONENTS)
    assert built == [len(_NEW_FILE_COMPONENTS)]


def test_a_missing_folder_is_made(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "x.duckdb"
    assert blank.create(path, _NEW_FILE_COMPONENTS)
    db = Database(path)
    try:
        assert db.fetchone("SELECT count(*) FROM sessions") == (0,)
    finally:
        db.close()
