"""Conformance suite for :class:`thinkray.storage.protocols.JobStore`. Fixtures: see
:mod:`thinkray.storage.testing.store_helpers`; the suite's own ``jobs`` fixture is ``stores.jobs()``."""

from __future__ import annotations

import pytest
from thinkray.storage.errors import InvalidInputError
from thinkray.storage.protocols import JobRecord, JobStore, Stores
from thinkray.storage.testing.store_helpers import (
    Reopen,
    inner_failure_caught,
    need_reopen,
    nested_rolled_back,
    rolled_back,
)

__all__ = [
    "TestJobPersistence",
    "TestJobProgressAndLate",
    "TestJobRows",
    "TestJobTransactions",
    "TestJobWrites",
    "jobs",
]


@pytest.fixture
def jobs(stores: Stores) -> JobStore:
    return stores.jobs()


def job(jid: str, status: str = "running", **fields: object) -> JobRecord:
    return JobRecord(id=jid, status=status, **fields)  # type: ignore[arg-type]


class TestJobWrites:
    def test_insert_stamps_times_and_get_reads_it(self, jobs: JobStore) -> None:
        rec = jobs.insert(job("j1", kind="worker", input={"q": 1}, parent={"run_id": "r"}))
        assert rec.created_at > 0 and rec.updated_at >= rec.created_at
        stored = jobs.get("j1")
        assert stored is not None and stored.to_dict() == rec.to_dict()
        assert (stored.kind, stored.input, stored.parent) == ("worker", {"q": 1}, {"run_id": "r"})

    def test_insert_keeps_a_given_creation_time(self, jobs: JobStore) -> None:
        jobs.insert(job("j1", created_at=123.0))
        assert jobs.get("j1").created_at == 123.0  # type: ignore[union-attr]

    def test_existing_id_is_refused_and_nothing_changes(self, jobs: JobStore) -> None:
        jobs.insert(job("j1", kind="first"))
        with pytest.raises(InvalidInputError, match="already exists"):
            jobs.insert(job("j1", "completed", kind="second"))
        stored = jobs.get("j1")
        assert stored is not None and (stored.kind, stored.status) == ("first", "running")

    def test_bad_input_writes_nothing(self, jobs: JobStore) -> None:
        with pytest.raises(InvalidInputError):
            jobs.insert(job("j1", "bogus"))
        with pytest.raises(InvalidInputError):
            jobs.insert(job("j2", input=object()))
        assert jobs.rows() == []

    def test_update_replaces_status_result_and_error(self, jobs: JobStore) -> None:
        created = jobs.insert(job("j1", input="in")).created_at
        done = jobs.update("j1", "completed", result={"answer": 42})
        assert done is not None and (done.status, done.result, done.error) == (
            "completed",
            {"answer": 42},
            None,
        )
        assert done.finished and done.created_at == created and done.input == "in"
        assert jobs.get("j1").to_dict() == done.to_dict()  # type: ignore[union-attr]
        failed = jobs.update("j1", "failed", error="boom")
        assert failed is not None and (failed.result, failed.error) == (None, "boom")

    def test_bad_update_writes_nothing(self, jobs: JobStore) -> None:
        jobs.insert(job("j1"))
        with pytest.raises(InvalidInputError):
            jobs.update("j1", "bogus")
        with pytest.raises(InvalidInputError):
            jobs.update("j1", "completed", result=object())
        stored = jobs.get("j1")
        assert stored is not None and stored.status == "running" and stored.result is None

    def test_unknown_ids(self, jobs: JobStore) -> None:
        assert jobs.get("nope") is None
        assert jobs.update("nope", "completed") is None
        assert jobs.delete("nope") is False
        assert jobs.rows() == []

    def test_delete(self, jobs: JobStore) -> None:
        jobs.insert(job("j1"))
        assert jobs.delete("j1") is True
        assert jobs.delete("j1") is False
        assert jobs.get("j1") is None

    def test_interrupt_running(self, jobs: JobStore) -> None:
        jobs.insert(job("a"))
        jobs.insert(job("b"))
        jobs.insert(job("c", "completed", result=1))
        assert jobs.interrupt_running("the agent died") == 2
        by_id = {r.id: r for r in jobs.rows()}
        assert (by_id["a"].status, by_id["a"].error) == ("interrupted", "the agent died")
        assert by_id["b"].status == "interrupted"
        assert (by_id["c"].status, by_id["c"].result) == ("completed", 1)
        assert jobs.interrupt_running("again") == 0


class TestJobProgressAndLate:
    def test_progress_is_written_while_running_and_kept_after(self, jobs: JobStore) -> None:
        jobs.insert(job("j1", input="in"))
        rec = jobs.set_progress("j1", 0.25, "a quarter")
        assert rec is not None and (rec.status, rec.progress, rec.message) == (
            "running",
            0.25,
            "a quarter",
        )
        assert jobs.get("j1").to_dict() == rec.to_dict()  # type: ignore[union-attr]
        jobs.set_progress("j1", {"done": 3, "of": 4})
        stored = jobs.get("j1")
        assert stored is not None and (stored.progress, stored.message) == (
            {"done": 3, "of": 4},
            None,
        )
        done = jobs.update("j1", "completed", result=1)
        assert done is not None and done.progress == {"done": 3, "of": 4} and done.input == "in"
        # a finished job's last report is final: nothing written
        after = jobs.set_progress("j1", 0.1, "too late")
        assert after is not None and after.progress == {"done": 3, "of": 4}
        assert jobs.get("j1").message is None  # type: ignore[union-attr]

    def test_bad_progress_writes_nothing(self, jobs: JobStore) -> None:
        jobs.insert(job("j1"))
        jobs.set_progress("j1", 0.5, "half")
        with pytest.raises(InvalidInputError):
            jobs.set_progress("j1", object())
        stored = jobs.get("j1")
        assert stored is not None and (stored.progress, stored.message) == (0.5, "half")
        assert jobs.set_progress("nope", 0.5) is None

    def test_late_result_only_on_a_cancelled_job(self, jobs: JobStore) -> None:
        jobs.insert(job("j1"))
        with pytest.raises(InvalidInputError, match="cancelled"):
            jobs.store_late("j1", result="early")
        jobs.update("j1", "cancelled", error="user said stop")
        rec = jobs.store_late("j1", result={"answer": 42})
        assert rec is not None and rec.late is not None
        assert (rec.status, rec.result, rec.error) == ("cancelled", None, "user said stop")
        assert rec.late["result"] == {"answer": 42} and rec.late["error"] is None
        assert jobs.get("j1").to_dict() == rec.to_dict()  # type: ignore[union-attr]
        with pytest.raises(InvalidInputError):
            jobs.store_late("j1", result=object())
        assert jobs.get("j1").late["result"] == {"answer": 42}  # type: ignore[union-attr,index]
        assert jobs.store_late("nope", result=1) is None


class TestJobRows:
    def test_oldest_first(self, jobs: JobStore) -> None:
        jobs.insert(job("late", created_at=300.0))
        jobs.insert(job("early", created_at=100.0))
        jobs.insert(job("b-tie", created_at=200.0))
        jobs.insert(job("a-tie", created_at=200.0))
        assert [r.id for r in jobs.rows()] == ["early", "a-tie", "b-tie", "late"]

    def test_filter_by_status(self, jobs: JobStore) -> None:
        jobs.insert(job("run", created_at=1.0))
        jobs.insert(job("done", "completed", created_at=2.0))
        jobs.insert(job("cancel", "cancelled", created_at=3.0))
        assert [r.id for r in jobs.rows("running")] == ["run"]
        assert [r.id for r in jobs.rows(["cancelled", "completed"])] == ["done", "cancel"]
        with pytest.raises(InvalidInputError):
            jobs.rows("bogus")


class TestJobTransactions:
    def test_rollback_leaves_nothing_written(self, jobs: JobStore) -> None:
        jobs.insert(job("kept"))

        def writes() -> None:
            jobs.insert(job("lost"))
            jobs.update("kept", "completed", result="lost")
            jobs.delete("kept")

        rolled_back(jobs, writes)
        assert [r.id for r in jobs.rows()] == ["kept"]
        stored = jobs.get("kept")
        assert stored is not None and stored.status == "running" and stored.result is None

    def test_commit_and_nesting(self, jobs: JobStore) -> None:
        with jobs.transaction():
            jobs.insert(job("a"))
            jobs.update("a", "completed", result=1)
        assert jobs.get("a").status == "completed"  # type: ignore[union-attr]
        nested_rolled_back(jobs, lambda: jobs.insert(job("outer")), lambda: jobs.insert(job("in")))
        assert [r.id for r in jobs.rows()] == ["a"]
        inner_failure_caught(jobs, lambda: jobs.insert(job("in")), lambda: jobs.delete("a"))
        assert [r.id for r in jobs.rows()] == ["in"]


class TestJobPersistence:
    def test_jobs_survive_a_reopen(self, stores: Stores, reopen: Reopen) -> None:
        again_of = need_reopen(reopen)
        jobs = stores.jobs()
        jobs.insert(job("a", kind="worker", input={"x": [1, 2]}, created_at=1.0))
        jobs.insert(job("b", created_at=2.0))
        jobs.update("b", "failed", error="kaput")
        before = [r.to_dict() for r in jobs.rows()]
        again = again_of(stores).jobs()
        assert [r.to_dict() for r in again.rows()] == before
        with pytest.raises(InvalidInputError):
            again.insert(job("a"))
