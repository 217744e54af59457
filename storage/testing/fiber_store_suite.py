"""Conformance suite for :class:`thinkray.storage.protocols.FiberStore` (fibers and
schedules). Fixtures: see :mod:`thinkray.storage.testing.store_helpers`; the suite's own ``fibers``
fixture is ``stores.fibers()``."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest
from thinkray.storage.errors import FiberNotFoundError, InvalidInputError
from thinkray.storage.protocols import FiberStore, Stores
from thinkray.storage.testing.store_helpers import (
    Reopen,
    inner_failure_caught,
    need_reopen,
    nested_rolled_back,
    rolled_back,
)

__all__ = [
    "TestFiberInsert",
    "TestFiberListing",
    "TestFiberPersistence",
    "TestFiberPruning",
    "TestFiberTransactions",
    "TestFiberUpdate",
    "TestScheduleInsert",
    "TestScheduleRuns",
    "TestScheduleTransactions",
    "fibers",
]


@pytest.fixture
def fibers(stores: Stores) -> FiberStore:
    return stores.fibers()


def ts(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


# -- fibers ----------------------------------------------------------------------------


class TestFiberInsert:
    def test_insert_returns_what_get_reads(self, fibers: FiberStore) -> None:
        rec = fibers.insert_fiber("work", {"n": [1, 2]}, max_retries=5, now=100.0)
        assert rec.method == "work" and rec.status == "running"
        assert (rec.attempts, rec.max_retries) == (1, 5)
        assert rec.payload == {"n": [1, 2]} and rec.checkpoint is None
        assert rec.created_at == rec.updated_at == 100.0
        assert rec.error is None and rec.result is None and not rec.finished
        stored = fibers.get_fiber(rec.id)
        assert stored is not None and stored.to_dict() == rec.to_dict()

    def test_fresh_ids_are_unique(self, fibers: FiberStore) -> None:
        ids = {fibers.insert_fiber("m").id for _ in range(5)}
        assert len(ids) == 5 and all(isinstance(i, str) and i for i in ids)

    def test_initial_status(self, fibers: FiberStore) -> None:
        rec = fibers.insert_fiber("m", status="interrupted")
        assert fibers.get_fiber(rec.id).status == "interrupted"  # type: ignore[union-attr]

    def test_existing_id_is_refused_and_nothing_changes(self, fibers: FiberStore) -> None:
        fibers.insert_fiber("first", {"v": 1}, fiber_id="f1")
        with pytest.raises(InvalidInputError, match="already exists"):
            fibers.insert_fiber("second", {"v": 2}, fiber_id="f1")
        stored = fibers.get_fiber("f1")
        assert stored is not None and (stored.method, stored.payload) == ("first", {"v": 1})
        assert len(fibers.list_fibers()) == 1

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"method": ""},
            {"method": 5},
            {"method": "m", "max_retries": -1},
            {"method": "m", "max_retries": True},
            {"method": "m", "max_retries": "3"},
            {"method": "m", "status": "bogus"},
            {"method": "m", "payload": object()},
        ],
    )
    def test_bad_input_writes_nothing(self, fibers: FiberStore, kwargs: dict[str, Any]) -> None:
        with pytest.raises(InvalidInputError):
            fibers.insert_fiber(**kwargs)
        assert fibers.list_fibers() == []

    def test_unknown_ids(self, fibers: FiberStore) -> None:
        assert fibers.get_fiber("nope") is None
        assert fibers.delete_fiber("nope") is False


class TestFiberUpdate:
    def test_update_changes_only_what_is_passed(self, fibers: FiberStore) -> None:
        rec = fibers.insert_fiber("m", {"p": 1}, now=100.0)
        fibers.update_fiber(rec.id, error="first failure", attempts=2, now=150.0)
        done = fibers.update_fiber(rec.id, status="completed", result={"ok": True}, now=200.0)
        assert done is not None
        stored = fibers.get_fiber(rec.id)
        assert stored is not None and stored.to_dict() == done.to_dict()
        assert (stored.status, stored.result, stored.attempts) == ("completed", {"ok": True}, 2)
        assert stored.error == "first failure"  # not passed: kept
        assert stored.payload == {"p": 1} and stored.finished
        assert (stored.created_at, stored.updated_at) == (100.0, 200.0)
        fibers.update_fiber(rec.id, error=None)  # passed as None: cleared
        assert fibers.get_fiber(rec.id).error is None  # type: ignore[union-attr]

    def test_set_status_and_recovery_flag(self, fibers: FiberStore) -> None:
        rec = fibers.insert_fiber("m")
        fibers.set_status(rec.id, "interrupted", recovery_handled=True)
        stored = fibers.get_fiber(rec.id)
        assert stored is not None and stored.status == "interrupted" and stored.recovery_handled

    def test_unknown_fiber_is_not_found(self, fibers: FiberStore) -> None:
        with pytest.raises(FiberNotFoundError):
            fibers.update_fiber("nope", status="completed")
        with pytest.raises(FiberNotFoundError):
            fibers.set_status("nope", "failed")
        with pytest.raises(FiberNotFoundError):
            fibers.set_checkpoint("nope", {"x": 1})
        assert issubclass(FiberNotFoundError, KeyError)
        assert fibers.list_fibers() == []

    def test_expect_status_never_overwrites_a_changed_status(self, fibers: FiberStore) -> None:
        rec = fibers.insert_fiber("m")
        fibers.update_fiber(rec.id, status="cancelled")
        assert fibers.update_fiber(rec.id, status="completed", expect_status="running") is None
        stored = fibers.get_fiber(rec.id)
        assert stored is not None and stored.status == "cancelled" and stored.result is None
        applied = fibers.update_fiber(
            rec.id, status="failed", error="x", expect_status=["running", "cancelled"]
        )
        assert applied is not None and applied.status == "failed"

    def test_bad_update_writes_nothing(self, fibers: FiberStore) -> None:
        rec = fibers.insert_fiber("m")
        with pytest.raises(InvalidInputError):
            fibers.update_fiber(rec.id, status="completed", result=object())
        with pytest.raises(InvalidInputError):
            fibers.update_fiber(rec.id, status="bogus")  # type: ignore[arg-type]
        stored = fibers.get_fiber(rec.id)
        assert stored is not None and stored.status == "running" and stored.result is None

    def test_checkpoint(self, fibers: FiberStore) -> None:
        rec = fibers.insert_fiber("m", now=100.0)
        fibers.set_checkpoint(rec.id, {"step": 1}, now=120.0)
        fibers.set_checkpoint(rec.id, {"step": 2}, now=130.0)
        stored = fibers.get_fiber(rec.id)
        assert stored is not None and stored.checkpoint == {"step": 2}
        assert stored.updated_at == 130.0
        with pytest.raises(InvalidInputError):
            fibers.set_checkpoint(rec.id, {"bad": object()})
        assert fibers.get_fiber(rec.id).checkpoint == {"step": 2}  # type: ignore[union-attr]

    def test_mark_interrupted_moves_only_running_fibers(self, fibers: FiberStore) -> None:
        a = fibers.insert_fiber("m").id
        b = fibers.insert_fiber("m").id
        c = fibers.insert_fiber("m").id
        fibers.update_fiber(c, status="completed")
        assert fibers.mark_interrupted([a, c, "unknown"], now=500.0) == 1
        statuses = {f.id: f.status for f in fibers.list_fibers()}
        assert statuses == {a: "interrupted", b: "running", c: "completed"}
        assert fibers.get_fiber(a).updated_at == 500.0  # type: ignore[union-attr]
        assert fibers.mark_interrupted([a]) == 0  # already moved
        assert fibers.mark_interrupted([]) == 0


class TestFiberListing:
    def test_oldest_first_then_by_id(self, fibers: FiberStore) -> None:
        fibers.insert_fiber("m", fiber_id="late", now=300.0)
        fibers.insert_fiber("m", fiber_id="early", now=100.0)
        fibers.insert_fiber("m", fiber_id="b-tie", now=200.0)
        fibers.insert_fiber("m", fiber_id="a-tie", now=200.0)
        assert [f.id for f in fibers.list_fibers()] == ["early", "a-tie", "b-tie", "late"]

    def test_filter_by_status(self, fibers: FiberStore) -> None:
        done = fibers.insert_fiber("m", now=1.0).id
        failed = fibers.insert_fiber("m", now=2.0).id
        running = fibers.insert_fiber("m", now=3.0).id
        fibers.update_fiber(done, status="completed")
        fibers.update_fiber(failed, status="failed")
        assert [f.id for f in fibers.list_fibers("running")] == [running]
        assert [f.id for f in fibers.list_fibers(["completed", "failed"])] == [done, failed]
        assert fibers.list_fibers([]) == []
        with pytest.raises(InvalidInputError):
            fibers.list_fibers("bogus")


class TestFiberPruning:
    def test_delete_finished_keeps_running_and_recent_ones(self, fibers: FiberStore) -> None:
        done = fibers.insert_fiber("m", now=100.0)
        fibers.update_fiber(done.id, status="completed", result={"ok": True}, now=100.0)
        old_failed = fibers.insert_fiber("m", now=101.0)
        fibers.update_fiber(old_failed.id, status="failed", error="x", now=101.0)
        fresh = fibers.insert_fiber("m", now=900.0)
        fibers.update_fiber(fresh.id, status="completed", now=900.0)
        running = fibers.insert_fiber("m", now=100.0)
        handled = fibers.insert_fiber("m", status="interrupted", now=100.0)
        fibers.update_fiber(handled.id, recovery_handled=True, now=100.0)
        unhandled = fibers.insert_fiber("m", status="interrupted", now=100.0)
        assert fibers.delete_finished(older_than=500.0, now=1000.0) == 3
        assert {f.id for f in fibers.list_fibers()} == {fresh.id, running.id, unhandled.id}

    def test_delete_fiber(self, fibers: FiberStore) -> None:
        rec = fibers.insert_fiber("m")
        assert fibers.delete_fiber(rec.id) is True
        assert fibers.delete_fiber(rec.id) is False
        assert fibers.get_fiber(rec.id) is None


class TestFiberTransactions:
    def test_rollback_leaves_nothing_written(self, fibers: FiberStore) -> None:
        kept = fibers.insert_fiber("m", now=1.0)

        def writes() -> None:
            fibers.insert_fiber("m", fiber_id="lost")
            fibers.set_checkpoint(kept.id, {"lost": True})
            fibers.update_fiber(kept.id, status="completed")
            fibers.insert_schedule("m", kind="once", next_run_at=5.0, schedule_id="s-lost")

        rolled_back(fibers, writes)
        assert [f.id for f in fibers.list_fibers()] == [kept.id]
        stored = fibers.get_fiber(kept.id)
        assert stored is not None and stored.status == "running" and stored.checkpoint is None
        assert fibers.get_schedule("s-lost") is None

    def test_commit_and_reads_inside_see_writes(self, fibers: FiberStore) -> None:
        with fibers.transaction():
            rec = fibers.insert_fiber("m", fiber_id="f1")
            fibers.set_checkpoint(rec.id, {"step": 1})
            assert fibers.get_fiber("f1").checkpoint == {"step": 1}  # type: ignore[union-attr]
        assert fibers.get_fiber("f1").checkpoint == {"step": 1}  # type: ignore[union-attr]

    def test_nested_blocks_join_the_outer_one(self, fibers: FiberStore) -> None:
        nested_rolled_back(
            fibers,
            lambda: fibers.insert_fiber("m", fiber_id="outer"),
            lambda: fibers.insert_fiber("m", fiber_id="inner"),
        )
        assert fibers.list_fibers() == []
        inner_failure_caught(
            fibers,
            lambda: fibers.insert_fiber("m", fiber_id="inner"),
            lambda: fibers.insert_fiber("m", fiber_id="after"),
        )
        assert {f.id for f in fibers.list_fibers()} == {"inner", "after"}


class TestFiberPersistence:
    def test_fibers_and_schedules_survive_a_reopen(self, stores: Stores, reopen: Reopen) -> None:
        again_of = need_reopen(reopen)
        fibers = stores.fibers()
        a = fibers.insert_fiber("m", {"p": "a"}, max_retries=0, now=10.0)
        fibers.set_checkpoint(a.id, {"half": "abc"}, now=11.0)
        b = fibers.insert_fiber("m", now=20.0)
        fibers.update_fiber(b.id, status="failed", error="kaput", attempts=4, now=21.0)
        sch = fibers.insert_schedule(
            "tick", {"x": 1}, kind="interval", interval_seconds=30, now=0.0
        )
        before = [f.to_dict() for f in fibers.list_fibers()]

        again = again_of(stores).fibers()
        assert [f.to_dict() for f in again.list_fibers()] == before
        stored = again.get_schedule(sch.id)
        assert stored is not None and stored.to_dict() == sch.to_dict()
        with pytest.raises(InvalidInputError):  # ids stay taken across a reopen
            again.insert_fiber("m", fiber_id=a.id)


# -- schedules -------------------------------------------------------------------------


class TestScheduleInsert:
    def test_once(self, fibers: FiberStore) -> None:
        rec = fibers.insert_schedule("tick", {"n": 1}, kind="once", next_run_at=500.0, now=100.0)
        assert (rec.kind, rec.next_run_at, rec.payload, rec.created_at) == (
            "once",
            500.0,
            {"n": 1},
            100.0,
        )
        assert rec.enabled and rec.runs == 0 and rec.failures == 0
        stored = fibers.get_schedule(rec.id)
        assert stored is not None and stored.to_dict() == rec.to_dict()

    def test_interval_first_run(self, fibers: FiberStore) -> None:
        rec = fibers.insert_schedule("tick", kind="interval", interval_seconds=10, now=1000.0)
        assert (rec.next_run_at, rec.interval_seconds) == (1010.0, 10.0)
        given = fibers.insert_schedule(
            "tick", kind="interval", interval_seconds=10, next_run_at=1003.0, now=1000.0
        )
        assert given.next_run_at == 1003.0

    def test_cron_first_run_is_the_next_fire_time(self, fibers: FiberStore) -> None:
        rec = fibers.insert_schedule(
            "tick", kind="cron", cron="*/15 * * * *", now=ts(2024, 1, 1, 0, 7, 30)
        )
        assert rec.next_run_at == ts(2024, 1, 1, 0, 15)
        assert rec.cron == "*/15 * * * *" and rec.interval_seconds is None

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"method": "", "kind": "once", "next_run_at": 1.0},
            {"method": "m", "kind": "weekly", "next_run_at": 1.0},
            {"method": "m", "kind": "once"},
            {"method": "m", "kind": "once", "next_run_at": "soon"},
            {"method": "m", "kind": "once", "next_run_at": math.nan},
            {"method": "m", "kind": "interval", "interval_seconds": 0},
            {"method": "m", "kind": "interval", "interval_seconds": -5},
            {"method": "m", "kind": "interval", "interval_seconds": math.inf},
            {"method": "m", "kind": "interval", "interval_seconds": math.nan},
            {"method": "m", "kind": "interval", "interval_seconds": True},
            {"method": "m", "kind": "interval", "interval_seconds": "10"},
            {"method": "m", "kind": "cron"},
            {"method": "m", "kind": "cron", "cron": "61 * * * *"},
            {"method": "m", "kind": "cron", "cron": "0 0 31 2 *"},
            {"method": "m", "kind": "once", "next_run_at": 1.0, "payload": object()},
        ],
    )
    def test_bad_input_writes_nothing(self, fibers: FiberStore, kwargs: dict[str, Any]) -> None:
        with pytest.raises(InvalidInputError):
            fibers.insert_schedule(**kwargs)
        assert fibers.list_schedules(include_disabled=True) == []

    def test_existing_id_is_refused(self, fibers: FiberStore) -> None:
        fibers.insert_schedule("first", kind="once", next_run_at=1.0, schedule_id="s1")
        with pytest.raises(InvalidInputError, match="already exists"):
            fibers.insert_schedule("second", kind="once", next_run_at=2.0, schedule_id="s1")
        assert fibers.get_schedule("s1").method == "first"  # type: ignore[union-attr]

    def test_unknown_ids(self, fibers: FiberStore) -> None:
        assert fibers.get_schedule("nope") is None
        assert fibers.delete_schedule("nope") is False
        assert fibers.mark_ran("nope") is None  # cancelled while it ran: not an error

    def test_delete(self, fibers: FiberStore) -> None:
        rec = fibers.insert_schedule("m", kind="once", next_run_at=1.0)
        assert fibers.delete_schedule(rec.id) is True
        assert fibers.delete_schedule(rec.id) is False
        assert fibers.get_schedule(rec.id) is None


class TestScheduleRuns:
    def test_interval_keeps_phase_and_coalesces_missed_runs(self, fibers: FiberStore) -> None:
        rec = fibers.insert_schedule("tick", kind="interval", interval_seconds=10, now=1000.0)
        assert fibers.due_schedules(1005.0) == []
        assert [r.id for r in fibers.due_schedules(1010.0)] == [rec.id]
        assert fibers.mark_ran(rec.id, now=1011.0).next_run_at == 1020.0  # type: ignore[union-attr]
        # The actor slept through four runs: one run now, the next on the original phase.
        ran = fibers.mark_ran(rec.id, now=1065.0)
        assert ran is not None and ran.next_run_at == 1070.0 and ran.runs == 2
        assert fibers.get_schedule(rec.id).to_dict() == ran.to_dict()  # type: ignore[union-attr]

    def test_once_is_disabled_after_its_run(self, fibers: FiberStore) -> None:
        once = fibers.insert_schedule("tick", kind="once", next_run_at=1100.0, now=1000.0)
        marked = fibers.mark_ran(once.id, now=1100.0)
        assert marked is not None and marked.next_run_at is None and not marked.enabled
        assert (marked.runs, marked.last_run_at) == (1, 1100.0)
        assert fibers.due_schedules(5000.0) == []
        assert fibers.next_due_at() is None

    def test_cron_goes_to_its_next_fire_time(self, fibers: FiberStore) -> None:
        rec = fibers.insert_schedule("tick", kind="cron", cron="*/15 * * * *", now=ts(2024, 1, 1))
        ran = fibers.mark_ran(rec.id, now=ts(2024, 1, 1, 0, 15, 10))
        assert ran is not None and ran.next_run_at == ts(2024, 1, 1, 0, 30)

    def test_failures_are_recorded(self, fibers: FiberStore) -> None:
        rec = fibers.insert_schedule("tick", kind="interval", interval_seconds=10, now=0.0)
        failed = fibers.mark_ran(rec.id, error="RuntimeError: x", ran_at=9.0, now=10.0)
        assert failed is not None
        assert (failed.runs, failed.failures, failed.last_error, failed.last_run_at) == (
            1,
            1,
            "RuntimeError: x",
            9.0,
        )
        ok = fibers.mark_ran(rec.id, now=20.0)
        assert ok is not None and (ok.runs, ok.failures, ok.last_error) == (2, 1, None)

    def test_due_is_earliest_first_and_honours_exclude(self, fibers: FiberStore) -> None:
        late = fibers.insert_schedule("m", kind="once", next_run_at=30.0).id
        early = fibers.insert_schedule("m", kind="once", next_run_at=10.0).id
        fibers.insert_schedule("m", kind="once", next_run_at=100.0)
        assert [r.id for r in fibers.due_schedules(50.0)] == [early, late]
        assert [r.id for r in fibers.due_schedules(50.0, exclude={early})] == [late]
        assert fibers.next_due_at() == 10.0
        assert fibers.next_due_at(exclude=[early]) == 30.0
        assert fibers.next_due_at(exclude=[early, late]) == 100.0

    def test_listing_order_and_disabled(self, fibers: FiberStore) -> None:
        b = fibers.insert_schedule("m", kind="once", next_run_at=20.0).id
        a = fibers.insert_schedule("m", kind="once", next_run_at=10.0).id
        ran = fibers.insert_schedule("m", kind="once", next_run_at=5.0).id
        fibers.mark_ran(ran, now=6.0)
        assert [s.id for s in fibers.list_schedules()] == [a, b]
        assert [s.id for s in fibers.list_schedules(include_disabled=True)] == [a, b, ran]
        assert fibers.next_due_at() == 10.0

    def test_delete_disabled_schedules(self, fibers: FiberStore) -> None:
        old = fibers.insert_schedule("m", kind="once", next_run_at=100.0).id
        recent = fibers.insert_schedule("m", kind="once", next_run_at=180.0).id
        enabled = fibers.insert_schedule("m", kind="once", next_run_at=10.0).id
        fibers.mark_ran(old, now=100.0)
        fibers.mark_ran(recent, now=180.0)
        assert fibers.delete_disabled_schedules(50.0, now=200.0) == 1
        assert {s.id for s in fibers.list_schedules(include_disabled=True)} == {recent, enabled}


class TestScheduleTransactions:
    def test_rollback_undoes_a_run(self, fibers: FiberStore) -> None:
        rec = fibers.insert_schedule("tick", kind="interval", interval_seconds=10, now=0.0)

        def writes() -> None:
            fibers.mark_ran(rec.id, now=10.0)
            fibers.delete_schedule(rec.id)

        rolled_back(fibers, writes)
        stored = fibers.get_schedule(rec.id)
        assert stored is not None and stored.to_dict() == rec.to_dict()
