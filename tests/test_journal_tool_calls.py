"""The tool-call ledger's rows through the session store's journal (issue 23: an inline
tool call costs no commit). What must hold: a call's insert and moves cost no
statement while the journal holds its row, every read of the table sees them, a
batch is one append that lands whole or not at all (a torn batch is dropped whole, a
raising one leaves nothing), acknowledged moves survive a SIGKILL, and a call the
file holds is still moved by compare-and-set in DuckDB."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from thinkray.storage.journal import journal_path, read_records
from thinkray.storage.records import ToolCallRecord
from thinkray.storage.session_store import DuckDBSessionStore
from thinkray.storage.tool_calls import DuckDBToolCallStore

from tests.helpers import sigkilled_child


class Boom(Exception):
    pass


def _msg(mid: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": mid}]}


def _call(cid: str) -> ToolCallRecord:
    return ToolCallRecord(id=cid, tool_name="lookup", run_id="r1", session_id="s1", input={"q": 1})


def _opened(path: Path) -> tuple[DuckDBSessionStore, DuckDBToolCallStore]:
    store = DuckDBSessionStore(path)
    if not store.list_sessions():
        with store.transaction():  # in DuckDB: the frames counted below are the calls'
            store.create_session(session_id="s1")
    store.get_history("s1")  # the cache knows the history: writes go to the journal
    calls = store.stores().tool_calls()
    assert isinstance(calls, DuckDBToolCallStore)
    calls.get("warm")  # the ids of the file are read once
    return store, calls


def _claim(calls: DuckDBToolCallStore, cid: str) -> ToolCallRecord | None:
    return calls.transition(cid, ["pending"], "executing", executor="me", claim=True)


def _complete(calls: DuckDBToolCallStore, cid: str) -> ToolCallRecord | None:
    return calls.transition(cid, ["executing"], "completed", executor="me", result={"ok": 1})


def _frames(path: Path) -> list[Any]:
    return read_records(journal_path(path))


def _crash(store: DuckDBSessionStore) -> None:
    """Leave the files as a SIGKILL would: the journal unfolded, nothing closed."""
    store._state.journal.close()  # noqa: SLF001
    store._state.pending = None  # noqa: SLF001
    store._database.close()  # noqa: SLF001


def test_an_inline_calls_insert_and_moves_cost_no_statement(tmp_path: Path) -> None:
    store, calls = _opened(tmp_path / "a.duckdb")
    try:
        with store.counting() as count:
            calls.insert(_call("c1"))
            assert _claim(calls, "c1") is not None
            assert _claim(calls, "c1") is None  # the compare holds in memory too
            done = _complete(calls, "c1")
            got = calls.get("c1")
        assert count.statements == 0, count.log
        assert done is not None and got is not None
        assert (got.status, got.attempts, got.result, got.executor) == (
            "completed",
            1,
            {"ok": 1},
            "me",
        )
        assert len(_frames(tmp_path / "a.duckdb")) == 3  # the refused claim wrote nothing
        with pytest.raises(Exception, match="already exists"):
            calls.insert(_call("c1"))
        # a read of the table folds the journal first
        assert [r.id for r in calls.rows("completed")] == ["c1"]
        assert store.db.fetchone("SELECT status, due_at FROM tool_calls") == ("completed", None)
        assert _frames(tmp_path / "a.duckdb") == []
    finally:
        store.close()


def test_a_call_the_file_holds_moves_by_compare_and_set_in_duckdb(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    store, calls = _opened(path)
    try:
        calls.insert(_call("c1"))
        store.db  # noqa: B018 - folded: the file holds c1 now
        with store.counting() as count:
            assert _complete(calls, "c1") is None  # still pending in the file
            assert _claim(calls, "c1") is not None
        assert (count.transactions, count.writes) == (2, 1), count.log  # read in DuckDB
        assert calls.get("c1").status == "executing"  # type: ignore[union-attr]
    finally:
        store.close()
    reopened, calls = _opened(path)
    try:
        assert calls.get("c1").attempts == 1  # type: ignore[union-attr]
    finally:
        reopened.close()


def test_a_batch_is_one_append_and_its_reads_see_it(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    store, calls = _opened(path)
    try:
        with store.batch():
            calls.insert(_call("c1"))
            assert _claim(calls, "c1") is not None
            store.append_message("s1", _msg("u1"))
            assert calls.get("c1").status == "executing"  # type: ignore[union-attr]
            assert _frames(path) == []  # nothing durable before the block ends
        [frame] = _frames(path)
        assert [sorted(k for k in r if k != "n") for r in frame["b"]] == [
            ["k"],
            ["k"],
            ["m", "p", "s"],
        ]
        assert [m["id"] for m in store.get_history("s1")] == ["u1"]
    finally:
        store.close()


def test_a_read_of_the_file_inside_a_batch_makes_what_came_before_durable_first(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.duckdb"
    store, calls = _opened(path)
    try:
        with store.batch():
            calls.insert(_call("c1"))
            assert [r.id for r in calls.rows()] == ["c1"]  # folded: the file holds it
            assert store.db.fetchone("SELECT count(*) FROM tool_calls") == (1,)
            calls.insert(_call("c2"))
        assert [r.id for r in calls.rows()] == ["c1", "c2"]
    finally:
        store.close()


def test_a_raising_batch_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    store, calls = _opened(path)
    try:
        store.append_message("s1", _msg("u0"))
        with pytest.raises(Boom), store.batch():
            calls.insert(_call("c1"))
            store.append_message("s1", _msg("u1"))
            raise Boom
        assert calls.get("c1") is None
        assert [m["id"] for m in store.get_history("s1")] == ["u0"]
        assert store.message_session("u1") is None
        calls.insert(_call("c1"))  # the id is free again
        store.append_message("s1", _msg("u1"))
    finally:
        store.close()
    reopened, calls = _opened(path)
    try:
        assert [m["id"] for m in reopened.get_history("s1")] == ["u0", "u1"]
        assert [r.id for r in calls.rows()] == ["c1"]
    finally:
        reopened.close()


def test_a_torn_batch_is_dropped_whole(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    store, calls = _opened(path)
    store.append_message("s1", _msg("u0"))
    before = journal_path(path).stat().st_size
    with store.batch():
        calls.insert(_call("c1"))
        store.append_message("s1", _msg("u1"))
    _crash(store)
    data = journal_path(path).read_bytes()
    journal_path(path).write_bytes(data[: before + (len(data) - before) // 2])
    reopened, calls = _opened(path)
    try:
        assert [m["id"] for m in reopened.get_history("s1")] == ["u0"]
        assert calls.get("c1") is None and calls.rows() == []
    finally:
        reopened.close()


_CHILD = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from tests.test_journal_tool_calls import _call, _claim, _complete, _msg, _opened
store, calls = _opened({path!r})
with store.batch():
    calls.insert(_call("c1"))
    _claim(calls, "c1")
    store.append_message("s1", _msg("u1"))
_complete(calls, "c1")
calls.insert(_call("c2"))
print("acknowledged", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_acknowledged_calls_survive_a_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    sigkilled_child(_CHILD, path=str(path))
    assert len(_frames(path)) == 3  # the batch, the completion, the second insert
    store, calls = _opened(path)
    try:
        one, two = calls.get("c1"), calls.get("c2")
        assert one is not None and (one.status, one.attempts, one.result) == (
            "completed",
            1,
            {"ok": 1},
        )
        assert two is not None and two.status == "pending"
        assert [m["id"] for m in store.get_history("s1")] == ["u1"]
        assert _frames(path) == []  # replayed into the file
    finally:
        store.close()


def test_a_call_folded_into_an_open_transaction_is_moved_there(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    store, calls = _opened(path)
    try:
        calls.insert(_call("c1"))
        with store.transaction():
            assert _claim(calls, "c1") is not None  # folds into the transaction first
            assert calls.get("c1").status == "executing"  # type: ignore[union-attr]
        assert calls.get("c1").status == "executing"  # type: ignore[union-attr]
        calls.insert(_call("c2"))
        with pytest.raises(Boom), store.transaction():
            assert _claim(calls, "c2") is not None
            raise Boom
        # rolled back: the journaled insert is still there, the claim is not
        assert calls.get("c2").status == "pending"  # type: ignore[union-attr]
        assert [r.status for r in calls.rows()] == ["executing", "pending"]
    finally:
        store.close()
