"""The store conformance suites (fibers and schedules, jobs, tool calls, inbox, registry,
key/value, workspace, and the :class:`~thinkray.storage.protocols.Stores` that groups
them) on DuckDB: a file and ``:memory:`` opened with
:func:`~thinkray.storage.stores.open_stores`, and the stores a
:class:`~thinkray.storage.session_store.DuckDBSessionStore` hands out. Then what is
specific to DuckDB: tables, components, ownership of the file, and claims racing
across two connections to one file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from thinkray.storage import tool_calls as tool_calls_module
from thinkray.storage.db import Database, DatabaseClosedError
from thinkray.storage.protocols import Stores
from thinkray.storage.records import ToolCallRecord
from thinkray.storage.session_store import DuckDBSessionStore
from thinkray.storage.stores import DuckDBStores, open_stores
from thinkray.storage.testing.agent_state_store_suite import *  # noqa: F403
from thinkray.storage.testing.fiber_store_suite import *  # noqa: F403
from thinkray.storage.testing.inbox_store_suite import *  # noqa: F403
from thinkray.storage.testing.job_store_suite import *  # noqa: F403
from thinkray.storage.testing.kv_store_suite import *  # noqa: F403
from thinkray.storage.testing.registry_store_suite import *  # noqa: F403
from thinkray.storage.testing.stores_suite import *  # noqa: F403
from thinkray.storage.testing.tool_call_store_suite import *  # noqa: F403
from thinkray.storage.testing.workspace_store_suite import *  # noqa: F403
from thinkray.storage.tool_calls import DuckDBToolCallStore

BACKENDS = ["file", "memory", "session"]
"""``file``/``memory``: :func:`open_stores`; ``session``: the stores of a session store
on a file (they belong to it: closing it closes them)."""


class _Opened:
    """Everything a test opened, closed at teardown."""

    def __init__(self, backend: str, path: Path) -> None:
        self.backend = backend
        self.path = path
        self.owners: list[DuckDBStores | DuckDBSessionStore] = []

    def open(self) -> Stores:
        if self.backend == "session":
            session = DuckDBSessionStore(self.path)
            self.owners.append(session)
            return session.stores()
        stores = open_stores(self.path if self.backend == "file" else ":memory:")
        self.owners.append(stores)
        return stores

    def reopen(self, old: Stores) -> Stores:
        owner = self.owners[-1]
        assert owner is old or (isinstance(owner, DuckDBSessionStore) and owner.stores() is old)
        owner.close()
        return self.open()

    def close_all(self) -> None:
        for owner in self.owners:
            owner.close()


@pytest.fixture(params=BACKENDS)
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[_Opened]:
    o = _Opened(request.param, tmp_path / "agent.duckdb")
    yield o
    o.close_all()


@pytest.fixture
def stores(opened: _Opened) -> Stores:
    return opened.open()


@pytest.fixture
def reopen(opened: _Opened) -> Callable[[Stores], Stores] | None:
    return None if opened.backend == "memory" else opened.reopen


# -- DuckDB specifics --------------------------------------------------------------------


def _tables(db: Database) -> set[str]:
    return {
        r[0]
        for r in db.fetchall(
            "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database()"
        )
    }


def test_tables_are_created_on_first_use(tmp_path: Path) -> None:
    path = tmp_path / "fresh.duckdb"
    db = Database(path)
    stores = DuckDBStores(db)
    assert _tables(db) <= {"config"}  # the file's key/value table: the versions go there
    stores.fibers()
    assert {"fibers", "schedules"} <= _tables(db)
    assert "jobs" not in _tables(db)
    stores.jobs()
    stores.tool_calls()
    stores.inbox()
    stores.registry()
    stores.kv()
    stores.workspace()
    assert {
        "jobs",
        "tool_calls",
        "tool_call_audit",
        "inbox",
        "subagents",
        "kv",
        "workspace_files",
    } <= _tables(db)
    assert "schema_version" not in _tables(db)
    assert db.schema_versions() == {
        "fibers": 1,
        "jobs": 1,
        "tool_calls": 3,
        "inbox": 1,
        "registry": 1,
        "kv": 1,
        "workspace": 1,
    }
    db.close()
    again = open_stores(path)  # an existing file: nothing to migrate, nothing lost
    assert again.fibers().list_fibers() == []
    again.close()


def test_open_stores_owns_its_file(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "bridge.duckdb"
    stores = open_stores(path)  # creates the folder
    kv = stores.kv()
    kv.set("k", 1)
    stores.close()
    stores.close()
    assert stores.closed
    with pytest.raises(DatabaseClosedError):
        kv.get("k")
    assert not Path(str(path) + ".wal").exists()
    with open_stores(path) as again:  # the lock was released
        assert again.kv().get("k") == 1


def test_stores_of_a_session_store_share_its_database(tmp_path: Path) -> None:
    session = DuckDBSessionStore(tmp_path / "agent.duckdb")
    stores = session.stores()
    assert stores is session.stores()
    stores.close()  # not theirs to close
    assert not stores.closed
    stores.kv().set("k", 1)
    session.close()
    assert stores.closed
    with pytest.raises(DatabaseClosedError):
        stores.kv().get("k")
    with pytest.raises(DatabaseClosedError):
        session.stores()


def test_a_shared_database_outlives_the_session_store(tmp_path: Path) -> None:
    db = Database(tmp_path / "shared.duckdb")
    session = DuckDBSessionStore(db)
    stores = session.stores()
    session.close()
    stores.kv().set("k", 1)  # the database belongs to whoever opened it
    assert stores.kv().get("k") == 1
    db.close()


def test_one_inbox_per_database_keeps_the_order(stores: Any) -> None:
    """The inbox orders by a strictly increasing creation time kept by the store
    object: ``inbox()`` must hand out that one object."""
    inbox = stores.inbox()
    assert stores.inbox() is inbox
    for i in range(20):
        stores.inbox().insert(i, message_id=f"m{i:02d}")
    assert [r.content for r in inbox.rows()] == list(range(20))


def _tool_call_indexes(db: Database) -> list[str]:
    return [
        name
        for (name,) in db.fetchall(
            "SELECT index_name FROM duckdb_indexes() "
            "WHERE table_name = 'tool_calls' AND database_name = current_database()"
        )
    ]


def _many_calls(db: Database, n: int, prefix: str = "x") -> None:
    """``n`` final calls written straight into the table (not through the store; their
    info an empty msgpack map)."""
    db.execute(
        f"INSERT INTO tool_calls SELECT '{prefix}' || i, 'completed', 't', NULL, NULL, NULL, "
        f"0, '\\x80'::BLOB, NULL FROM range({n}) r(i)"
    )


def test_tool_call_lookups_by_id_use_an_index(tmp_path: Path) -> None:
    """Issue 16: every transition finds its call by id; in a big table (the index comes
    with the insert that finds the table holding INDEX_FROM rows) that is an index
    scan, not a scan of the whole table."""
    stores = open_stores(tmp_path / "agent.duckdb")
    try:
        calls = stores.tool_calls()
        db = calls.db
        # DuckDB scans a table of a few rows whatever its indexes; a busy agent's is not.
        _many_calls(db, 20000)
        assert _tool_call_indexes(db) == []  # written past the store: it does not know
        calls.insert(ToolCallRecord(id="c1", tool_name="t"))  # it counts the table once
        indexes = db.fetchall(
            "SELECT index_name, expressions FROM duckdb_indexes() "
            "WHERE table_name = 'tool_calls' AND database_name = current_database()"
        )
        assert [name for name, _ in indexes] == ["tool_calls_id"]
        plan = "".join(
            str(r[1])
            for r in db.fetchall(
                "EXPLAIN ANALYZE SELECT status FROM tool_calls WHERE id = ?", ["c1"]
            )
        )
        assert "Index Scan" in plan
    finally:
        stores.close()


@pytest.mark.parametrize("backend", ["file", "session"])
def test_a_small_tool_call_table_has_no_index(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: below INDEX_FROM rows the table has no id index (two blocks of a small
    agent's file); the insert that brings it to INDEX_FROM rows creates it, through
    DuckDB (``file``) or the session store's journal (``session``), and it stays."""
    monkeypatch.setattr(tool_calls_module, "INDEX_FROM", 5)
    opened = _Opened(backend, tmp_path / "agent.duckdb")
    try:
        calls = opened.open().tool_calls()
        assert isinstance(calls, DuckDBToolCallStore)
        for i in range(4):
            calls.insert(ToolCallRecord(id=f"c{i}", tool_name="t"))
        assert calls.get("c0") is not None
        assert _tool_call_indexes(calls.db) == []
        calls.insert(ToolCallRecord(id="c4", tool_name="t"))  # the fifth row
        assert _tool_call_indexes(calls.db) == ["tool_calls_id"]
        calls.insert(ToolCallRecord(id="c5", tool_name="t"))
        assert [r.id for r in calls.rows()] == [f"c{i}" for i in range(6)]
        assert calls.transition("c3", ["pending"], "executing", executor="e", claim=True)
        assert _tool_call_indexes(calls.db) == ["tool_calls_id"]
    finally:
        opened.close_all()
    with open_stores(tmp_path / "agent.duckdb") as again:  # kept on open
        assert _tool_call_indexes(again.tool_calls().db) == ["tool_calls_id"]


def test_a_tool_call_index_rolled_back_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The insert that made the index was rolled back with the caller's transaction:
    the store does not trust its memory, the next insert makes it."""
    monkeypatch.setattr(tool_calls_module, "INDEX_FROM", 3)
    with open_stores(tmp_path / "agent.duckdb") as stores:
        calls = stores.tool_calls()
        calls.insert(ToolCallRecord(id="c0", tool_name="t"))
        calls.insert(ToolCallRecord(id="c1", tool_name="t"))
        with pytest.raises(RuntimeError), calls.transaction():
            calls.insert(ToolCallRecord(id="c2", tool_name="t"))
            assert _tool_call_indexes(calls.db) == ["tool_calls_id"]
            raise RuntimeError("boom")
        assert _tool_call_indexes(calls.db) == []
        calls.insert(ToolCallRecord(id="c2", tool_name="t"))
        assert _tool_call_indexes(calls.db) == ["tool_calls_id"]


def test_a_tool_call_table_that_grew_past_the_store_gets_its_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows the store did not insert on this connection (a journal replayed at open,
    another connection): the next insert's connection reads the table's size once and
    makes the index if it is big, journal or not."""
    monkeypatch.setattr(tool_calls_module, "INDEX_FROM", 50)
    path = tmp_path / "agent.duckdb"
    with open_stores(path) as stores:
        _many_calls(stores.tool_calls().db, 60)
    session = DuckDBSessionStore(path)
    try:
        calls = session.stores().tool_calls()
        assert _tool_call_indexes(calls.db) == []
        calls.insert(ToolCallRecord(id="new", tool_name="t"))  # through the journal
        assert _tool_call_indexes(calls.db) == ["tool_calls_id"]
        assert calls.get("new") is not None and calls.get("x7") is not None
    finally:
        session.close()


def _version_2_file(path: Path, rows: int) -> None:
    """A file as version 2 of the ledger left it: the id index whatever the size."""
    db = Database(path)
    try:
        db.migrate("tool_calls", tool_calls_module.MIGRATIONS[:2])
        _many_calls(db, rows)
        assert _tool_call_indexes(db) == ["tool_calls_id"]
    finally:
        db.close()


def test_a_version_2_file_with_few_calls_loses_its_index(tmp_path: Path) -> None:
    path = tmp_path / "v2.duckdb"
    _version_2_file(path, 10)
    with open_stores(path) as stores:
        calls = stores.tool_calls()
        assert _tool_call_indexes(calls.db) == []
        assert calls.db.schema_versions()["tool_calls"] == 3
        assert calls.get("x3") is not None and len(calls.rows()) == 10


def test_a_version_2_file_with_many_calls_keeps_its_index(tmp_path: Path) -> None:
    path = tmp_path / "v2.duckdb"
    _version_2_file(path, tool_calls_module.INDEX_FROM)
    with open_stores(path) as stores:
        calls = stores.tool_calls()
        assert _tool_call_indexes(calls.db) == ["tool_calls_id"]
        assert calls.db.schema_versions()["tool_calls"] == 3
        assert calls.get("x3") is not None


def test_a_version_1_tool_call_file_is_migrated_in_place(tmp_path: Path) -> None:
    """A file written before leases and the id index, by a build that kept the versions
    in a ``schema_version`` table: its calls are kept, the ``due_at`` column is added
    (no index: the table is small), the versions move to ``config`` and that table is
    dropped, and the calls can take leases and deadlines."""
    from thinkray.storage.codec import pack
    from thinkray.storage.tool_calls import _v1

    path = tmp_path / "old.duckdb"
    db = Database(path)
    with db.transaction() as con:
        con.execute("CREATE TABLE schema_version (component VARCHAR, version INTEGER)")
        con.execute("INSERT INTO schema_version VALUES ('tool_calls', 1), ('kv', 1)")
        _v1(con)
        con.execute(
            "INSERT INTO tool_calls VALUES ('old', 'executing', 'render', 'r', 's', 'gpu', 5.0, ?)",
            [pack({"input": {"scene": "dusk"}, "attempts": 1, "durable": True, "created_at": 4.0})],
        )
    db.close()
    stores = open_stores(path)
    try:
        calls = stores.tool_calls()
        old = calls.get("old")
        assert old is not None
        assert (old.status, old.executor, old.input, old.attempts) == (
            "executing",
            "gpu",
            {"scene": "dusk"},
            1,
        )
        assert (old.lease_until, old.deadline_at) == (None, None)
        assert calls.next_deadline() is None
        assert calls.renew("old", "gpu", 1000.0) is not None
        assert [r.id for r in calls.lapse(1000.0)] == ["old"]
        assert calls.db.schema_versions() == {"tool_calls": 3, "kv": 1}
        assert "schema_version" not in _tables(calls.db)
        assert _tool_call_indexes(calls.db) == []
    finally:
        stores.close()
    with open_stores(path) as again:  # the versions are the file's now
        assert again.tool_calls().db.schema_versions() == {"tool_calls": 3, "kv": 1}


def test_a_tool_call_is_claimed_once_across_connections(tmp_path: Path) -> None:
    """Two processes cannot both hold the file (the second open is locked out, see
    ``test_storage_db``), but two :class:`Database` objects of one process can open it:
    they are two connections with transactions of their own. A claim racing another
    connection's uncommitted claim of the same call still loses (``None``), and the
    call is held by the winner alone."""
    path = tmp_path / "agent.duckdb"
    first, second = open_stores(path), open_stores(path)
    try:
        mine, theirs = first.tool_calls(), second.tool_calls()
        mine.insert(ToolCallRecord(id="c1", tool_name="t"))
        with first.transaction():
            won = mine.transition("c1", ["pending"], "executing", executor="w1", claim=True)
            # the other connection still reads the call as pending, and loses the write
            lost = theirs.transition("c1", ["pending"], "executing", executor="w2", claim=True)
        assert won is not None and lost is None
        for store in (mine, theirs):
            stored = store.get("c1")
            assert stored is not None
            assert (stored.status, stored.executor, stored.attempts) == ("executing", "w1", 1)
        # the loser's connection is usable afterwards
        assert theirs.transition("c1", ["executing"], "completed", executor="w1", result=1)
    finally:
        first.close()
        second.close()
