"""The SessionStore conformance suite on DuckDB (a file and ``:memory:``), plus what is
specific to the DuckDB store: shared databases, failures inside the flush
transaction, file size, and the bulk import."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import thinkray.storage.session_store as session_store_module
from thinkray.storage.db import VERSION_KEY, Database, DatabaseClosedError
from thinkray.storage.protocols import SessionStore
from thinkray.storage.session_store import DuckDBSessionStore
from thinkray.storage.testing.session_store_suite import *  # noqa: F403
from thinkray.storage.testing.session_store_suite import chain, envelope, ids, msg
from thinkray.storage.types import (
    ChunkWrite,
    InvalidInputError,
    PartWrite,
    StreamFlush,
)


class _Opened:
    """Every store a test opened, closed at teardown."""

    def __init__(self) -> None:
        self.stores: list[DuckDBSessionStore] = []

    def open(self, target: Any) -> DuckDBSessionStore:
        store = DuckDBSessionStore(target)
        self.stores.append(store)
        return store

    def close_all(self) -> None:
        for store in self.stores:
            store.close()


@pytest.fixture(params=["file", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path / "agent.duckdb") if request.param == "file" else ":memory:"


@pytest.fixture
def opened() -> Iterator[_Opened]:
    o = _Opened()
    yield o
    o.close_all()


@pytest.fixture(scope="module")
def memory_db() -> Iterator[Database]:
    """One in-memory database for the module, emptied before each test: creating a
    DuckDB instance costs 12-20 ms, more than most tests here. Stores on it share the
    Database (they do not own it), the way stores share an actor's file."""
    db = Database(":memory:")
    yield db
    db.close()


@pytest.fixture
def store(backend: str, opened: _Opened, request: pytest.FixtureRequest) -> DuckDBSessionStore:
    if backend != ":memory:":
        return opened.open(backend)
    db: Database = request.getfixturevalue("memory_db")
    tables = [
        t
        for (t,) in db.fetchall(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
        )
    ]
    for table in tables:
        if table == "config":  # the components' versions stay (see thinkray.storage.db)
            db.execute("DELETE FROM config WHERE NOT starts_with(key, ?)", [VERSION_KEY])
        else:
            db.execute(f"DELETE FROM {table}")
    db.state.clear()  # what stores kept in memory about the rows just deleted
    return opened.open(db)


@pytest.fixture
def reopen(backend: str, opened: _Opened) -> Callable[[SessionStore], SessionStore] | None:
    if backend == ":memory:":
        return None

    def _reopen(old: SessionStore) -> SessionStore:
        old.close()
        return opened.open(backend)

    return _reopen


# -- DuckDB specifics --------------------------------------------------------------


def test_implements_the_protocol(store: DuckDBSessionStore) -> None:
    assert isinstance(store, SessionStore)


def test_memory_store_owns_its_database() -> None:
    store = DuckDBSessionStore(":memory:")
    sid = store.create_session().id
    chain(store, sid, "m1", "m2")
    assert ids(store.get_history(sid)) == ["m1", "m2"]
    store.close()
    store.close()
    assert store.closed
    with pytest.raises(DatabaseClosedError):
        store.get_history(sid)


def test_shared_database_is_not_closed(tmp_path: Path) -> None:
    db = Database(tmp_path / "shared.duckdb")
    store = DuckDBSessionStore(db)
    sid = store.create_session().id
    store.close()
    store.close()
    assert not db.closed
    with pytest.raises(DatabaseClosedError):
        store.get_session(sid)
    again = DuckDBSessionStore(db)  # migrate is a no-op on the same connection
    assert again.has_session(sid)
    db.close()
    again.close()
    assert not os.path.exists(str(tmp_path / "shared.duckdb") + ".wal")


def test_owned_database_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "owned.duckdb"
    store = DuckDBSessionStore(path)
    store.create_session()
    store.close()
    assert store.closed
    with pytest.raises(DatabaseClosedError):
        store.list_sessions()
    assert not os.path.exists(str(path) + ".wal")
    DuckDBSessionStore(path).close()  # the file lock was released


def test_schema_version_recorded(tmp_path: Path) -> None:
    path = tmp_path / "v.duckdb"
    db = Database(path)
    DuckDBSessionStore(db)
    newest = session_store_module.MIGRATIONS[-1].version
    assert db.schema_versions()["sessions"] == newest
    db.close()
    with Database(path) as again:  # in the file's config table, beside the store's keys
        assert again.schema_versions()["sessions"] == newest
        assert again.fetchone(
            "SELECT value FROM config WHERE key = ?", [VERSION_KEY + "sessions"]
        ) == (str(newest).encode(),)
        here = "WHERE database_name = current_database()"
        assert ("schema_version",) not in again.fetchall(
            f"SELECT table_name FROM duckdb_tables() {here}"
        )


def test_flush_failure_inside_the_transaction_rolls_back(
    store: DuckDBSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Make the chunk insert fail after the message and its parts were written, and
    check none of it landed."""
    sid = store.create_session().id
    chain(store, sid, "u1")
    store.flush_stream(
        StreamFlush(
            sid, message=envelope(), parts=[PartWrite("s1", 0, {"type": "text", "text": "a"})]
        )  # fmt: skip
    )
    before = store.get_session(sid)
    insert_rows = session_store_module._insert_rows

    def failing(con: Any, table: str, sql: str, rows: Any) -> None:
        if table == "chunks":
            con.execute("INSERT INTO no_such_table VALUES (1)")
        insert_rows(con, table, sql, rows)

    monkeypatch.setattr(session_store_module, "_insert_rows", failing)
    # In a transaction the flush is written to DuckDB (on a file, with what the journal
    # held folded into the same transaction): the rollback must take all of it back.
    with pytest.raises(Exception, match="no_such_table"), store.transaction():
        store.flush_stream(
            StreamFlush(
                sid,
                message=envelope("s2", {"x": 1}),
                parts=[
                    PartWrite("s2", 0, {"type": "text", "text": "new"}),
                    PartWrite("s1", 0, {"type": "text", "text": "changed"}),
                ],
                chunks=[ChunkWrite("g", 0, {"type": "start"})],
            )
        )
    monkeypatch.undo()
    assert store.get_message("s2") is None
    assert store.get_message("s1")["parts"] == [{"type": "text", "text": "a"}]  # type: ignore[index]
    assert store.get_session(sid).head_id == before.head_id == "s1"
    assert store.get_chunks("g") == []
    # The store is still usable, and seq still increases.
    store.append_message(sid, msg("after"))
    assert ids(store.get_history(sid)) == ["u1", "s1", "after"]


def test_bulk_append_messages(store: DuckDBSessionStore) -> None:
    sid = store.create_session().id
    chain(store, sid, "u0")
    batch = [msg(f"m{i}", "user" if i % 2 else "assistant") for i in range(50)]
    assert store.append_messages(sid, batch) == 50
    history = store.get_history(sid)
    assert ids(history) == ["u0"] + [f"m{i}" for i in range(50)]
    assert history[1:] == batch
    assert store.get_session(sid).head_id == "m49"
    with pytest.raises(InvalidInputError):
        store.append_messages(sid, [msg("fresh"), msg("m3")])
    assert store.get_message("fresh") is None
    assert store.append_messages(sid, []) == 0


def test_history_walk_without_numpy_path(
    store: DuckDBSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both result-set paths (fetchnumpy when numpy is loaded, fetchall otherwise)."""
    import sys

    pytest.importorskip("numpy")
    sid = store.create_session().id
    chain(store, sid, "m1", "m2", "m3")
    store.set_hidden(sid, ["m2"], 1.0)
    with_np = store.get_path(sid)
    monkeypatch.delitem(sys.modules, "numpy", raising=False)
    without = store.get_path(sid)
    assert [(r.id, r.hidden_at, r.seq, r.message) for r in with_np] == [
        (r.id, r.hidden_at, r.seq, r.message) for r in without
    ]
    assert ids(store.get_history(sid)) == ["m1", "m3"]


def test_file_sizes(tmp_path: Path) -> None:
    path = tmp_path / "size.duckdb"
    DuckDBSessionStore(path).close()
    assert os.path.getsize(path) <= 64 * 1024
    store = DuckDBSessionStore(path)
    sid = store.create_session().id
    chain(store, sid, *[f"m{i}" for i in range(20)])
    store.close()
    size = os.path.getsize(path)
    assert size <= 128 * 1024
    for _ in range(10):
        s = DuckDBSessionStore(path)
        s.get_history(sid)
        s.close()
    assert os.path.getsize(path) <= size * 1.25
    assert not os.path.exists(str(path) + ".wal")
