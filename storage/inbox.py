"""The persistent agent's inbox: the ``inbox`` table (seed 003 §2.1).

Messages sent to a persistent agent land here first; the agent's loop takes pending
rows, answers them, and writes the reply back onto the rows. Layout::

    inbox(id VARCHAR, sender VARCHAR, status VARCHAR, created_at DOUBLE, info BLOB)

``status`` is ``pending`` → ``processing`` → ``done`` | ``failed``. Only the columns the
loop filters or orders on are columns; the content, the reply, the error, the attempt
counter and any metadata live in one msgpack ``info`` blob (DuckDB spends a few KiB
per non-empty column). No PRIMARY KEY (an ART index costs a block and turns updates
into delete + insert): the store has one writer, and id uniqueness is checked inside
the inserting transaction, which is what makes ``insert`` idempotent on the id.

Storage does not interpret the content: the runtime validates it before it gets here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import duckdb
from thinkray.storage.codec import pack as _pack
from thinkray.storage.codec import unpack as _unpack
from thinkray.storage.db import Database, MigratedStore, Migration
from thinkray.storage.errors import (  # re-exported: the errors live in thinkray.storage.errors
    InboxMessageNotFoundError as InboxMessageNotFoundError,
)
from thinkray.storage.protocols import InboxStore
from thinkray.storage.records import INBOX_FINISHED, INBOX_STATUSES, InboxRow
from thinkray.storage.types import InvalidInputError
from typing_extensions import override

MAX_ID_LENGTH = 256


def _v1(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        """
        CREATE TABLE IF NOT EXISTS inbox (
            id VARCHAR NOT NULL,
            sender VARCHAR,
            status VARCHAR NOT NULL,
            created_at DOUBLE NOT NULL,
            info BLOB NOT NULL
        )
        """
    )


MIGRATIONS = [Migration(1, _v1)]
_COLS = "id, sender, status, created_at, info"


_INFO_KEYS = ("content", "reply", "error", "metadata", "attempts", "updated_at")


def _row(values: Sequence[Any]) -> InboxRow:
    mid, sender, status, created_at, blob = values
    info = _unpack(blob) or {}
    return InboxRow(
        id=mid,
        sender=sender,
        status=status,
        created_at=float(created_at),
        content=info.get("content"),
        reply=info.get("reply"),
        error=info.get("error"),
        metadata=dict(info.get("metadata") or {}),
        attempts=int(info.get("attempts", 0)),
        updated_at=float(info.get("updated_at", created_at)),
        extra={k: v for k, v in info.items() if k not in _INFO_KEYS},
    )


def _info(row: InboxRow) -> dict[str, Any]:
    info = dict(row.extra)
    info.update(
        content=row.content,
        reply=row.reply,
        error=row.error,
        metadata=row.metadata,
        attempts=row.attempts,
        updated_at=row.updated_at,
    )
    return info


def _check_status(status: str) -> None:
    if status not in INBOX_STATUSES:
        raise InvalidInputError(f"unknown inbox status {status!r}; one of {INBOX_STATUSES}")


def _check_id(message_id: Any) -> None:
    if not isinstance(message_id, str) or not message_id or len(message_id) > MAX_ID_LENGTH:
        raise InvalidInputError(
            f"message id must be a non-empty string of at most {MAX_ID_LENGTH} characters"
        )


class DuckDBInboxStore(MigratedStore, InboxStore):
    """:class:`~thinkray.storage.protocols.InboxStore` on a :class:`Database` (the
    contract is the protocol's). Synchronous; one writer (the bound actor). Keep one
    per database (:meth:`~thinkray.storage.protocols.Stores.inbox`): it keeps
    ``created_at`` strictly increasing, which is what orders the inbox."""

    component = "inbox"
    migrations = MIGRATIONS

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        row = db.fetchone("SELECT max(created_at) FROM inbox")
        self._last_ts: float = (row[0] if row else None) or 0.0

    def _now(self) -> float:
        # Strictly increasing: created_at orders the inbox (oldest first) totally.
        now = time.time()
        if now <= self._last_ts:
            now = self._last_ts + 1e-6
        self._last_ts = now
        return now

    # -- writes ------------------------------------------------------------------------

    def insert(
        self,
        content: Any,
        *,
        sender: str | None = None,
        message_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> tuple[InboxRow, bool]:
        """Insert a pending row. Returns ``(row, created)``; ``created`` is False when
        the id already existed (the stored row is returned unchanged)."""
        mid = message_id if message_id is not None else f"inb_{uuid.uuid4().hex[:20]}"
        _check_id(mid)
        if sender is not None and not isinstance(sender, str):
            raise InvalidInputError("sender must be a string or None")
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidInputError("metadata must be a dict or None")
        with self.db.transaction() as con:
            existing = con.execute(f"SELECT {_COLS} FROM inbox WHERE id = ?", [mid]).fetchone()
            if existing is not None:
                return _row(existing), False
            now = self._now()
            row = InboxRow(
                id=mid,
                sender=sender,
                status="pending",
                created_at=now,
                content=content,
                metadata=dict(metadata or {}),
                updated_at=now,
            )
            blob = _pack(_info(row), "inbox content")
            con.execute(
                f"INSERT INTO inbox ({_COLS}) VALUES (?, ?, 'pending', ?, ?)",
                [mid, sender, now, blob],
            )
        return row, True

    def claim(self, ids: Iterable[str]) -> list[InboxRow]:
        """Mark the given rows ``processing`` if they are still ``pending``; returns the
        rows claimed, oldest first, with ``attempts`` incremented."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return []
        claimed: list[InboxRow] = []
        with self.db.transaction() as con:
            rows = con.execute(
                f"SELECT {_COLS} FROM inbox WHERE status = 'pending' "
                "AND id IN (SELECT unnest(?::VARCHAR[])) ORDER BY created_at, id",
                [wanted],
            ).fetchall()
            now = time.time()
            for values in rows:
                row = _row(values)
                row.status = "processing"
                row.attempts += 1
                row.updated_at = now
                self._write(con, row)
                claimed.append(row)
        return claimed

    def complete(
        self, ids: Iterable[str], reply: str | None, *, extra: dict[str, Any] | None = None
    ) -> list[InboxRow]:
        """Mark rows ``done`` with ``reply``. Rows already finished are left alone."""
        return self._finish(ids, "done", reply=reply, error=None, extra=extra)

    def fail(self, ids: Iterable[str], error: str) -> list[InboxRow]:
        """Mark rows ``failed`` with ``error``. Rows already finished are left alone."""
        return self._finish(ids, "failed", reply=None, error=str(error), extra=None)

    def _finish(
        self,
        ids: Iterable[str],
        status: str,
        *,
        reply: str | None,
        error: str | None,
        extra: dict[str, Any] | None,
    ) -> list[InboxRow]:
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return []
        if extra is not None:
            _pack(extra, "extra")
        done: list[InboxRow] = []
        with self.db.transaction() as con:
            rows = con.execute(
                f"SELECT {_COLS} FROM inbox WHERE status NOT IN ('done', 'failed') "
                "AND id IN (SELECT unnest(?::VARCHAR[]))",
                [wanted],
            ).fetchall()
            now = time.time()
            for values in rows:
                row = _row(values)
                row.status = status
                row.reply = reply
                row.error = error
                row.updated_at = now
                if extra:
                    row.extra.update(extra)
                self._write(con, row)
                done.append(row)
        return done

    def requeue_processing(self, *, max_attempts: int | None = None) -> tuple[int, int]:
        """Rows left ``processing`` go back to ``pending``; with ``max_attempts``, rows
        that were already claimed that many times are failed instead. Returns
        ``(requeued, failed)``."""
        requeued = failed = 0
        with self.db.transaction() as con:
            rows = con.execute(f"SELECT {_COLS} FROM inbox WHERE status = 'processing'").fetchall()
            now = time.time()
            for values in rows:
                row = _row(values)
                row.updated_at = now
                if max_attempts is not None and row.attempts >= max_attempts:
                    row.status = "failed"
                    row.error = (
                        f"gave up after {row.attempts} attempts: the agent stopped while "
                        "processing this message each time"
                    )
                    failed += 1
                else:
                    row.status = "pending"
                    requeued += 1
                self._write(con, row)
        return requeued, failed

    @override
    def delete(self, ids: Iterable[str]) -> int:
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return 0
        with self.db.transaction() as con:
            (n,) = con.execute(
                "SELECT count(*) FROM inbox WHERE id IN (SELECT unnest(?::VARCHAR[]))", [wanted]
            ).fetchone() or (0,)
            con.execute("DELETE FROM inbox WHERE id IN (SELECT unnest(?::VARCHAR[]))", [wanted])
        return int(n)

    def purge(self, *, older_than: float | None = None) -> int:
        """Delete finished rows (optionally only those finished before ``older_than``,
        epoch seconds). Pending and processing rows are never purged."""
        finished = self.rows(status=list(INBOX_FINISHED))
        doomed = [r.id for r in finished if older_than is None or r.updated_at < older_than]
        return self.delete(doomed)

    @staticmethod
    def _write(con: duckdb.DuckDBPyConnection, row: InboxRow) -> None:
        con.execute(
            "UPDATE inbox SET status = ?, info = ? WHERE id = ?",
            [row.status, _pack(_info(row), "inbox row"), row.id],
        )

    # -- reads -------------------------------------------------------------------------

    @override
    def get(self, message_id: str) -> InboxRow | None:
        row = self.db.fetchone(f"SELECT {_COLS} FROM inbox WHERE id = ?", [message_id])
        return _row(row) if row else None

    @override
    def require(self, message_id: str) -> InboxRow:
        row = self.get(message_id)
        if row is None:
            raise InboxMessageNotFoundError(f"inbox message {message_id!r} not found")
        return row

    def pending(self, limit: int | None = None) -> list[InboxRow]:
        """Pending rows, oldest first."""
        sql = f"SELECT {_COLS} FROM inbox WHERE status = 'pending' ORDER BY created_at, id"
        if limit is not None:
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
                raise InvalidInputError("limit must be a positive int")
            sql += f" LIMIT {limit}"
        return [_row(r) for r in self.db.fetchall(sql)]

    def rows(self, status: str | Iterable[str] | None = None) -> list[InboxRow]:
        """Rows, oldest first, optionally of some statuses."""
        if status is None:
            rows = self.db.fetchall(f"SELECT {_COLS} FROM inbox ORDER BY created_at, id")
        else:
            statuses = [status] if isinstance(status, str) else list(status)
            for s in statuses:
                _check_status(s)
            rows = self.db.fetchall(
                f"SELECT {_COLS} FROM inbox WHERE status IN (SELECT unnest(?::VARCHAR[])) "
                "ORDER BY created_at, id",
                [statuses],
            )
        return [_row(r) for r in rows]

    @override
    def count(self, status: str | None = None) -> int:
        if status is None:
            row = self.db.fetchone("SELECT count(*) FROM inbox")
        else:
            _check_status(status)
            row = self.db.fetchone("SELECT count(*) FROM inbox WHERE status = ?", [status])
        return int(row[0]) if row else 0

    @override
    def has_pending(self) -> bool:
        return self.db.fetchone("SELECT 1 FROM inbox WHERE status = 'pending' LIMIT 1") is not None
