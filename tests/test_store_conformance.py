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
    assert _tables(db) <= {"schema_version"}
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
    versions = dict(db.fetchall("SELECT component, version FROM schema_version"))
    assert versions == {
        "fibers": 1,
        "jobs": 1,
        "tool_calls": 2,
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


def test_tool_call_lookups_by_id_use_an_index(tmp_path: Path) -> None:
    """Issue 16: every transition finds its call by id; with an index that is an index
    scan, not a scan of the whole table."""
    stores = open_stores(tmp_path / "agent.duckdb")
    try:
        calls = stores.tool_calls()
        calls.insert(ToolCallRecord(id="c1", tool_name="t"))
        db = calls.db
        # DuckDB scans a table of a few rows whatever its indexes; a busy agent's is not.
        db.execute(
            "INSERT INTO tool_calls SELECT 'x' || i, 'completed', 't', NULL, NULL, NULL, 0, "
            "''::BLOB, NULL FROM range(20000) r(i)"
        )
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


def test_a_version_1_tool_call_file_is_migrated_in_place(tmp_path: Path) -> None:
    """A file written before leases and the id index: its calls are kept, the index and
    the ``due_at`` column are added, and the calls can take leases and deadlines."""
    from thinkray.storage.codec import pack
    from thinkray.storage.tool_calls import _v1

    path = tmp_path / "old.duckdb"
    db = Database(path)
    with db.transaction() as con:
        con.execute("CREATE TABLE schema_version (component VARCHAR, version INTEGER)")
        con.execute("INSERT INTO schema_version VALUES ('tool_calls', 1)")
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
        versions = dict(calls.db.fetchall("SELECT component, version FROM schema_version"))
        assert versions["tool_calls"] == 2
        assert calls.db.fetchall(
            "SELECT index_name FROM duckdb_indexes() "
            "WHERE table_name = 'tool_calls' AND database_name = current_database()"
        ) == [("tool_calls_id",)]
    finally:
        stores.close()


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
