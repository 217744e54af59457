"""Durable tool calls (seed 003 §1.1-1.7): the ``tool_calls`` and ``tool_call_audit``
tables. Layout::

    tool_calls(id VARCHAR, status VARCHAR, tool_name VARCHAR, run_id VARCHAR,
               session_id VARCHAR, executor VARCHAR, updated_at DOUBLE, info BLOB,
               due_at DOUBLE)      -- index tool_calls_id on (id) from INDEX_FROM rows
    tool_call_audit(seq BIGINT, tool_call_id VARCHAR, "at" DOUBLE, info BLOB)

Every tool call of a generation is a row, written before it runs and moved by
compare-and-set transitions (:data:`~thinkray.storage.records.TOOL_CALL_TRANSITIONS`):
:meth:`DuckDBToolCallStore.transition` reads the status and holder and writes the move
in one transaction, so of two racing moves exactly one wins. The columns are what the
store filters on; everything else (input, result, error, attempts, approval, the late
result, the lease and the deadline, created_at) is in the msgpack ``info`` blob.
``due_at`` is the earliest of an open call's deadline and (while executing) its
lease: what the sweeps (:meth:`~DuckDBToolCallStore.expire`,
:meth:`~DuckDBToolCallStore.lapse`) and the alarm (:meth:`~DuckDBToolCallStore.next_deadline`)
read, NULL once the call is final. Every transition finds its row by id, so once the
table holds :data:`INDEX_FROM` rows ``id`` has an ART index (issue 16: without one
every transition scanned the table; a plain index, not UNIQUE: DuckDB turns an update
of a row under a unique key into delete + insert, and ids are checked inside the
insert). A smaller table has none (issue 23: the index costs a small agent's file two
of its few blocks, and a scan of under a thousand rows is microseconds): version 3
drops it from a small table, and the insert that brings the table to
:data:`INDEX_FROM` rows creates it (the store counts the rows it inserted, read once
per connection: the ids it keeps for the journal, or one count). Rows are never
deleted, so an index once made stays. The audit is append-only; ``seq`` increases
with every row.

Where the session store of the file journals (:mod:`~thinkray.storage.write_behind`),
a call's row goes to the journal instead of DuckDB when memory can check the write: an
insert once the ids of the file are known (read once), a move of a row the journal
holds (the ledger's insert, claim and completion of one inline call). Such a call
costs no statement (but one per connection once the ids are :data:`INDEX_FROM`: the
index, made or found there); any other read of the table folds the journal first.
The ids count the journal's calls too, so the index is made before the fold that
brings the table to that size, and rows a replayed journal folded at open are
counted by the connection's first insert.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

import duckdb
from thinkray.storage.codec import pack as _pack
from thinkray.storage.codec import unpack as _unpack
from thinkray.storage.db import Database, MigratedStore, Migration
from thinkray.storage.protocols import ToolCallStore
from thinkray.storage.records import (
    TOOL_CALL_FINISHED,
    TOOL_CALL_STATUSES,
    TOOL_CALL_TRANSITIONS,
    ToolCallAudit,
    ToolCallRecord,
)
from thinkray.storage.types import InvalidInputError
from thinkray.storage.write_behind import SINK_KEY, JournalSink
from typing_extensions import override

__all__ = ["MIGRATIONS", "DuckDBToolCallStore"]


def _v1(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        """
        CREATE TABLE IF NOT EXISTS tool_calls (
            id VARCHAR NOT NULL,
            status VARCHAR NOT NULL,
            tool_name VARCHAR NOT NULL,
            run_id VARCHAR,
            session_id VARCHAR,
            executor VARCHAR,
            updated_at DOUBLE NOT NULL,
            info BLOB NOT NULL
        )
        """
    )
    con.execute(
        """
        CREATE TABLE IF NOT EXISTS tool_call_audit (
            seq BIGINT NOT NULL,
            tool_call_id VARCHAR NOT NULL,
            "at" DOUBLE NOT NULL,
            info BLOB NOT NULL
        )
        """
    )


def _v2(con: duckdb.DuckDBPyConnection) -> None:
    # Issue 16: without a key every transition scanned the table for its row. A file of
    # version 1 keeps its rows; their due_at stays NULL (no lease, no deadline) until the
    # agent's recovery at wake gives its open external calls one.
    con.execute("ALTER TABLE tool_calls ADD COLUMN IF NOT EXISTS due_at DOUBLE")
    con.execute("CREATE INDEX IF NOT EXISTS tool_calls_id ON tool_calls (id)")


INDEX_FROM = 1_000
"""From this many rows ``tool_calls`` has its id index (see the module)."""
_INDEX = "tool_calls_id"
_CREATE_INDEX = f"CREATE INDEX IF NOT EXISTS {_INDEX} ON tool_calls (id)"


def _v3(con: duckdb.DuckDBPyConnection) -> None:
    # Issue 23: the index only where the table is big (see the module). A new file's
    # table is empty: version 2 made the index and this drops it, in one transaction.
    row = con.execute("SELECT count(*) FROM tool_calls").fetchone()
    if row is not None and row[0] >= INDEX_FROM:
        con.execute(_CREATE_INDEX)
    else:
        con.execute(f"DROP INDEX IF EXISTS {_INDEX}")


MIGRATIONS = [Migration(1, _v1), Migration(2, _v2), Migration(3, _v3)]
_COLS = "id, status, tool_name, run_id, session_id, executor, updated_at, info"
_WRITE_COLS = f"{_COLS}, due_at"
_AUDIT_COLS = 'seq, tool_call_id, "at", info'  # AT is a keyword in DuckDB


# Where a Database's state keeps the ids of its tool calls (_Ids), read once; past
# _MAX_IDS calls they are not kept (an insert then asks the file).
_IDS = "tool_calls.ids"
_MAX_IDS = 100_000


@dataclass
class _Ids:
    ids: set[str] | None  # None: more than _MAX_IDS
    epoch: tuple[int, int]  # (Database.rollbacks, JournalSink.discards) when read


# Where a Database's state keeps the rows of its tool_calls table (_Rows), read once by
# an insert through DuckDB, and that it has the id index (_Indexed), once made sure.
_ROWS = "tool_calls.rows"
_INDEXED = "tool_calls.indexed"


@dataclass
class _Rows:
    rows: int  # the table's rows: read once, then counted by this connection's inserts
    epoch: int  # Database.rollbacks when read (a rollback may have taken some)


@dataclass
class _Indexed:
    epoch: int  # Database.rollbacks when made sure of (a rollback may have taken it)


def _record(values: Sequence[Any]) -> ToolCallRecord:
    cid, status, tool_name, run_id, session_id, executor, updated_at, blob = values
    info = _unpack(blob) or {}
    late_at = info.get("late_at")
    return ToolCallRecord(
        id=cid,
        tool_name=tool_name,
        status=status,
        run_id=run_id,
        session_id=session_id,
        input=info.get("input"),
        result=info.get("result"),
        error=info.get("error"),
        executor=executor,
        attempts=int(info.get("attempts", 0)),
        durable=bool(info.get("durable", False)),
        approval=info.get("approval"),
        late_result=info.get("late_result"),
        late_error=info.get("late_error"),
        late_at=None if late_at is None else float(late_at),
        created_at=float(info.get("created_at", updated_at)),
        updated_at=float(updated_at),
        lease_until=_float_or_none(info.get("lease_until")),
        deadline_at=_float_or_none(info.get("deadline_at")),
    )


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _due(rec: ToolCallRecord) -> float | None:
    """When something must happen to an open call: its deadline passes, or (executing)
    its lease lapses. None for a final call or one with neither."""
    if rec.finished:
        return None
    lease = rec.lease_until if rec.status == "executing" else None
    times = [t for t in (rec.deadline_at, lease) if t is not None]
    return min(times) if times else None


def _check_time(value: object, what: str) -> None:
    """``value`` is None or finite epoch seconds."""
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value != value
        or value in (float("inf"), float("-inf"))
    ):
        raise InvalidInputError(f"{what} must be epoch seconds or None, not {value!r}")


def _row_in(con: duckdb.DuckDBPyConnection, tool_call_id: str) -> ToolCallRecord | None:
    """The call's row read inside the caller's transaction (None: no such call)."""
    row = con.execute(f"SELECT {_COLS} FROM tool_calls WHERE id = ?", [tool_call_id]).fetchone()
    return None if row is None else _record(row)


def _row(rec: ToolCallRecord) -> list[Any]:
    """``rec`` as a ``tool_calls`` row (``_WRITE_COLS`` order)."""
    return [
        rec.id,
        rec.status,
        rec.tool_name,
        rec.run_id,
        rec.session_id,
        rec.executor,
        rec.updated_at,
        _pack(_info(rec), "tool call"),
        _due(rec),
    ]


def _move(
    rec: ToolCallRecord,
    expected: Collection[str],
    status: str,
    executor: str | None,
    claim: bool,
    result: Any,
    error: str | None,
    approval: dict[str, Any] | None,
    lease_until: float | None,
) -> bool:
    """Apply a checked :meth:`~DuckDBToolCallStore.transition` to ``rec`` in place if
    its compare holds; False (``rec`` untouched) if it does not."""
    if rec.status not in expected:
        return False
    if executor is not None and not claim and rec.executor != executor:
        return False
    rec.status = status
    if claim:
        rec.executor = executor
        rec.attempts += 1
    # A lease belongs to one claim: any other move ends it.
    rec.lease_until = lease_until if claim else None
    if result is not None:
        rec.result = result
    if error is not None:
        rec.error = error
    if approval is not None:
        rec.approval = approval
    rec.updated_at = time.time()
    return True


def _update(con: duckdb.DuckDBPyConnection, rec: ToolCallRecord, old_status: str) -> None:
    """Write ``rec`` over its row, if the row is still ``old_status``."""
    con.execute(
        "UPDATE tool_calls SET status = ?, executor = ?, updated_at = ?, info = ?, due_at = ? "
        "WHERE id = ? AND status = ?",
        [
            rec.status,
            rec.executor,
            rec.updated_at,
            _pack(_info(rec), "tool call"),
            _due(rec),
            rec.id,
            old_status,
        ],
    )


def _info(rec: ToolCallRecord) -> dict[str, Any]:
    return {
        "input": rec.input,
        "result": rec.result,
        "error": rec.error,
        "attempts": rec.attempts,
        "durable": rec.durable,
        "approval": rec.approval,
        "late_result": rec.late_result,
        "late_error": rec.late_error,
        "late_at": rec.late_at,
        "created_at": rec.created_at,
        "lease_until": rec.lease_until,
        "deadline_at": rec.deadline_at,
    }


def _audit(values: Sequence[Any]) -> ToolCallAudit:
    seq, cid, at, blob = values
    info = _unpack(blob) or {}
    return ToolCallAudit(
        seq=int(seq),
        tool_call_id=cid,
        decision=info.get("decision", ""),
        by=info.get("by"),
        reason=info.get("reason"),
        at=float(at),
    )


def _check_status(status: object) -> str:
    if not isinstance(status, str) or status not in TOOL_CALL_STATUSES:
        raise InvalidInputError(f"unknown tool call status {status!r}; one of {TOOL_CALL_STATUSES}")
    return status


def _statuses(status: str | Iterable[str]) -> list[str]:
    """``status`` as a list of known statuses (a single string is one status)."""
    statuses = [status] if isinstance(status, str) else list(status)
    for s in statuses:
        _check_status(s)
    return statuses


def _check_move(expect: Collection[str], status: str) -> list[str]:
    """The expected statuses, if a move from each of them to ``status`` is allowed."""
    _check_status(status)
    expected = _statuses(expect)
    if not expected:
        raise InvalidInputError("expect must name at least one status")
    for source in expected:
        if status not in TOOL_CALL_TRANSITIONS[source]:
            raise InvalidInputError(
                f"a tool call cannot move from {source!r} to {status!r}"
                + (" (final)" if not TOOL_CALL_TRANSITIONS[source] else "")
            )
    return expected


def _optional_str(value: object, what: str) -> None:
    if value is not None and not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string or None, not {type(value).__name__}")


def _is_conflict(exc: duckdb.Error) -> bool:
    return "conflict" in str(exc).lower()


class DuckDBToolCallStore(MigratedStore, ToolCallStore):
    """:class:`~thinkray.storage.protocols.ToolCallStore` on a :class:`Database` (the
    contract is the protocol's). Synchronous; calls from several threads are
    serialized by the database, so a compare-and-set reads and writes under one lock
    and in one transaction. Get one from
    :meth:`~thinkray.storage.protocols.Stores.tool_calls`."""

    component = "tool_calls"
    migrations = MIGRATIONS

    @property
    def db(self) -> Database:
        """The database, with this store's tables and every journaled call folded in."""
        db = self._migrated()
        sink = db.state.get(SINK_KEY)
        if sink is not None and sink.has_tool_calls():
            sink.settle()
        return db

    def _sink(self) -> JournalSink | None:
        """The journal, if a write may go to it now (call under the lock)."""
        sink: JournalSink | None = self._db.state.get(SINK_KEY)
        return sink if sink is not None and sink.writable() else None

    def _known_ids(self, sink: JournalSink) -> set[str] | None:
        """Every call id in the file and the journal (None: too many to keep). Read
        once; again after a rollback or a dropped batch (it may name a call that never
        landed). Call under the lock."""
        epoch = (self._db.rollbacks, sink.discards)
        known = self._db.state.get(_IDS)
        if isinstance(known, _Ids) and known.epoch == epoch:
            return known.ids
        rows = self.db.fetchall(f"SELECT id FROM tool_calls LIMIT {_MAX_IDS + 1}")
        ids = None if len(rows) > _MAX_IDS else {cid for (cid,) in rows}
        self._db.state[_IDS] = _Ids(ids, (self._db.rollbacks, sink.discards))
        return ids

    def _inserted(self, con: duckdb.DuckDBPyConnection) -> int:
        """A row just went into the table inside ``con``'s transaction: the table's
        rows now (read once per connection, and again after a rollback). Call under
        the lock."""
        known = self._db.state.get(_ROWS)
        if isinstance(known, _Rows) and known.epoch == self._db.rollbacks:
            known.rows += 1
            return known.rows
        row = con.execute("SELECT count(*) FROM tool_calls").fetchone()  # counts this one
        rows = row[0] if row else 0
        self._db.state[_ROWS] = _Rows(rows, self._db.rollbacks)
        return rows

    def _index_if_big(self, rows: int, con: duckdb.DuckDBPyConnection | None = None) -> None:
        """The table holds ``rows`` rows (those the journal holds for it included): if
        that is :data:`INDEX_FROM` or more, make sure the id index exists, inside
        ``con``'s transaction (or on its own). Below that, no statement; above, one per
        connection (``IF NOT EXISTS``: once made, it costs a look at the catalog and
        writes nothing). Call under the lock."""
        if rows < INDEX_FROM:
            return
        known = self._db.state.get(_INDEXED)
        if isinstance(known, _Indexed) and known.epoch == self._db.rollbacks:
            return
        if con is not None:
            con.execute(_CREATE_INDEX)
        else:
            self._db.execute(_CREATE_INDEX)
        # A rollback of con's transaction changes the epoch: then it is made again.
        self._db.state[_INDEXED] = _Indexed(self._db.rollbacks)

    def _noted(self, tool_call_id: str) -> None:
        """A call was inserted through DuckDB: the ids in memory have it too."""
        known = self._db.state.get(_IDS)
        if isinstance(known, _Ids) and known.ids is not None:
            known.ids.add(tool_call_id)

    @override
    def batch(self) -> AbstractContextManager[None]:
        sink = self._db.state.get(SINK_KEY)
        return sink.batch() if sink is not None else self.transaction()

    @override
    def insert(self, rec: ToolCallRecord) -> ToolCallRecord:
        if not isinstance(rec.id, str) or not rec.id:
            raise InvalidInputError("a tool call id must be a non-empty string")
        if not isinstance(rec.tool_name, str):
            raise InvalidInputError("tool_name must be a string")
        _check_status(rec.status)
        for what in ("run_id", "session_id", "executor", "error", "late_error"):
            _optional_str(getattr(rec, what), what)
        if isinstance(rec.attempts, bool) or not isinstance(rec.attempts, int):
            raise InvalidInputError("attempts must be an int")
        _check_time(rec.lease_until, "lease_until")
        _check_time(rec.deadline_at, "deadline_at")
        now = time.time()
        created_at = rec.created_at or now
        # the caller's record is stamped only once the insert succeeded
        row = _row(replace(rec, created_at=created_at, updated_at=now))
        if self._journal_insert(rec.id, row):
            rec.created_at = created_at
            rec.updated_at = now
            return rec
        with self.db.transaction() as con:
            if con.execute("SELECT 1 FROM tool_calls WHERE id = ?", [rec.id]).fetchone():
                raise InvalidInputError(f"tool call {rec.id!r} already exists")
            con.execute(
                f"INSERT INTO tool_calls ({_WRITE_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row
            )
            self._noted(rec.id)
            self._index_if_big(self._inserted(con), con)
        rec.created_at = created_at
        rec.updated_at = now
        return rec

    def _journal_insert(self, tool_call_id: str, row: list[Any]) -> bool:
        """Insert the row through the journal if memory knows the id is new (raises if
        it knows the id exists); False: the file must be asked."""
        with self._db.lock:
            sink = self._sink()
            ids = None if sink is None else self._known_ids(sink)
            if sink is None or ids is None:
                return False
            if tool_call_id in ids:
                raise InvalidInputError(f"tool call {tool_call_id!r} already exists")
            # The ids are the table's once the journal is folded: the index comes
            # before the row that makes them INDEX_FROM (if it fails, nothing was written).
            self._index_if_big(len(ids) + 1)
            sink.write({"k": [[*row, False]]})
            ids.add(tool_call_id)
        return True

    @override
    def get(self, tool_call_id: str) -> ToolCallRecord | None:
        sink = self._db.state.get(SINK_KEY)
        if sink is not None:
            with self._db.lock:
                journaled = sink.tool_call_row(tool_call_id)
                if journaled is not None:
                    return _record(journaled[:8])
                ids = self._known_ids(sink)
                if ids is not None and tool_call_id not in ids:
                    return None
        # The journal holds no row of this call: the file has its truth.
        row = self._migrated().fetchone(
            f"SELECT {_COLS} FROM tool_calls WHERE id = ?", [tool_call_id]
        )
        return _record(row) if row else None

    @override
    def transition(
        self,
        tool_call_id: str,
        expect: Collection[str],
        status: str,
        *,
        executor: str | None = None,
        claim: bool = False,
        result: Any = None,
        error: str | None = None,
        approval: dict[str, Any] | None = None,
        lease_until: float | None = None,
    ) -> ToolCallRecord | None:
        # Everything that can be refused is refused before the transaction: whether a
        # move is allowed depends on the request only (each expected status must allow
        # it), never on what the call's status happens to be.
        expected = _check_move(expect, status)
        _optional_str(executor, "executor")
        _optional_str(error, "error")
        if claim and not executor:
            raise InvalidInputError("a claim names its executor")
        _check_time(lease_until, "lease_until")
        if lease_until is not None and not claim:
            raise InvalidInputError("only a claim sets a lease (renew one with renew())")
        if approval is not None and not isinstance(approval, dict):
            raise InvalidInputError("approval must be a dict or None")
        _pack(result, "tool call result")
        _pack(approval, "tool call approval")

        move = (expected, status, executor, claim, result, error, approval, lease_until)
        with self._db.lock:
            sink = self._sink()
            journaled = None if sink is None else sink.tool_call_row(tool_call_id)
            if sink is not None and journaled is not None:
                # The journal holds the row (this ledger wrote it): move it there.
                moved = _record(journaled[:8])
                if not _move(moved, *move):
                    return None
                sink.write({"k": [[*_row(moved), False]]})
                return moved
        rollbacks = self.db.rollbacks
        try:
            with self.db.transaction() as con:
                rec = _row_in(con, tool_call_id)
                if rec is None:
                    return None
                old_status = rec.status
                if not _move(rec, *move):
                    return None
                _update(con, rec, old_status)
        except duckdb.TransactionException as exc:
            # Another connection to the same file moved the call first (DuckDB refuses
            # the second write to a row): the compare failed. Only when this call's
            # transaction was the outermost and was rolled back; inside a caller's block
            # the block is spoiled and the error is theirs.
            if _is_conflict(exc) and self.db.rollbacks > rollbacks:
                return None
            raise
        return rec

    @override
    def renew(self, tool_call_id: str, executor: str, lease_until: float) -> ToolCallRecord | None:
        if not isinstance(executor, str) or not executor:
            raise InvalidInputError("a renewal names its executor")
        _check_time(lease_until, "lease_until")
        if lease_until is None:
            raise InvalidInputError("a renewal needs lease_until")
        with self.db.transaction() as con:
            rec = _row_in(con, tool_call_id)
            if rec is None:
                return None
            if rec.status != "executing" or rec.executor != executor:
                return None
            rec.lease_until = float(lease_until)
            rec.updated_at = time.time()
            _update(con, rec, "executing")
        return rec

    @override
    def set_deadline(
        self,
        tool_call_id: str,
        deadline_at: float | None,
        *,
        expect: Collection[str] | None = None,
    ) -> ToolCallRecord | None:
        _check_time(deadline_at, "deadline_at")
        expected = [s for s in TOOL_CALL_STATUSES if s not in TOOL_CALL_FINISHED]
        if expect is not None:
            expected = [s for s in _statuses(expect) if s not in TOOL_CALL_FINISHED]
        with self.db.transaction() as con:
            rec = _row_in(con, tool_call_id)
            if rec is None:
                return None
            if rec.status not in expected:
                return None
            rec.deadline_at = None if deadline_at is None else float(deadline_at)
            rec.updated_at = time.time()
            _update(con, rec, rec.status)
        return rec

    @override
    def expire(self, now: float) -> list[ToolCallRecord]:
        _check_time(now, "now")
        moved = []
        with self.db.transaction() as con:
            for rec in self._due_rows(con, now):
                if rec.deadline_at is None or rec.deadline_at > now:
                    continue
                old_status = rec.status
                rec.status = "cancelled-by-timeout"
                rec.lease_until = None
                if old_status == "awaiting-approval":
                    rec.error = "timed out: the approval expired unanswered"
                    rec.approval = {
                        **(rec.approval or {}),
                        "decision": "timeout",
                        "answered_by": None,
                        "answered_at": now,
                    }
                else:
                    rec.error = "timed out: the call passed its deadline"
                rec.updated_at = time.time()
                _update(con, rec, old_status)
                moved.append(rec)
        return moved

    @override
    def lapse(self, now: float) -> list[ToolCallRecord]:
        _check_time(now, "now")
        moved = []
        with self.db.transaction() as con:
            for rec in self._due_rows(con, now):
                if rec.status != "executing" or rec.lease_until is None:
                    continue
                if rec.lease_until > now:
                    continue
                rec.status = "pending"
                rec.executor = None
                rec.lease_until = None
                rec.updated_at = time.time()
                _update(con, rec, "executing")
                moved.append(rec)
        return moved

    def _due_rows(self, con: duckdb.DuckDBPyConnection, now: float) -> list[ToolCallRecord]:
        rows = con.execute(
            f"SELECT {_COLS} FROM tool_calls WHERE due_at IS NOT NULL AND due_at <= ?", [now]
        ).fetchall()
        return sorted((_record(r) for r in rows), key=lambda r: (r.created_at, r.id))

    @override
    def next_deadline(self) -> float | None:
        row = self.db.fetchone("SELECT min(due_at) FROM tool_calls")
        return None if row is None or row[0] is None else float(row[0])

    @override
    def store_late(
        self, tool_call_id: str, *, result: Any = None, error: str | None = None
    ) -> ToolCallRecord | None:
        _optional_str(error, "error")
        _pack(result, "late tool call result")
        with self.db.transaction() as con:
            rec = _row_in(con, tool_call_id)
            if rec is None:
                return None
            if not rec.cancelled:
                raise InvalidInputError(
                    f"tool call {tool_call_id!r} is {rec.status!r}: only a cancelled call "
                    "keeps a late result"
                )
            rec.late_result = result
            rec.late_error = error
            rec.late_at = rec.updated_at = time.time()
            _update(con, rec, rec.status)
        return rec

    @override
    def rows(
        self,
        status: str | Iterable[str] | None = None,
        *,
        run_id: str | None = None,
        tool_names: Iterable[str] | None = None,
    ) -> list[ToolCallRecord]:
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            where.append("status IN (SELECT unnest(?::VARCHAR[]))")
            params.append(_statuses(status))
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        if tool_names is not None:
            names = [tool_names] if isinstance(tool_names, str) else list(tool_names)
            where.append("tool_name IN (SELECT unnest(?::VARCHAR[]))")
            params.append(names)
        if self._db.known_empty("tool_calls"):
            return []
        sql = f"SELECT {_COLS} FROM tool_calls"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self.db.fetchall(sql, params)
        return sorted((_record(r) for r in rows), key=lambda r: (r.created_at, r.id))

    @override
    def audit(
        self, tool_call_id: str, decision: str, *, by: str | None, reason: str | None = None
    ) -> ToolCallAudit:
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise InvalidInputError("a tool call id must be a non-empty string")
        if not isinstance(decision, str) or not decision:
            raise InvalidInputError("decision must be a non-empty string")
        _optional_str(by, "by")
        _optional_str(reason, "reason")
        at = time.time()
        blob = _pack({"decision": decision, "by": by, "reason": reason}, "audit row")
        with self.db.transaction() as con:
            row = con.execute("SELECT max(seq) FROM tool_call_audit").fetchone()
            seq = (row[0] if row and row[0] is not None else 0) + 1
            con.execute(
                f"INSERT INTO tool_call_audit ({_AUDIT_COLS}) VALUES (?, ?, ?, ?)",
                [seq, tool_call_id, at, blob],
            )
        return ToolCallAudit(
            seq=seq, tool_call_id=tool_call_id, decision=decision, by=by, reason=reason, at=at
        )

    @override
    def audit_rows(self, tool_call_id: str | None = None) -> list[ToolCallAudit]:
        if tool_call_id is None:
            rows = self.db.fetchall(f"SELECT {_AUDIT_COLS} FROM tool_call_audit ORDER BY seq")
        else:
            rows = self.db.fetchall(
                f"SELECT {_AUDIT_COLS} FROM tool_call_audit WHERE tool_call_id = ? ORDER BY seq",
                [tool_call_id],
            )
        return [_audit(r) for r in rows]
