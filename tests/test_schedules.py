"""Scheduled tasks: delay, datetime, interval, cron, cancel, persistence, errors."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from thinkray.runtime.durable.schedules import CronExpression, Scheduler
from thinkray.storage.db import Database
from thinkray.storage.fibers import DuckDBFiberStore


async def until(cond: Any, timeout: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


class Host:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.boom_left = 0
        self.slow_started = asyncio.Event()

    def tick(self, payload: Any) -> None:
        self.calls.append(("tick", payload))

    async def atick(self, payload: Any) -> None:
        await asyncio.sleep(0)
        self.calls.append(("atick", payload))

    def boom(self, payload: Any) -> None:
        self.calls.append(("boom", payload))
        if self.boom_left > 0:
            self.boom_left -= 1
            raise RuntimeError("scheduled failure")

    async def slow(self, payload: Any) -> None:
        self.slow_started.set()
        await asyncio.sleep(30)
        self.calls.append(("slow", payload))


@pytest.fixture
def db(tmp_path: Any) -> Any:
    database = Database(tmp_path / "agent.duckdb")
    yield database
    database.close()


def make(db: Database) -> tuple[Host, Scheduler]:
    host = Host()
    return host, Scheduler(DuckDBFiberStore(db), host)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# -- cron parsing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("*/15 * * * *", utc(2024, 1, 1, 0, 7, 30), utc(2024, 1, 1, 0, 15)),
        ("* * * * *", utc(2024, 1, 1, 0, 7, 30), utc(2024, 1, 1, 0, 8)),
        ("*/15 * * * *", utc(2024, 1, 1, 0, 15), utc(2024, 1, 1, 0, 30)),  # strictly after
        ("5,10-12 3 * * *", utc(2024, 1, 1, 3, 10), utc(2024, 1, 1, 3, 11)),
        ("5,10-12 3 * * *", utc(2024, 1, 1, 3, 12), utc(2024, 1, 2, 3, 5)),
        ("0 9 * * 1-5", utc(2024, 1, 6, 10, 0), utc(2024, 1, 8, 9, 0)),  # Sat → Mon
        ("0 9 * * mon-fri", utc(2024, 1, 5, 8, 0), utc(2024, 1, 5, 9, 0)),
        ("30 2 1 * *", utc(2024, 1, 15), utc(2024, 2, 1, 2, 30)),
        ("0 0 31 * *", utc(2024, 4, 1), utc(2024, 5, 31)),
        ("0 0 29 2 *", utc(2024, 3, 1), utc(2028, 2, 29)),  # leap day
        ("59 23 31 12 *", utc(2024, 12, 31, 23, 59), utc(2025, 12, 31, 23, 59)),
        ("0 0 * * 7", utc(2024, 1, 1), utc(2024, 1, 7)),  # 7 is Sunday
        ("0 0 * * sun", utc(2024, 1, 1), utc(2024, 1, 7)),
        ("0 12 13 * 5", utc(2024, 1, 1), utc(2024, 1, 5, 12)),  # dom OR dow: Friday first
        ("0 12 13 * 5", utc(2024, 1, 12, 13), utc(2024, 1, 13, 12)),  # ... then the 13th
        # dom starts with '*': both must match — a Friday that is the 1st/11th/21st/31st
        ("0 12 */10 * 5", utc(2024, 1, 1), utc(2024, 3, 1, 12)),
        ("0 0 1 jan,jul *", utc(2024, 2, 1), utc(2024, 7, 1)),
        ("10-50/20 8-9 * * *", utc(2024, 1, 1, 8, 31), utc(2024, 1, 1, 8, 50)),
        ("0 */6 * * *", utc(2024, 1, 1, 19, 0), utc(2024, 1, 2, 0, 0)),
        ("15/20 * * * *", utc(2024, 1, 1, 0, 36), utc(2024, 1, 1, 0, 55)),
        ("@hourly", utc(2024, 1, 1, 5, 30), utc(2024, 1, 1, 6, 0)),
        ("@daily", utc(2024, 1, 1, 5, 30), utc(2024, 1, 2)),
        ("@weekly", utc(2024, 1, 1), utc(2024, 1, 7)),
        ("@monthly", utc(2024, 1, 31, 23, 59), utc(2024, 2, 1)),
        ("@yearly", utc(2024, 6, 1), utc(2025, 1, 1)),
    ],
)
def test_cron_next_fire(expr: str, after: datetime, expected: datetime) -> None:
    cron = CronExpression(expr)
    assert cron.next_datetime(after) == expected
    assert cron.next_after(after.timestamp()) == expected.timestamp()
    assert cron.matches(expected)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "expected 5 fields"),
        ("* * * *", "expected 5 fields"),
        ("* * * * * *", "expected 5 fields"),
        ("60 * * * *", "minute field '60': 60 is out of range 0-59"),
        ("* 24 * * *", "hour field"),
        ("* * 0 * *", "day of month field"),
        ("* * * 13 *", "month field"),
        ("* * * * 8", "day of week field"),
        ("*/0 * * * *", "step '0' must be a positive integer"),
        ("5-1 * * * *", "runs backwards"),
        ("a * * * *", "'a' is not a number"),
        ("1,,2 * * * *", "empty list item"),
        ("* * * foo *", "'foo' is not a number or a name"),
        ("@reboot", "unknown macro"),
        ("0 0 31 2 *", "never fires"),
    ],
)
def test_invalid_cron_is_a_clear_value_error(expr: str, message: str) -> None:
    with pytest.raises(ValueError, match="cron expression") as info:
        CronExpression(expr).next_after(0)
    assert message in str(info.value)


async def test_invalid_cron_writes_nothing(db: Database) -> None:
    _, scheduler = make(db)
    for expr in ("61 * * * *", "0 0 30 2 *", "every day"):
        with pytest.raises(ValueError, match="cron"):
            scheduler.schedule(expr, "tick")
    with pytest.raises(ValueError, match="no method 'nope'"):
        scheduler.schedule(1.0, "nope")
    with pytest.raises(ValueError, match="msgpack"):
        scheduler.schedule(1.0, "tick", {"x": object()})
    with pytest.raises(ValueError, match="delay"):
        scheduler.schedule(-1, "tick")
    with pytest.raises(ValueError, match="interval_seconds"):
        scheduler.schedule_every(0, "tick")
    assert scheduler.list_schedules(include_disabled=True) == []
    assert db.fetchone("SELECT count(*) FROM schedules") == (0,)


# -- running ------------------------------------------------------------------------------


async def test_delay_runs_once_via_timer(db: Database) -> None:
    host, scheduler = make(db)
    scheduler.start()
    before = time.time()
    sid = scheduler.schedule(0.05, "tick", {"n": 1})  # the sleeping timer is re-armed
    due = scheduler.next_due_at()
    # due 50 ms after the call (bounded by clock reads around it, not by a tolerance a
    # loaded machine can exceed)
    assert due is not None and before + 0.05 <= due <= time.time() + 0.05
    await until(lambda: host.calls)
    await until(lambda: scheduler.get_schedule(sid).runs == 1)
    await asyncio.sleep(0.05)
    assert host.calls == [("tick", {"n": 1})]
    record = scheduler.get_schedule(sid)
    assert not record.enabled and record.last_error is None
    assert scheduler.list_schedules() == []  # pending only
    assert [s.id for s in scheduler.list_schedules(include_disabled=True)] == [sid]
    assert scheduler.next_due_at() is None
    await scheduler.close()


async def test_datetime_and_async_method(db: Database) -> None:
    host, scheduler = make(db)
    at = datetime.now(UTC) + timedelta(seconds=0.05)
    sid = scheduler.schedule(at, "atick", "when")
    assert scheduler.get_schedule(sid).next_run_at == pytest.approx(at.timestamp())
    assert await scheduler.run_due() == []  # not yet
    scheduler.start()
    await until(lambda: host.calls == [("atick", "when")])
    await scheduler.close()


async def test_run_due_with_explicit_now(db: Database) -> None:
    host, scheduler = make(db)
    now = time.time()
    later = scheduler.schedule(10, "tick", "later")
    sooner = scheduler.schedule(timedelta(seconds=5), "tick", "sooner")
    assert scheduler.next_due_at() == pytest.approx(now + 5, abs=0.5)
    assert await scheduler.run_due(now=now + 1) == []
    assert await scheduler.run_due(now=now + 11) == [sooner, later]
    assert host.calls == [("tick", "sooner"), ("tick", "later")]
    assert await scheduler.run_due(now=now + 12) == []


async def test_interval_recurs(db: Database) -> None:
    host, scheduler = make(db)
    sid = scheduler.schedule_every(0.05, "tick", "again")
    scheduler.start()
    await until(lambda: len(host.calls) >= 3)
    await scheduler.close()
    record = scheduler.get_schedule(sid)
    assert record.enabled and record.kind == "interval"
    assert record.runs >= 3
    assert record.next_run_at > record.last_run_at


async def test_cron_schedule(db: Database) -> None:
    host, scheduler = make(db)
    before = time.time()
    sid = scheduler.schedule("*/5 * * * *", "tick", "cron")
    record = scheduler.get_schedule(sid)
    assert record.kind == "cron" and record.cron == "*/5 * * * *"
    first = record.next_run_at
    assert first == CronExpression("*/5 * * * *").next_after(before) or first == (
        CronExpression("*/5 * * * *").next_after(time.time())
    )
    assert datetime.fromtimestamp(first, UTC).minute % 5 == 0
    assert await scheduler.run_due(now=first - 1) == []
    assert await scheduler.run_due(now=first) == [sid]
    assert scheduler.get_schedule(sid).next_run_at == first + 300
    assert await scheduler.run_due(now=first + 300) == [sid]
    assert host.calls == [("tick", "cron"), ("tick", "cron")]
    assert scheduler.get_schedule(sid).runs == 2


async def test_cancel(db: Database) -> None:
    host, scheduler = make(db)
    scheduler.start()
    sid = scheduler.schedule(0.05, "tick")
    keep = scheduler.schedule(0.05, "tick", "kept")
    assert scheduler.cancel_schedule(sid) is True
    assert scheduler.cancel_schedule(sid) is False
    assert scheduler.get_schedule(sid) is None
    await until(lambda: host.calls)
    await asyncio.sleep(0.05)
    assert host.calls == [("tick", "kept")]
    assert scheduler.get_schedule(keep).runs == 1
    await scheduler.close()


async def test_persists_across_reopen(tmp_path: Any) -> None:
    path = tmp_path / "agent.duckdb"
    db1 = Database(path)
    _, scheduler1 = make(db1)
    sid = scheduler1.schedule(3600, "tick", {"remind": "me"})
    every = scheduler1.schedule_every(60, "tick", "minutely")
    due_at = scheduler1.get_schedule(sid).next_run_at
    every_at = scheduler1.get_schedule(every).next_run_at
    db1.close()

    db2 = Database(path)
    host2, scheduler2 = make(db2)
    assert scheduler2.get_schedule(sid).next_run_at == due_at
    assert scheduler2.get_schedule(sid).payload == {"remind": "me"}
    assert scheduler2.next_due_at() == every_at
    assert [s.id for s in scheduler2.list_schedules()] == [every, sid]
    assert await scheduler2.run_due(now=due_at) == [every, sid]
    assert host2.calls == [("tick", "minutely"), ("tick", {"remind": "me"})]
    assert scheduler2.get_schedule(every).next_run_at > due_at
    db2.close()


async def test_failing_task_records_error_and_recurs(db: Database) -> None:
    host, scheduler = make(db)
    host.boom_left = 1
    sid = scheduler.schedule_every(10, "boom", "p")
    first = scheduler.get_schedule(sid).next_run_at
    assert await scheduler.run_due(now=first) == [sid]  # no exception escapes
    record = scheduler.get_schedule(sid)
    assert record.last_error == "RuntimeError: scheduled failure"
    assert record.failures == 1 and record.runs == 1 and record.enabled
    assert await scheduler.run_due(now=record.next_run_at) == [sid]
    record = scheduler.get_schedule(sid)
    assert record.last_error is None and record.runs == 2 and record.failures == 1
    assert host.calls == [("boom", "p"), ("boom", "p")]


async def test_failing_task_recurs_via_timer(db: Database) -> None:
    host, scheduler = make(db)
    host.boom_left = 2
    sid = scheduler.schedule_every(0.03, "boom")
    scheduler.start()
    await until(lambda: len(host.calls) >= 3)
    await scheduler.close()
    record = scheduler.get_schedule(sid)
    assert record.failures == 2 and record.runs >= 3


async def test_method_removed_after_scheduling_is_recorded(db: Database) -> None:
    store = DuckDBFiberStore(db)
    sid = store.insert_schedule("gone", kind="once", next_run_at=time.time() - 1).id
    _, scheduler = make(db)
    assert await scheduler.run_due() == [sid]
    record = scheduler.get_schedule(sid)
    assert record.last_error == "Host has no method 'gone'" and not record.enabled


async def test_next_due_at(db: Database) -> None:
    _, scheduler = make(db)
    assert scheduler.next_due_at() is None
    now = time.time()
    a = scheduler.schedule(100, "tick")
    scheduler.schedule(200, "tick")
    assert scheduler.next_due_at() == pytest.approx(now + 100, abs=1)
    scheduler.cancel_schedule(a)
    assert scheduler.next_due_at() == pytest.approx(now + 200, abs=1)


async def test_close_mid_run_leaves_task_due(db: Database) -> None:
    """Hibernation cuts a run short: it is not recorded, so the next wake runs it again
    (at-least-once)."""
    host, scheduler = make(db)
    sid = scheduler.schedule(0, "slow", "job")
    scheduler.start()
    await asyncio.wait_for(host.slow_started.wait(), 2)
    assert scheduler.busy
    await scheduler.close()
    assert not scheduler.running and not scheduler.busy
    record = scheduler.get_schedule(sid)
    assert record.runs == 0 and record.enabled
    assert scheduler.next_due_at() == record.next_run_at <= time.time()
