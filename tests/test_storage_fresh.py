"""A brand-new agent's file is known empty (issue 22: a burst of new sessions on one
agent host queued each agent's recovery reads, ~8 statements on empty tables, and
its first session's two commits on one event loop). What must hold: the wake of a
new agent and its first turn run no DuckDB statement (the first session and "it is
current" go to the journal with the turn), what was journaled survives a crash, and
the moment anything is written every reader asks the file again (nothing written is
ever answered as "empty"); a reopened file is never taken for a new one."""

from __future__ import annotations

from pathlib import Path

import pytest
from thinkray.runtime import Think
from thinkray.runtime.agents.sessions import CURRENT_SESSION_KEY
from thinkray.runtime.models.testing import ScriptedModel, reply
from thinkray.storage.db import Database
from thinkray.storage.errors import InvalidInputError
from thinkray.storage.records import JobRecord, ToolCallRecord
from thinkray.storage.session_store import DuckDBSessionStore

from tests.conftest import Collector


def _think(store: DuckDBSessionStore, replies: int = 1) -> Think:
    agent = Think(store, model=ScriptedModel([reply("hello ", "there") for _ in range(replies)]))
    agent.flush_interval = 3600.0  # only the structural writes: no timer batches
    return agent


async def test_a_new_agents_wake_and_first_turn_run_no_statement(tmp_path):
    store = DuckDBSessionStore(tmp_path / "a.duckdb")
    assert store.db.fresh
    with store.counting() as woken:
        agent = _think(store)
        await agent.on_wake()
    try:
        assert woken.statements == 0, woken.log
        with store.counting() as turn:
            result = await agent.chat("hi", Collector())
        assert result.status == "completed", result.error
        # the session, "it is current" and the messages all go to the journal
        assert turn.statements == 0, turn.log
        assert agent.sessions.current_id == result.session_id
    finally:
        agent.close()
    again = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        assert not again.db.fresh  # an existing file is read, never assumed empty
        assert again.get_config(CURRENT_SESSION_KEY) == result.session_id
        assert [m["role"] for m in again.get_history(result.session_id)] == [
            "user",
            "assistant",
        ]
    finally:
        again.close()


@pytest.mark.parametrize("first", ["fiber", "job", "tool call", "config"])
def test_a_write_ends_freshness_for_every_reader(tmp_path, first):
    # Each kind of write first, on its own new file: a tool call goes to the session
    # store's journal, not to DuckDB, and must end freshness all the same.
    store = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        stores = store.stores()
        fibers, jobs, calls = stores.fibers(), stores.jobs(), stores.tool_calls()
        assert fibers.list_fibers() == [] and jobs.rows() == [] and calls.rows() == []
        if first == "fiber":
            fiber = fibers.insert_fiber("work", {"x": 1})
            assert [f.id for f in fibers.list_fibers("running")] == [fiber.id]
        elif first == "job":
            jobs.insert(JobRecord(id="j1", kind="shell", status="running", created_at=1.0))
            assert jobs.interrupt_running("gone") == 1
        elif first == "tool call":
            calls.insert(ToolCallRecord(id="c1", tool_name="t", run_id="r", session_id="s"))
            assert [c.id for c in calls.rows()] == ["c1"]
        else:
            store.set_config("k", 1)
            assert store.get_config("k") == 1
        assert not store.db.fresh
    finally:
        store.close()


def test_a_statement_that_writes_ends_freshness(tmp_path):
    db = Database(tmp_path / "a.duckdb", fresh=True)
    try:
        db.execute("SELECT 42")
        assert db.fresh  # a read writes nothing
        db.execute("CREATE TABLE t (x INTEGER)")
        assert not db.fresh
    finally:
        db.close()
    db = Database(tmp_path / "b.duckdb", fresh=True)
    try:
        with db.transaction():
            pass
        assert not db.fresh  # a transaction may have written through its connection
    finally:
        db.close()


def test_no_schedule_is_known_until_one_is_added_or_run(tmp_path):
    store = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        fibers = store.stores().fibers()
        store.create_session("s")  # a write: the file is no longer fresh
        with store.counting() as count:
            assert fibers.due_schedules(now=10.0) == [] and fibers.next_due_at() is None
        assert count.statements == 0, count.log  # known from the new file
        rec = fibers.insert_schedule("tick", kind="once", next_run_at=5.0)
        assert [s.id for s in fibers.due_schedules(now=10.0)] == [rec.id]
        assert fibers.next_due_at() == 5.0
        fibers.mark_ran(rec.id, now=10.0)  # a once-schedule is disabled by its run
        assert fibers.next_due_at() is None
        with store.counting() as count:
            assert fibers.due_schedules(now=20.0) == []
        assert count.statements == 0, count.log  # learned again from the read above
    finally:
        store.close()
    again = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        fibers = again.stores().fibers()
        fibers.insert_schedule("tock", kind="once", next_run_at=7.0)
        again.close()
        again = DuckDBSessionStore(tmp_path / "a.duckdb")
        assert again.stores().fibers().next_due_at() == 7.0  # a reopened file is asked
    finally:
        again.close()


_CHILD = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from thinkray.storage.session_store import DuckDBSessionStore
store = DuckDBSessionStore({path!r})
with store.batch():
    store.create_session("first", session_id="s1", thread_key="t1")
    store.set_config("current", "s1")
store.set_config("current", "s2")
store.set_config("other", [1, 2])
print("acknowledged", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_journaled_first_session_and_config_survive_a_sigkill(tmp_path):
    from tests.helpers import sigkilled_child

    path = tmp_path / "a.duckdb"
    sigkilled_child(_CHILD, path=str(path))
    store = DuckDBSessionStore(path)
    try:
        (info,) = store.list_sessions()
        assert (info.id, info.name, info.thread_key) == ("s1", "first", "t1")
        assert store.get_config("current") == "s2"  # the last value of a key wins
        assert store.get_config("other") == [1, 2]
        with pytest.raises(InvalidInputError, match="already exists"):
            store.create_session("again", session_id="s1")
    finally:
        store.close()


def test_a_journaled_first_session_reads_back_before_and_after_a_fold(tmp_path):
    store = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        with store.counting() as count:
            store.create_session("first", session_id="s1")
            store.set_config("k", "v")
        assert count.statements == 0, count.log  # both journaled
        assert store.get_session("s1").name == "first" and store.has_session("s1")
        assert [s.id for s in store.list_sessions()] == ["s1"]  # folds, then reads
        assert store.get_config("k") == "v"
        store.set_config("k", "w")
        store.delete_config("k")  # after the journaled write: the delete wins
        assert store.get_config("k") is None
    finally:
        store.close()
    again = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        assert again.get_session("s1").name == "first" and again.get_config("k") is None
    finally:
        again.close()


def test_a_duplicate_first_session_is_still_refused(tmp_path):
    store = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        store.create_session("one", session_id="s1")
        with pytest.raises(InvalidInputError, match="already exists"):
            store.create_session("two", session_id="s1")
        assert store.get_session("s1").name == "one"
    finally:
        store.close()


async def test_a_refused_session_leaves_the_current_one(tmp_path: Path):
    agent = _think(DuckDBSessionStore(tmp_path / "a.duckdb"), replies=0)
    try:
        first = agent.sessions.create("first", session_id="s1")
        with pytest.raises(InvalidInputError):
            agent.sessions.create("again", session_id="s1")
        assert agent.sessions.current_id == first.id
        assert agent.store.get_config(CURRENT_SESSION_KEY) == first.id
    finally:
        agent.close()


def _hibernated_with_one_turn(tmp_path: Path) -> Path:
    path = tmp_path / "a.duckdb"
    store = DuckDBSessionStore(path)
    store.create_session("s")
    store.close()
    return path


def test_a_reopened_files_empty_recovery_tables_are_known_from_its_first_statement(tmp_path):
    """A wake's recovery reads (interrupted fibers, open tool calls, running jobs) of
    tables the open counted empty run no statement; a table with rows is read."""
    path = _hibernated_with_one_turn(tmp_path)
    store = DuckDBSessionStore(path)
    try:
        stores = store.stores()
        fibers, jobs, calls = stores.fibers(), stores.jobs(), stores.tool_calls()
        with store.counting() as count:
            assert fibers.list_fibers("running") == [] and jobs.interrupt_running("x") == 0
            assert calls.rows("pending") == [] and fibers.delete_finished(0.0) == 0
        assert count.statements == 0, count.log
        jobs.insert(JobRecord(id="j1", kind="shell", status="running", created_at=1.0))
    finally:
        store.close()
    again = DuckDBSessionStore(path)
    try:
        assert again.db.known_empty("fibers") and not again.db.known_empty("jobs")
        assert again.stores().jobs().interrupt_running("gone") == 1  # asked: it has rows
    finally:
        again.close()


@pytest.mark.parametrize("first", ["fiber", "job", "tool call", "transaction"])
def test_any_write_after_the_probe_makes_every_reader_ask_again(tmp_path, first):
    path = _hibernated_with_one_turn(tmp_path)
    store = DuckDBSessionStore(path)
    try:
        stores = store.stores()
        fibers, jobs, calls = stores.fibers(), stores.jobs(), stores.tool_calls()
        assert store.db.known_empty("fibers")
        if first == "fiber":
            fiber = fibers.insert_fiber("work", {"x": 1})
            assert [f.id for f in fibers.list_fibers("running")] == [fiber.id]
        elif first == "job":
            jobs.insert(JobRecord(id="j1", kind="shell", status="running", created_at=1.0))
            assert [j.id for j in jobs.rows("running")] == ["j1"]
        elif first == "tool call":  # through the journal, not DuckDB
            calls.insert(ToolCallRecord(id="c1", tool_name="t", run_id="r", session_id="s"))
            assert [c.id for c in calls.rows()] == ["c1"]
        else:
            with store.db.transaction() as con:
                con.execute(
                    "INSERT INTO fibers (id, method, status, updated_at, info) "
                    "VALUES ('f', 'm', 'running', 1.0, '\\x80'::BLOB)"
                )
            assert [f.id for f in fibers.list_fibers("running")] == ["f"]
        assert not any(store.db.known_empty(t) for t in ("fibers", "jobs", "tool_calls"))
    finally:
        store.close()
