"""Messages sent while a turn runs: the ``turn_queue`` table.

A message that arrives while its session has a turn in flight, under a busy policy
other than ``reject`` (:mod:`thinkray.runtime.agents.midturn`), is stored here before
the sender is acknowledged, so a crash or a hibernation never loses it. Layout::

    turn_queue(id VARCHAR, session_id VARCHAR, status VARCHAR, seq DOUBLE, info BLOB)

``id`` is the user message's id (unique per agent, like the messages' ids: the
idempotency key). ``status`` is ``queued`` → ``running`` → ``answered`` | ``failed``,
or from ``queued`` to ``steered`` (injected into a running turn), ``superseded`` (a
newer message replaced it under the ``latest`` policy) or ``cancelled`` (aborted,
or its session cleared or deleted). ``seq`` orders a session's queue (FIFO; an
``interrupt`` goes first). The message and what became of it live in one msgpack
``info`` blob (DuckDB spends a few KiB per non-empty column).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import duckdb
from thinkray.storage.codec import pack as _pack
from thinkray.storage.codec import unpack as _unpack
from thinkray.storage.db import Database, MigratedStore, Migration
from thinkray.storage.protocols import TurnQueueStore
from thinkray.storage.records import QUEUE_STATUSES, QUEUE_WAITING, QueuedTurn
from thinkray.storage.types import InvalidInputError

__all__ = ["DuckDBTurnQueueStore", "has_turn_queue"]

TABLE = "turn_queue"


def _v1(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        f"""
        CREATE TABLE IF NOT EXISTS {TABLE} (
            id VARCHAR NOT NULL,
            session_id VARCHAR NOT NULL,
            status VARCHAR NOT NULL,
            seq DOUBLE NOT NULL,
            info BLOB NOT NULL
        )
        """
    )


MIGRATIONS = [Migration(1, _v1)]
AHEAD = 1e12
_COLS = "id, session_id, status, seq, info"
_FIELDS = (
    "message",
    "mode",
    "run_id",
    "assistant_id",
    "attempts",
    "created_at",
    "updated_at",
    "target_run",
    "outcome",
)


def has_turn_queue(db: Database) -> bool:
    """Whether the database has the table (a file that never queued has none: reading
    it must not create one)."""
    return db.has_component(TABLE)


def _row(values: Sequence[Any]) -> QueuedTurn:
    mid, sid, status, seq, blob = values
    info = _unpack(blob) or {}
    return QueuedTurn(
        id=mid,
        session_id=sid,
        status=status,
        seq=float(seq),
        message=dict(info.get("message") or {}),
        mode=str(info.get("mode", "queue")),
        run_id=str(info.get("run_id", "")),
        assistant_id=str(info.get("assistant_id", "")),
        attempts=int(info.get("attempts", 0)),
        created_at=float(info.get("created_at", 0.0)),
        updated_at=float(info.get("updated_at", 0.0)),
        target_run=info.get("target_run"),
        outcome=dict(info.get("outcome") or {}),
    )


def _info(row: QueuedTurn) -> dict[str, Any]:
    return {name: getattr(row, name) for name in _FIELDS}


class DuckDBTurnQueueStore(MigratedStore, TurnQueueStore):
    """:class:`~thinkray.storage.protocols.TurnQueueStore` on a :class:`Database`.
    Synchronous, one writer (the bound actor); keep one per database
    (:meth:`~thinkray.storage.protocols.Stores.turn_queue`)."""

    component = TABLE
    migrations = MIGRATIONS

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        row = db.fetchone(
            f"SELECT max(CASE WHEN seq < 0 THEN seq + {AHEAD} ELSE seq END) FROM {TABLE}"
        )
        self._last: float = float((row[0] if row else None) or 0.0)

    def add(self, row: QueuedTurn, *, first: bool = False) -> tuple[QueuedTurn, bool]:
        """Store ``row`` as ``queued`` at the end of the queue (``first``: ahead of
        every row). Idempotent on the id: ``(stored, False)`` when it exists, whatever
        its status (the first write wins). Returns after the commit."""
        if not isinstance(row.id, str) or not row.id or len(row.id) > 256:
            raise InvalidInputError("a queued message needs an id of 1-256 characters")
        if row.status not in QUEUE_STATUSES:
            raise InvalidInputError(f"unknown queue status {row.status!r}")
        with self.db.transaction() as con:
            found = con.execute(f"SELECT {_COLS} FROM {TABLE} WHERE id = ?", [row.id]).fetchone()
            if found is not None:
                return _row(found), False
            self._last += 1.0
            # Rows sent ``first`` go in a band ahead of the others, in order among
            # themselves (two interrupts are answered in the order they came).
            row.seq = self._last - AHEAD if first else self._last
            row.created_at = row.updated_at = time.time()
            blob = _pack(_info(row), "queued message")
            con.execute(
                f"INSERT INTO {TABLE} ({_COLS}) VALUES (?, ?, ?, ?, ?)",
                [row.id, row.session_id, row.status, row.seq, blob],
            )
        return row, True

    def get(self, message_id: str) -> QueuedTurn | None:
        """One row (None: unknown)."""
        found = self.db.fetchone(f"SELECT {_COLS} FROM {TABLE} WHERE id = ?", [message_id])
        return _row(found) if found else None

    def waiting(self, session_id: str | None = None) -> list[QueuedTurn]:
        """``queued`` rows (of one session, or all), first to run first."""
        sql = f"SELECT {_COLS} FROM {TABLE} WHERE status = 'queued'"
        params: list[Any] = []
        if session_id is not None:
            sql += " AND session_id = ?"
            params.append(session_id)
        return [_row(r) for r in self.db.fetchall(sql + " ORDER BY seq, id", params)]

    def rows(self, session_id: str | None = None) -> list[QueuedTurn]:
        """Every row (of one session), in queue order."""
        sql = f"SELECT {_COLS} FROM {TABLE}"
        params: list[Any] = []
        if session_id is not None:
            sql += " WHERE session_id = ?"
            params.append(session_id)
        return [_row(r) for r in self.db.fetchall(sql + " ORDER BY seq, id", params)]

    def move(
        self,
        ids: Iterable[str],
        status: str,
        *,
        only_from: Iterable[str] = QUEUE_WAITING,
        **fields: Any,
    ) -> list[QueuedTurn]:
        """Move the rows still in one of ``only_from`` to ``status`` (``fields``
        updated; ``attempts=+1`` counts a claim), in one transaction. Returns the rows
        moved: a row moved by another call first is not moved twice."""
        if status not in QUEUE_STATUSES:
            raise InvalidInputError(f"unknown queue status {status!r}")
        wanted = list(dict.fromkeys(ids))
        states = list(only_from)
        if not wanted:
            return []
        moved: list[QueuedTurn] = []
        with self.db.transaction() as con:
            found = con.execute(
                f"SELECT {_COLS} FROM {TABLE} WHERE id IN (SELECT unnest(?::VARCHAR[])) "
                "AND status IN (SELECT unnest(?::VARCHAR[])) ORDER BY seq, id",
                [wanted, states],
            ).fetchall()
            for values in found:
                row = _row(values)
                row.status = status
                row.updated_at = time.time()
                for name, value in fields.items():
                    if name == "attempts":
                        row.attempts += int(value)
                    else:
                        setattr(row, name, value)
                con.execute(
                    f"UPDATE {TABLE} SET status = ?, info = ? WHERE id = ?",
                    [row.status, _pack(_info(row), "queued message"), row.id],
                )
                moved.append(row)
        return moved

    def requeue_running(self, *, max_attempts: int) -> tuple[list[QueuedTurn], list[QueuedTurn]]:
        """Rows a dead incarnation left ``running`` go back to ``queued`` (ahead of the
        rest of their session's queue: they were first), or ``failed`` once they were
        started ``max_attempts`` times (a message that kills the agent cannot
        crash-loop it). Returns ``(requeued, failed)``."""
        found = [
            _row(r)
            for r in self.db.fetchall(f"SELECT {_COLS} FROM {TABLE} WHERE status = 'running'")
        ]
        spent = [r.id for r in found if r.attempts >= max_attempts]
        again = [r.id for r in found if r.attempts < max_attempts]
        error = (
            f"gave up after {max_attempts} attempts: the agent stopped while answering this "
            "message each time"
        )
        with self.db.transaction():
            failed = self.move(
                spent, "failed", only_from=("running",), outcome={"status": "error", "error": error}
            )
            requeued = self.move(again, "queued", only_from=("running",))
        return requeued, failed

    def count(self, status: str | None = None) -> int:
        """How many rows (of this status)."""
        if status is None:
            row = self.db.fetchone(f"SELECT count(*) FROM {TABLE}")
        else:
            row = self.db.fetchone(f"SELECT count(*) FROM {TABLE} WHERE status = ?", [status])
        return int(row[0]) if row else 0
