"""Durable fibers and scheduled tasks: the ``fibers`` and ``schedules`` tables.

A *fiber* is a long-running method call that survives eviction: its row records the
method, the payload, the attempt counter and the last checkpoint the method stashed, so
a later incarnation of the actor can restart it (``thinkray.runtime.durable.fibers``). A *schedule* is a
method call due at a time: once, every N seconds, or on a cron expression
(``thinkray.runtime.durable.schedules``); a Ray-side waker only needs :meth:`DuckDBFiberStore.next_due_at`.

Layout: DuckDB spends a few KiB per non-empty column per table, so each table keeps
only the columns that are filtered or written on their own (``status``/``updated_at``
for fibers, ``next_run_at`` for schedules, the hot ``checkpoint`` blob) and puts every
other field in one msgpack ``info`` blob. There is no PRIMARY KEY: an ART index costs a
16 KiB block per table on disk, and ids are generated here (user-supplied ids are
checked inside the insert transaction).

Times are epoch seconds (``time.time()``). Cron expressions are evaluated in UTC.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
from thinkray.storage.codec import pack, unpack
from thinkray.storage.db import Database, MigratedStore, Migration
from thinkray.storage.errors import (  # re-exported: the errors live in thinkray.storage.errors
    FiberNotFoundError as FiberNotFoundError,
)
from thinkray.storage.errors import InvalidInputError
from thinkray.storage.errors import (
    ScheduleNotFoundError as ScheduleNotFoundError,
)
from thinkray.storage.protocols import FiberStore
from thinkray.storage.records import (
    FIBER_STATUSES,
    SCHEDULE_KINDS,
    FiberRecord,
    FiberStatus,
    ScheduleKind,
    ScheduleRecord,
)
from typing_extensions import override

# -- schema ----------------------------------------------------------------------------


def _v1(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        """
        CREATE TABLE IF NOT EXISTS fibers (
            id VARCHAR NOT NULL,
            method VARCHAR NOT NULL,
            status VARCHAR NOT NULL,
            updated_at DOUBLE NOT NULL,
            checkpoint BLOB,
            info BLOB NOT NULL
        )
        """
    )
    con.execute(
        """
        CREATE TABLE IF NOT EXISTS schedules (
            id VARCHAR NOT NULL,
            method VARCHAR NOT NULL,
            next_run_at DOUBLE,
            info BLOB NOT NULL
        )
        """
    )


MIGRATIONS = [Migration(1, _v1)]

_FIBER_COLS = "id, method, status, updated_at, checkpoint, info"
_SCHEDULE_COLS = "id, method, next_run_at, info"


def _fiber_from_row(row: tuple[Any, ...]) -> FiberRecord:
    fid, method, status, updated_at, checkpoint, info_blob = row
    info = unpack(info_blob) or {}
    return FiberRecord(
        id=fid,
        method=method,
        status=status,
        payload=info.get("payload"),
        checkpoint=unpack(checkpoint),
        attempts=int(info.get("attempts", 1)),
        max_retries=int(info.get("max_retries", 0)),
        error=info.get("error"),
        result=info.get("result"),
        created_at=float(info.get("created_at", updated_at)),
        updated_at=float(updated_at),
        recovery_handled=bool(info.get("recovery_handled", False)),
    )


_SCHEDULE_INFO_KEYS = (
    "kind",
    "payload",
    "interval_seconds",
    "cron",
    "created_at",
    "last_run_at",
    "runs",
    "failures",
    "last_error",
)


def _schedule_from_row(row: tuple[Any, ...]) -> ScheduleRecord:
    sid, method, next_run_at, info_blob = row
    info = unpack(info_blob) or {}
    return ScheduleRecord(
        id=sid,
        method=method,
        kind=info.get("kind", "once"),
        next_run_at=next_run_at,
        payload=info.get("payload"),
        interval_seconds=info.get("interval_seconds"),
        cron=info.get("cron"),
        created_at=float(info.get("created_at", 0.0)),
        last_run_at=info.get("last_run_at"),
        runs=int(info.get("runs", 0)),
        failures=int(info.get("failures", 0)),
        last_error=info.get("last_error"),
        extra={k: v for k, v in info.items() if k not in _SCHEDULE_INFO_KEYS},
    )


def _schedule_info(rec: ScheduleRecord) -> dict[str, Any]:
    info = dict(rec.extra)
    info.update(
        kind=rec.kind,
        payload=rec.payload,
        interval_seconds=rec.interval_seconds,
        cron=rec.cron,
        created_at=rec.created_at,
        last_run_at=rec.last_run_at,
        runs=rec.runs,
        failures=rec.failures,
        last_error=rec.last_error,
    )
    return info


_UNSET: Any = object()

# In Database.state: True once the file is known to hold no enabled schedule. A
# scheduler asks for what is due after every run and wake; most agents never schedule
# anything, so the answer is kept until a schedule is added or run (its writers).
_NONE_DUE = "fibers.none_due"


class DuckDBFiberStore(MigratedStore, FiberStore):
    """:class:`~thinkray.storage.protocols.FiberStore` on a :class:`Database` (the
    contract is the protocol's). Synchronous; one writer. Tables are created on first
    use (``db.migrate("fibers", ...)``). Get one from
    :meth:`~thinkray.storage.protocols.Stores.fibers`."""

    component = "fibers"
    migrations = MIGRATIONS

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        if db.fresh:  # a new agent's file: nothing is scheduled until it adds something
            db.state[_NONE_DUE] = True

    # -- fibers ------------------------------------------------------------------------

    @override
    def insert_fiber(
        self,
        method: str,
        payload: Any = None,
        *,
        fiber_id: str | None = None,
        max_retries: int = 3,
        status: FiberStatus = "running",
        now: float | None = None,
    ) -> FiberRecord:
        if not isinstance(method, str) or not method:
            raise InvalidInputError("fiber method must be a non-empty string")
        if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
            raise InvalidInputError("max_retries must be an int >= 0")
        _check_status(status)
        now = time.time() if now is None else now
        fid = fiber_id or f"fbr_{uuid.uuid4().hex[:20]}"
        info = {
            "payload": payload,
            "attempts": 1,
            "max_retries": max_retries,
            "error": None,
            "result": None,
            "created_at": now,
        }
        blob = pack(info, "fiber payload")
        with self.db.transaction() as con:
            if con.execute("SELECT 1 FROM fibers WHERE id = ?", [fid]).fetchone():
                raise InvalidInputError(f"fiber {fid!r} already exists")
            con.execute(
                f"INSERT INTO fibers ({_FIBER_COLS}) VALUES (?, ?, ?, ?, NULL, ?)",
                [fid, method, status, now, blob],
            )
        return _fiber_from_row((fid, method, status, now, None, blob))

    @override
    def get_fiber(self, fiber_id: str) -> FiberRecord | None:
        row = self.db.fetchone(f"SELECT {_FIBER_COLS} FROM fibers WHERE id = ?", [fiber_id])
        return _fiber_from_row(row) if row else None

    def list_fibers(self, status: str | Iterable[str] | None = None) -> list[FiberRecord]:
        """Oldest first (by creation)."""
        if status is None:
            if self._db.known_empty("fibers"):
                return []
            rows = self.db.fetchall(f"SELECT {_FIBER_COLS} FROM fibers")
        else:
            statuses = [status] if isinstance(status, str) else list(status)
            for s in statuses:
                _check_status(s)
            if not statuses or self._db.known_empty("fibers"):
                return []
            marks = ", ".join("?" for _ in statuses)
            rows = self.db.fetchall(
                f"SELECT {_FIBER_COLS} FROM fibers WHERE status IN ({marks})", statuses
            )
        records = [_fiber_from_row(r) for r in rows]
        records.sort(key=lambda r: (r.created_at, r.id))
        return records

    def update_fiber(
        self,
        fiber_id: str,
        *,
        status: FiberStatus | None = None,
        attempts: int | None = None,
        error: str | None = _UNSET,
        result: Any = _UNSET,
        recovery_handled: bool | None = None,
        expect_status: str | Collection[str] | None = None,
        now: float | None = None,
    ) -> FiberRecord | None:
        """Update status and info fields in one transaction. With ``expect_status``,
        nothing is written (and ``None`` returned) unless the row currently has that
        status: a fiber cancelled meanwhile is never overwritten as completed."""
        if status is not None:
            _check_status(status)
        now = time.time() if now is None else now
        with self.db.transaction() as con:
            row = con.execute(
                f"SELECT {_FIBER_COLS} FROM fibers WHERE id = ?", [fiber_id]
            ).fetchone()
            if row is None:
                raise FiberNotFoundError(f"fiber {fiber_id!r} not found")
            if expect_status is not None:
                allowed = [expect_status] if isinstance(expect_status, str) else expect_status
                if row[2] not in allowed:
                    return None
            info = unpack(row[5]) or {}
            if attempts is not None:
                info["attempts"] = attempts
            if error is not _UNSET:
                info["error"] = error
            if result is not _UNSET:
                info["result"] = result
            if recovery_handled is not None:
                info["recovery_handled"] = recovery_handled
            blob = pack(info, "fiber result")
            new_status = status or row[2]
            con.execute(
                "UPDATE fibers SET status = ?, updated_at = ?, info = ? WHERE id = ?",
                [new_status, now, blob, fiber_id],
            )
        return _fiber_from_row((row[0], row[1], new_status, now, row[4], blob))

    @override
    def set_status(self, fiber_id: str, status: FiberStatus, **kwargs: Any) -> FiberRecord | None:
        return self.update_fiber(fiber_id, status=status, **kwargs)

    @override
    def set_checkpoint(self, fiber_id: str, data: Any, *, now: float | None = None) -> None:
        blob = pack(data, "fiber checkpoint")
        now = time.time() if now is None else now
        with self.db.transaction() as con:
            if not con.execute("SELECT 1 FROM fibers WHERE id = ?", [fiber_id]).fetchone():
                raise FiberNotFoundError(f"fiber {fiber_id!r} not found")
            con.execute(
                "UPDATE fibers SET checkpoint = ?, updated_at = ? WHERE id = ?",
                [blob, now, fiber_id],
            )

    def mark_interrupted(self, fiber_ids: Collection[str], *, now: float | None = None) -> int:
        """``running`` → ``interrupted`` for these ids, in one transaction."""
        if not fiber_ids:
            return 0
        now = time.time() if now is None else now
        ids = list(fiber_ids)
        marks = ", ".join("?" for _ in ids)
        with self.db.transaction() as con:
            (n,) = con.execute(
                f"SELECT count(*) FROM fibers WHERE status = 'running' AND id IN ({marks})", ids
            ).fetchone() or (0,)
            con.execute(
                f"UPDATE fibers SET status = 'interrupted', updated_at = ? "
                f"WHERE status = 'running' AND id IN ({marks})",
                [now, *ids],
            )
        return int(n)

    @override
    def delete_fiber(self, fiber_id: str) -> bool:
        with self.db.transaction() as con:
            found = con.execute("SELECT 1 FROM fibers WHERE id = ?", [fiber_id]).fetchone()
            if found:
                con.execute("DELETE FROM fibers WHERE id = ?", [fiber_id])
        return bool(found)

    def delete_finished(self, older_than: float, *, now: float | None = None) -> int:
        """Delete completed, failed and cancelled fibers (and interrupted ones the host
        handled) last updated more than ``older_than`` seconds ago. Returns the count."""
        cutoff = (time.time() if now is None else now) - older_than
        if self._db.known_empty("fibers"):
            return 0
        db = self.db
        # Every wake asks this, and there is seldom anything to delete: the read runs
        # alone (a transaction around it would triple its statements); the file has one
        # writer and the lock is held, so what it found is still there to delete.
        with db.lock:
            rows = db.fetchall(
                "SELECT id, status, info FROM fibers WHERE updated_at < ? "
                "AND status IN ('completed', 'failed', 'cancelled', 'interrupted')",
                [cutoff],
            )
            doomed = [
                fid
                for fid, status, info in rows
                if status != "interrupted" or (unpack(info) or {}).get("recovery_handled")
            ]
            if doomed:
                with db.transaction() as con:
                    marks = ", ".join("?" for _ in doomed)
                    con.execute(f"DELETE FROM fibers WHERE id IN ({marks})", doomed)
        return len(doomed)

    # -- schedules ---------------------------------------------------------------------

    def insert_schedule(
        self,
        method: str,
        payload: Any = None,
        *,
        kind: ScheduleKind,
        next_run_at: float | None = None,
        interval_seconds: float | None = None,
        cron: str | None = None,
        schedule_id: str | None = None,
        now: float | None = None,
    ) -> ScheduleRecord:
        """``once`` needs ``next_run_at``; ``interval`` needs ``interval_seconds`` (first
        run at ``next_run_at`` or ``now + interval``); ``cron`` needs ``cron`` (first run
        at its next fire time after ``now``)."""
        if not isinstance(method, str) or not method:
            raise InvalidInputError("schedule method must be a non-empty string")
        if kind not in SCHEDULE_KINDS:
            raise InvalidInputError(f"schedule kind must be one of {SCHEDULE_KINDS}, not {kind!r}")
        now = time.time() if now is None else now
        if kind == "once":
            if next_run_at is None:
                raise InvalidInputError("a once schedule needs next_run_at")
        elif kind == "interval":
            if (
                not isinstance(interval_seconds, (int, float))
                or isinstance(interval_seconds, bool)
                or not interval_seconds > 0
                or interval_seconds != interval_seconds
                or interval_seconds == float("inf")
            ):
                raise InvalidInputError(
                    f"interval_seconds must be a positive number, not {interval_seconds!r}"
                )
            interval_seconds = float(interval_seconds)
            if next_run_at is None:
                next_run_at = now + interval_seconds
        else:
            if not isinstance(cron, str):
                raise InvalidInputError("a cron schedule needs a cron expression string")
            expr = CronExpression(cron)  # raises InvalidInputError
            cron = expr.source
            if next_run_at is None:
                next_run_at = expr.next_after(now)
        if not isinstance(next_run_at, (int, float)) or next_run_at != next_run_at:
            raise InvalidInputError(f"next_run_at must be epoch seconds, not {next_run_at!r}")
        sid = schedule_id or f"sch_{uuid.uuid4().hex[:20]}"
        rec = ScheduleRecord(
            id=sid,
            method=method,
            kind=kind,
            next_run_at=float(next_run_at),
            payload=payload,
            interval_seconds=interval_seconds if kind == "interval" else None,
            cron=cron if kind == "cron" else None,
            created_at=now,
        )
        blob = pack(_schedule_info(rec), "schedule payload")
        self._db.state.pop(_NONE_DUE, None)
        with self.db.transaction() as con:
            if con.execute("SELECT 1 FROM schedules WHERE id = ?", [sid]).fetchone():
                raise InvalidInputError(f"schedule {sid!r} already exists")
            con.execute(
                f"INSERT INTO schedules ({_SCHEDULE_COLS}) VALUES (?, ?, ?, ?)",
                [sid, method, rec.next_run_at, blob],
            )
        return rec

    @override
    def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        row = self.db.fetchone(
            f"SELECT {_SCHEDULE_COLS} FROM schedules WHERE id = ?", [schedule_id]
        )
        return _schedule_from_row(row) if row else None

    def list_schedules(self, *, include_disabled: bool = False) -> list[ScheduleRecord]:
        """Enabled schedules by next run time (disabled ones last, with the flag)."""
        where = "" if include_disabled else " WHERE next_run_at IS NOT NULL"
        rows = self.db.fetchall(
            f"SELECT {_SCHEDULE_COLS} FROM schedules{where} ORDER BY next_run_at NULLS LAST, id"
        )
        return [_schedule_from_row(r) for r in rows]

    @override
    def delete_schedule(self, schedule_id: str) -> bool:
        with self.db.transaction() as con:
            found = con.execute("SELECT 1 FROM schedules WHERE id = ?", [schedule_id]).fetchone()
            if found:
                con.execute("DELETE FROM schedules WHERE id = ?", [schedule_id])
        return bool(found)

    def due_schedules(
        self, now: float | None = None, *, exclude: Collection[str] = ()
    ) -> list[ScheduleRecord]:
        """Enabled schedules with ``next_run_at <= now``, earliest first."""
        now = time.time() if now is None else now
        if self._none_due():
            return []
        rows = self.db.fetchall(
            f"SELECT {_SCHEDULE_COLS} FROM schedules WHERE next_run_at IS NOT NULL "
            "AND next_run_at <= ? ORDER BY next_run_at, id",
            [now],
        )
        return [_schedule_from_row(r) for r in rows if r[0] not in exclude]

    due = due_schedules

    def next_due_at(self, *, exclude: Collection[str] = ()) -> float | None:
        """The earliest ``next_run_at`` of an enabled schedule (epoch seconds), or None."""
        if self._none_due():
            return None
        if exclude:
            ids = list(exclude)
            marks = ", ".join("?" for _ in ids)
            row = self.db.fetchone(
                "SELECT min(next_run_at) FROM schedules WHERE next_run_at IS NOT NULL "
                f"AND id NOT IN ({marks})",
                ids,
            )
        else:
            row = self.db.fetchone("SELECT min(next_run_at) FROM schedules")
            if row is None or row[0] is None:
                self._db.state[_NONE_DUE] = True
        return None if row is None or row[0] is None else float(row[0])

    def _none_due(self) -> bool:
        """Whether the file is known to hold no enabled schedule (see ``_NONE_DUE``)."""
        return bool(self._db.state.get(_NONE_DUE))

    def mark_ran(
        self,
        schedule_id: str,
        *,
        ran_at: float | None = None,
        error: str | None = None,
        now: float | None = None,
    ) -> ScheduleRecord | None:
        """Record a run (``error`` if it failed) and compute the next one: ``once`` is
        disabled; ``interval`` advances by whole intervals past ``now`` (missed runs are
        coalesced, the phase is kept); ``cron`` goes to its next fire time after
        ``now``. ``now`` defaults to the current time, ``ran_at`` to ``now``. Returns the
        updated record, or None if the schedule was deleted meanwhile."""
        now = time.time() if now is None else now
        ran_at = now if ran_at is None else ran_at
        self._db.state.pop(_NONE_DUE, None)
        with self.db.transaction() as con:
            row = con.execute(
                f"SELECT {_SCHEDULE_COLS} FROM schedules WHERE id = ?", [schedule_id]
            ).fetchone()
            if row is None:
                return None
            rec = _schedule_from_row(row)
            rec.runs += 1
            rec.last_run_at = ran_at
            rec.last_error = error
            if error is not None:
                rec.failures += 1
            rec.next_run_at = _next_run(rec, now)
            con.execute(
                "UPDATE schedules SET next_run_at = ?, info = ? WHERE id = ?",
                [rec.next_run_at, pack(_schedule_info(rec)), schedule_id],
            )
        return rec

    def delete_disabled_schedules(self, older_than: float, *, now: float | None = None) -> int:
        """Delete disabled (ran once-) schedules whose last run is older than this."""
        cutoff = (time.time() if now is None else now) - older_than
        with self.db.transaction() as con:
            rows = con.execute(
                "SELECT id, info FROM schedules WHERE next_run_at IS NULL"
            ).fetchall()
            doomed = [
                sid for sid, info in rows if ((unpack(info) or {}).get("last_run_at") or 0) < cutoff
            ]
            if doomed:
                marks = ", ".join("?" for _ in doomed)
                con.execute(f"DELETE FROM schedules WHERE id IN ({marks})", doomed)
        return len(doomed)


def _check_status(status: str) -> None:
    if status not in FIBER_STATUSES:
        raise InvalidInputError(f"fiber status must be one of {FIBER_STATUSES}, not {status!r}")


def _next_run(rec: ScheduleRecord, now: float) -> float | None:
    if rec.kind == "interval" and rec.interval_seconds:
        step = rec.interval_seconds
        base = rec.next_run_at if rec.next_run_at is not None else now
        if base > now:  # ran ahead of time (run_due with an explicit now)
            return base + step
        missed = int((now - base) // step) + 1
        return base + missed * step
    if rec.kind == "cron" and rec.cron:
        try:
            return CronExpression(rec.cron).next_after(now)
        except InvalidInputError:
            return None
    return None


# -- cron ------------------------------------------------------------------------------

_MONTH_NAMES = {
    name: i + 1
    for i, name in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    )
}
_DAY_NAMES = {name: i for i, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# (name, low, high, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTH_NAMES),
    ("day of week", 0, 7, _DAY_NAMES),
)
# A schedule that matches nothing in this many years never fires (Feb 29 on a given
# weekday recurs within 28 years; "31 2" never).
_SEARCH_YEARS = 30


class CronExpression:
    """A standard 5-field cron expression: ``minute hour day-of-month month
    day-of-week``, each ``*``, a number, a range ``a-b``, a list ``a,b``, a step
    ``*/n`` or ``a-b/n`` (``a/n`` means ``a-max/n``). Months and weekdays accept names
    (``jan``, ``mon``); weekday 0 and 7 are Sunday. The macros ``@hourly``, ``@daily``,
    ``@midnight``, ``@weekly``, ``@monthly``, ``@yearly``/``@annually`` are accepted.

    As in Vixie cron, when both day-of-month and day-of-week are restricted (neither
    starts with ``*``) a day matches if EITHER matches; otherwise both must. Evaluated
    in UTC. An invalid expression raises :class:`InvalidInputError` (a ``ValueError``).
    """

    def __init__(self, expression: str) -> None:
        if not isinstance(expression, str):
            raise InvalidInputError(f"cron expression must be a string, not {expression!r}")
        self.source = " ".join(expression.split())
        text = _MACROS.get(self.source.lower(), self.source)
        if text.startswith("@"):
            raise InvalidInputError(
                f"invalid cron expression {expression!r}: unknown macro {text!r}"
            )
        parts = text.split()
        if len(parts) != 5:
            raise InvalidInputError(
                f"invalid cron expression {expression!r}: expected 5 fields "
                f"(minute hour day-of-month month day-of-week), got {len(parts)}"
            )
        sets = []
        for part, (name, low, high, names) in zip(parts, _FIELDS, strict=True):
            try:
                sets.append(_parse_field(part.lower(), low, high, names))
            except ValueError as exc:
                raise InvalidInputError(
                    f"invalid cron expression {expression!r}: {name} field {part!r}: {exc}"
                ) from None
        self.minutes, self.hours, self.days, self.months, weekdays = sets
        self.weekdays = frozenset(d % 7 for d in weekdays)
        self._dom_star = parts[2].startswith("*")
        self._dow_star = parts[4].startswith("*")

    def __repr__(self) -> str:
        return f"CronExpression({self.source!r})"

    def _day_matches(self, dt: datetime) -> bool:
        dom = dt.day in self.days
        dow = (dt.weekday() + 1) % 7 in self.weekdays
        if self._dom_star or self._dow_star:
            return dom and dow
        return dom or dow

    def matches(self, dt: datetime) -> bool:
        """Whether the minute of ``dt`` (converted to UTC when aware) matches."""
        if dt.tzinfo is not None:
            dt = dt.astimezone(UTC)
        return (
            dt.minute in self.minutes
            and dt.hour in self.hours
            and dt.month in self.months
            and self._day_matches(dt)
        )

    def next_after(self, when: float | datetime) -> float:
        """The first matching minute strictly after ``when``, as epoch seconds."""
        return self.next_datetime(when).timestamp()

    def next_datetime(self, when: float | datetime) -> datetime:
        """The first matching minute strictly after ``when``, as an aware UTC datetime.
        A naive ``when`` is taken as UTC."""
        if isinstance(when, datetime):
            start = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
        else:
            start = datetime.fromtimestamp(float(when), UTC)
        dt = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = dt.year + _SEARCH_YEARS
        while dt.year <= limit:
            if dt.month not in self.months:
                year, month = (dt.year + 1, 1) if dt.month == 12 else (dt.year, dt.month + 1)
                dt = dt.replace(year=year, month=month, day=1, hour=0, minute=0)
                continue
            if not self._day_matches(dt):
                dt = dt.replace(hour=0, minute=0) + timedelta(days=1)
                continue
            if dt.hour not in self.hours:
                dt = dt.replace(minute=0) + timedelta(hours=1)
                continue
            later = [m for m in self.minutes if m >= dt.minute]
            if not later:
                dt = dt.replace(minute=0) + timedelta(hours=1)
                continue
            return dt.replace(minute=min(later))
        raise InvalidInputError(f"cron expression {self.source!r} never fires")


def _parse_value(token: str, low: int, high: int, names: dict[str, int]) -> int:
    if token in names:
        return names[token]
    if not token.isdigit():
        raise InvalidInputError(f"{token!r} is not a number" + (" or a name" if names else ""))
    value = int(token)
    if not low <= value <= high:
        raise InvalidInputError(f"{value} is out of range {low}-{high}")
    return value


def _parse_field(text: str, low: int, high: int, names: dict[str, int]) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise InvalidInputError("empty list item")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise InvalidInputError(f"step {step_text!r} must be a positive integer")
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            start = _parse_value(a, low, high, names)
            end = _parse_value(b, low, high, names)
            if start > end:
                raise InvalidInputError(f"range {base!r} runs backwards")
        else:
            start = _parse_value(base, low, high, names)
            end = high if slash else start
        values.update(range(start, end + 1, step))
    return frozenset(values)
