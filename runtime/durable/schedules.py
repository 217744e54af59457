"""Scheduled tasks: call ``host.<method>(payload)`` at a time, every N seconds, or on cron.

Schedules are rows in the actor's database (:class:`~thinkray.storage.protocols.FiberStore`), so
they outlive the process. Two ways to run them:

- in process: :meth:`Scheduler.start` runs a timer loop that sleeps until the next due
  time and is re-armed whenever a schedule is added or removed;
- from outside: a waker (the Ray layer) reads :meth:`Scheduler.next_due_at` before the
  actor hibernates, wakes it at that time, and the woken host calls ``run_due()`` (or
  just ``start()``, which runs whatever is already due at once).

Delivery is at-least-once: a run is recorded (and the next one computed) only after
the method returns or raises, so a task cut short by hibernation or a crash stays due
and runs again on the next wake. A method's exception is recorded on the schedule
(``last_error``, ``failures``) and never raised; a recurring task keeps recurring.
Missed interval runs (the actor slept through several) are coalesced into one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from thinkray.storage.fibers import CronExpression
from thinkray.storage.protocols import FiberStore, ScheduleRecord
from thinkray.storage.types import InvalidInputError

log = logging.getLogger("thinkray.schedules")

__all__ = ["CronExpression", "ScheduleRecord", "Scheduler"]

_UNREPORTED = object()

# The timer loop re-reads the table at least this often, so a clock jump or a row
# written by someone else is noticed.
MAX_SLEEP_SECONDS = 60.0
DEFAULT_RETENTION_SECONDS = 24 * 3600.0


class Scheduler:
    """Schedules of one host object. Methods may be sync or async.

    ``schedule``/``schedule_every``/``cancel_schedule`` are synchronous and validate
    before writing (an unknown method, a bad time or cron expression raises
    ``ValueError`` and writes nothing).
    """

    def __init__(
        self,
        store: FiberStore,
        host: object,
        *,
        retention_seconds: float | None = DEFAULT_RETENTION_SECONDS,
    ) -> None:
        self.store = store
        self.host = host
        # Told the next due time (None: nothing due) whenever it changes while the timer
        # runs: the Ray layer keeps the namespace's alarm for this agent with it, so a
        # crash of the live process does not lose the alarm.
        self.on_next_due: Callable[[float | None], None] | None = None
        self._reported: float | None | object = _UNREPORTED
        self.retention_seconds = retention_seconds
        self._inflight: dict[str, asyncio.Task[str | None]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    # -- scheduling --------------------------------------------------------------------

    def schedule(
        self,
        when: float | int | timedelta | datetime | str,
        method: str,
        payload: Any = None,
        *,
        schedule_id: str | None = None,
    ) -> str:
        """Run ``host.<method>(payload)`` once after a delay (seconds or timedelta) or at
        a datetime (naive means local time, as ``datetime.timestamp()`` has it), or on
        every fire of a 5-field cron expression (UTC). Returns the schedule id."""
        self._check_method(method)
        now = time.time()
        if isinstance(when, str):
            rec = self.store.insert_schedule(
                method, payload, kind="cron", cron=when, schedule_id=schedule_id, now=now
            )
        else:
            at = _resolve_time(when, now)
            rec = self.store.insert_schedule(
                method, payload, kind="once", next_run_at=at, schedule_id=schedule_id, now=now
            )
        self._rearm()
        return rec.id

    def schedule_every(
        self,
        seconds: float | timedelta,
        method: str,
        payload: Any = None,
        *,
        schedule_id: str | None = None,
        first_run_at: float | datetime | None = None,
    ) -> str:
        """Run ``host.<method>(payload)`` every ``seconds`` (first after one interval,
        or at ``first_run_at``)."""
        self._check_method(method)
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        now = time.time()
        first = None
        if first_run_at is not None:
            first = first_run_at.timestamp() if isinstance(first_run_at, datetime) else first_run_at
        rec = self.store.insert_schedule(
            method,
            payload,
            kind="interval",
            interval_seconds=seconds,
            next_run_at=first,
            schedule_id=schedule_id,
            now=now,
        )
        self._rearm()
        return rec.id

    def cancel_schedule(self, schedule_id: str) -> bool:
        """Delete a schedule. A run in flight finishes but is not recorded."""
        found = self.store.delete_schedule(schedule_id)
        if found:
            self._rearm()
        return found

    def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        """A schedule's record, or None."""
        return self.store.get_schedule(schedule_id)

    def list_schedules(self, *, include_disabled: bool = False) -> list[ScheduleRecord]:
        """Pending schedules, earliest first (``include_disabled`` adds once-tasks that
        already ran, kept for ``retention_seconds`` with their outcome)."""
        return self.store.list_schedules(include_disabled=include_disabled)

    def next_due_at(self) -> float | None:
        """Epoch seconds of the earliest pending run (possibly in the past: due now, or
        in flight and not yet recorded), or None. What a waker arms its alarm with."""
        return self.store.next_due_at()

    def _check_method(self, method: str) -> None:
        if not isinstance(method, str) or not method:
            raise InvalidInputError("schedule method must be a non-empty string")
        if not callable(getattr(self.host, method, None)):
            raise InvalidInputError(
                f"{type(self.host).__name__} has no method {method!r} to schedule"
            )

    # -- running -----------------------------------------------------------------------

    async def run_due(self, now: float | None = None) -> list[str]:
        """Run every schedule due at ``now`` (default: the current time) that is not
        already running here, concurrently, and wait for them. Returns their ids, in
        due order. Errors are recorded on the schedules, never raised. With an explicit
        ``now`` the next runs are computed from it (tests drive time this way)."""
        tasks = self._launch_due(now)
        if tasks:
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        return list(tasks)

    def _launch_due(self, now: float | None) -> dict[str, asyncio.Task[str | None]]:
        due = self.store.due_schedules(time.time() if now is None else now, exclude=self._inflight)
        loop = asyncio.get_running_loop()
        launched: dict[str, asyncio.Task[str | None]] = {}
        for rec in due:
            task = loop.create_task(self._run_one(rec, now), name=f"schedule:{rec.id}")
            self._inflight[rec.id] = task
            task.add_done_callback(functools.partial(self._done, rec.id))
            launched[rec.id] = task
        return launched

    def _done(self, schedule_id: str, task: asyncio.Task[str | None]) -> None:
        if self._inflight.get(schedule_id) is task:
            del self._inflight[schedule_id]
        if not task.cancelled() and task.exception() is not None:
            # The method's own errors are recorded; this is recording itself failing.
            log.error("schedule %s: run not recorded", schedule_id, exc_info=task.exception())
        self._rearm()

    async def _run_one(self, rec: ScheduleRecord, now: float | None) -> str | None:
        started = time.time()
        error: str | None = None
        fn = getattr(self.host, rec.method, None)
        if not callable(fn):
            error = f"{type(self.host).__name__} has no method {rec.method!r}"
        else:
            try:
                result = fn(rec.payload)
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise  # hibernation: not recorded, so it stays due for the next wake
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if error is not None:
            log.warning("scheduled %s (%s) failed: %s", rec.method, rec.id, error)
        self.store.mark_ran(
            rec.id,
            ran_at=started if now is None else now,
            error=error,
            now=now,
        )
        if rec.kind == "once" and self.retention_seconds is not None:
            self.store.delete_disabled_schedules(self.retention_seconds)
        return error

    # -- the in-process timer ----------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while the timer loop runs."""
        return self._loop_task is not None and not self._loop_task.done()

    @property
    def busy(self) -> bool:
        """True while a scheduled method runs here (a host should not hibernate)."""
        return bool(self._inflight)

    def start(self) -> None:
        """Start the timer loop in the running event loop (idempotent). Anything already
        due runs at once."""
        if self.running:
            return
        self._wake = asyncio.Event()
        self._loop_task = asyncio.get_running_loop().create_task(
            self._timer(), name="schedules:timer"
        )

    def stop(self) -> None:
        """Stop the timer loop and cancel runs in flight (they stay due). Synchronous;
        use :meth:`close` to also wait for the cancellations."""
        if self._loop_task is not None:
            self._loop_task.cancel()
        for task in list(self._inflight.values()):
            task.cancel()

    async def close(self) -> None:
        """Hibernation: :meth:`stop`, then wait until nothing of ours runs. Call before
        closing the database."""
        tasks = [t for t in (self._loop_task, *self._inflight.values()) if t is not None]
        self.stop()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._loop_task = None
        self._inflight.clear()

    def report_to(self, told: Callable[[float | None], None], *, known: float | None) -> None:
        """Tell ``told`` the next due time whenever it changes (:attr:`on_next_due`);
        ``known``: what the receiver holds already, not sent again (the directory forgets
        an agent's alarm when it binds it: a new agent's "nothing due" costs no call)."""
        self.on_next_due = told
        self._reported = known

    def _report(self, next_at: float | None) -> None:
        if self.on_next_due is None or next_at == self._reported:
            return
        self._reported = next_at
        try:
            self.on_next_due(next_at)
        except Exception:  # a waker that is gone must not stop the timer
            log.warning("could not report the next alarm", exc_info=True)

    def _rearm(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _timer(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            wake.clear()
            try:
                self._launch_due(None)
                next_at = self.store.next_due_at(exclude=self._inflight)
            except Exception:
                # Database closed under us (or similar): stop quietly, a wake restarts us.
                log.exception("schedule timer stopped")
                return
            self._report(next_at)
            timeout = None
            if next_at is not None:
                timeout = min(max(next_at - time.time(), 0.0), MAX_SLEEP_SECONDS)
                if timeout == 0.0:
                    # Due already (launched above, or its run just ended): yield once.
                    await asyncio.sleep(0)
                    continue
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the inner
            # result when a cancel arrives just as the wait finished (a schedule()
            # woke it), which swallows the cancel and leaves close() waiting forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await wake.wait()


def _resolve_time(when: float | int | timedelta | datetime, now: float) -> float:
    if isinstance(when, bool):
        raise InvalidInputError("when must be a delay in seconds, a datetime or a cron string")
    if isinstance(when, datetime):
        return when.timestamp()
    if isinstance(when, timedelta):
        when = when.total_seconds()
    if isinstance(when, (int, float)):
        if when != when or when < 0 or when == float("inf"):
            raise InvalidInputError(f"delay must be a finite number of seconds >= 0, not {when}")
        return now + float(when)
    raise InvalidInputError(
        f"when must be a delay in seconds, a datetime or a cron string, not {type(when).__name__}"
    )
