"""Background jobs (async tool calls, seed 003 §1.5): the ``jobs`` table.

A job is work an async tool started and returned from at once (a worker agent run,
say); the model polls it with a ``check_job`` tool, or a listener pushes its result
into the conversation. Layout::

    jobs(id VARCHAR, status VARCHAR, updated_at DOUBLE, info BLOB)

``status`` is ``running`` → ``completed`` | ``failed`` | ``cancelled``; a job found
``running`` by a new incarnation of the agent (the process died) becomes
``interrupted``. Everything else (kind, input, result, error, correlation ids, the
last progress report, a late result kept after cancellation) is in the msgpack
``info`` blob; no PRIMARY KEY, ids are checked inside the insert.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import duckdb
from thinkray.storage.codec import pack as _pack
from thinkray.storage.codec import unpack as _unpack
from thinkray.storage.db import MigratedStore, Migration
from thinkray.storage.protocols import JobStore
from thinkray.storage.records import JOB_STATUSES, JobRecord
from thinkray.storage.types import InvalidInputError
from typing_extensions import override


def _v1(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        """
        CREATE TABLE IF NOT EXISTS jobs (
            id VARCHAR NOT NULL,
            status VARCHAR NOT NULL,
            updated_at DOUBLE NOT NULL,
            info BLOB NOT NULL
        )
        """
    )


MIGRATIONS = [Migration(1, _v1)]
_COLS = "id, status, updated_at, info"


def _record(values: Sequence[Any]) -> JobRecord:
    jid, status, updated_at, blob = values
    info = _unpack(blob) or {}
    return JobRecord(
        id=jid,
        status=status,
        kind=info.get("kind", ""),
        input=info.get("input"),
        result=info.get("result"),
        error=info.get("error"),
        parent=dict(info.get("parent") or {}),
        created_at=float(info.get("created_at", updated_at)),
        updated_at=float(updated_at),
        progress=info.get("progress"),
        message=info.get("message"),
        late=info.get("late"),
    )


def _info(rec: JobRecord) -> dict[str, Any]:
    return {
        "kind": rec.kind,
        "input": rec.input,
        "result": rec.result,
        "error": rec.error,
        "parent": rec.parent,
        "created_at": rec.created_at,
        "progress": rec.progress,
        "message": rec.message,
        "late": rec.late,
    }


def _check_status(status: str) -> None:
    if status not in JOB_STATUSES:
        raise InvalidInputError(f"unknown job status {status!r}; one of {JOB_STATUSES}")


class DuckDBJobStore(MigratedStore, JobStore):
    """:class:`~thinkray.storage.protocols.JobStore` on a :class:`Database` (the
    contract is the protocol's). Synchronous; one writer. Get one from
    :meth:`~thinkray.storage.protocols.Stores.jobs`."""

    component = "jobs"
    migrations = MIGRATIONS

    @override
    def insert(self, rec: JobRecord) -> JobRecord:
        _check_status(rec.status)
        now = time.time()
        rec.created_at = rec.created_at or now
        rec.updated_at = now
        blob = _pack(_info(rec), "job")
        with self.db.transaction() as con:
            if con.execute("SELECT 1 FROM jobs WHERE id = ?", [rec.id]).fetchone():
                raise InvalidInputError(f"job {rec.id!r} already exists")
            con.execute(
                f"INSERT INTO jobs ({_COLS}) VALUES (?, ?, ?, ?)",
                [rec.id, rec.status, rec.updated_at, blob],
            )
        return rec

    @override
    def update(
        self,
        job_id: str,
        status: str,
        *,
        result: Any = None,
        error: str | None = None,
    ) -> JobRecord | None:
        _check_status(status)
        with self.db.transaction() as con:
            row = con.execute(f"SELECT {_COLS} FROM jobs WHERE id = ?", [job_id]).fetchone()
            if row is None:
                return None
            rec = _record(row)
            rec.status = status
            rec.result = result
            rec.error = error
            rec.updated_at = time.time()
            con.execute(
                "UPDATE jobs SET status = ?, updated_at = ?, info = ? WHERE id = ?",
                [status, rec.updated_at, _pack(_info(rec), "job result"), job_id],
            )
        return rec

    @override
    def set_progress(
        self, job_id: str, progress: Any = None, message: str | None = None
    ) -> JobRecord | None:
        with self.db.transaction() as con:
            row = con.execute(f"SELECT {_COLS} FROM jobs WHERE id = ?", [job_id]).fetchone()
            if row is None:
                return None
            rec = _record(row)
            if rec.finished:
                return rec  # a finished job's progress is final
            rec.progress, rec.message = progress, message
            rec.updated_at = time.time()
            con.execute(
                "UPDATE jobs SET updated_at = ?, info = ? WHERE id = ?",
                [rec.updated_at, _pack(_info(rec), "job progress"), job_id],
            )
        return rec

    @override
    def store_late(
        self, job_id: str, *, result: Any = None, error: str | None = None
    ) -> JobRecord | None:
        with self.db.transaction() as con:
            row = con.execute(f"SELECT {_COLS} FROM jobs WHERE id = ?", [job_id]).fetchone()
            if row is None:
                return None
            rec = _record(row)
            if rec.status != "cancelled":
                raise InvalidInputError(
                    f"job {job_id!r} is {rec.status}: only a cancelled job keeps a late result"
                )
            rec.late = {"result": result, "error": error, "at": time.time()}
            rec.updated_at = time.time()
            con.execute(
                "UPDATE jobs SET updated_at = ?, info = ? WHERE id = ?",
                [rec.updated_at, _pack(_info(rec), "late job result"), job_id],
            )
        return rec

    @override
    def get(self, job_id: str) -> JobRecord | None:
        row = self.db.fetchone(f"SELECT {_COLS} FROM jobs WHERE id = ?", [job_id])
        return _record(row) if row else None

    def rows(self, status: str | Iterable[str] | None = None) -> list[JobRecord]:
        """Jobs, oldest first."""
        if status is None:
            if self._db.known_empty("jobs"):
                return []
            rows = self.db.fetchall(f"SELECT {_COLS} FROM jobs")
        else:
            statuses = [status] if isinstance(status, str) else list(status)
            for s in statuses:
                _check_status(s)
            if self._db.known_empty("jobs"):
                return []
            rows = self.db.fetchall(
                f"SELECT {_COLS} FROM jobs WHERE status IN (SELECT unnest(?::VARCHAR[]))",
                [statuses],
            )
        return sorted((_record(r) for r in rows), key=lambda r: (r.created_at, r.id))

    def interrupt_running(self, reason: str) -> int:
        """Jobs still ``running`` belong to a dead incarnation: mark them
        ``interrupted``. Returns how many."""
        if self._db.known_empty("jobs"):
            return 0
        ids = [r[0] for r in self.db.fetchall("SELECT id FROM jobs WHERE status = 'running'")]
        for jid in ids:
            self.update(jid, "interrupted", error=reason)
        return len(ids)

    @override
    def delete(self, job_id: str) -> bool:
        with self.db.transaction() as con:
            found = con.execute("SELECT 1 FROM jobs WHERE id = ?", [job_id]).fetchone()
            con.execute("DELETE FROM jobs WHERE id = ?", [job_id])
        return found is not None
