"""Conformance suite for :class:`thinkray.storage.protocols.ToolCallStore`. Fixtures: see
:mod:`thinkray.storage.testing.store_helpers`; the suite's own ``tool_calls`` fixture is
``stores.tool_calls()``."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from thinkray.storage.errors import InvalidInputError
from thinkray.storage.protocols import Stores, ToolCallRecord, ToolCallStore
from thinkray.storage.records import (
    TOOL_CALL_FINISHED,
    TOOL_CALL_STATUSES,
    TOOL_CALL_TRANSITIONS,
)
from thinkray.storage.testing.store_helpers import (
    Reopen,
    inner_failure_caught,
    need_reopen,
    nested_rolled_back,
    rolled_back,
)

__all__ = [
    "TestToolCallAudit",
    "TestToolCallClaims",
    "TestToolCallDeadlines",
    "TestToolCallLeases",
    "TestToolCallLateResults",
    "TestToolCallPersistence",
    "TestToolCallRows",
    "TestToolCallTransactions",
    "TestToolCallTransitions",
    "TestToolCallWrites",
    "tool_calls",
]

OPEN = tuple(s for s in TOOL_CALL_STATUSES if s not in TOOL_CALL_FINISHED)
CANCELLED = ("cancelled-by-user", "cancelled-by-timeout", "cancelled-by-error")
ALLOWED = [(a, b) for a in TOOL_CALL_STATUSES for b in sorted(TOOL_CALL_TRANSITIONS[a])]
FORBIDDEN = [
    (a, b)
    for a in TOOL_CALL_STATUSES
    for b in TOOL_CALL_STATUSES
    if b not in TOOL_CALL_TRANSITIONS[a]
]


@pytest.fixture
def tool_calls(stores: Stores) -> ToolCallStore:
    return stores.tool_calls()


def call(
    cid: str, status: str = "pending", tool_name: str = "search", **fields: object
) -> ToolCallRecord:
    return ToolCallRecord(id=cid, tool_name=tool_name, status=status, **fields)  # type: ignore[arg-type]


def status_of(store: ToolCallStore, cid: str) -> str:
    rec = store.get(cid)
    assert rec is not None
    return rec.status


class TestToolCallWrites:
    def test_insert_stamps_times_and_get_reads_it(self, tool_calls: ToolCallStore) -> None:
        rec = tool_calls.insert(
            call(
                "c1",
                run_id="r1",
                session_id="s1",
                input={"q": [1, 2]},
                durable=True,
                approval={"decision": "approved", "by": "u"},
            )
        )
        assert rec.created_at > 0 and rec.updated_at >= rec.created_at
        stored = tool_calls.get("c1")
        assert stored is not None and stored.to_dict() == rec.to_dict()
        assert (stored.tool_name, stored.run_id, stored.session_id) == ("search", "r1", "s1")
        assert (stored.input, stored.durable, stored.attempts) == ({"q": [1, 2]}, True, 0)
        assert stored.approval == {"decision": "approved", "by": "u"}
        assert (stored.executor, stored.result, stored.error) == (None, None, None)
        assert (stored.late_result, stored.late_error, stored.late_at) == (None, None, None)
        assert not stored.finished and not stored.cancelled

    def test_insert_keeps_a_given_creation_time(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1", created_at=123.0))
        assert tool_calls.get("c1").created_at == 123.0  # type: ignore[union-attr]

    def test_insert_takes_any_status(self, tool_calls: ToolCallStore) -> None:
        for i, status in enumerate(TOOL_CALL_STATUSES):
            tool_calls.insert(call(f"c{i}", status))
        assert [r.status for r in tool_calls.rows()] == list(TOOL_CALL_STATUSES)

    def test_existing_id_is_refused_and_nothing_changes(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1", input="first"))
        with pytest.raises(InvalidInputError, match="already exists"):
            tool_calls.insert(call("c1", "completed", tool_name="other", input="second"))
        stored = tool_calls.get("c1")
        assert stored is not None
        assert (stored.status, stored.tool_name, stored.input) == ("pending", "search", "first")
        assert len(tool_calls.rows()) == 1

    def test_bad_input_writes_nothing(self, tool_calls: ToolCallStore) -> None:
        with pytest.raises(InvalidInputError):
            tool_calls.insert(call("c1", "bogus"))
        with pytest.raises(InvalidInputError):
            tool_calls.insert(call("c2", input=object()))
        with pytest.raises(InvalidInputError):
            tool_calls.insert(call("c3", result={1, 2}))
        assert tool_calls.rows() == []
        assert tool_calls.get("c1") is None and tool_calls.get("c2") is None

    def test_unknown_ids(self, tool_calls: ToolCallStore) -> None:
        assert tool_calls.get("nope") is None
        assert tool_calls.transition("nope", ["pending"], "executing") is None
        assert (
            tool_calls.transition("nope", ["pending"], "executing", executor="w", claim=True)
            is None
        )
        assert tool_calls.store_late("nope", result=1) is None
        assert tool_calls.rows() == []
        assert tool_calls.audit_rows() == []


class TestToolCallTransitions:
    @pytest.mark.parametrize(("source", "target"), ALLOWED)
    def test_every_allowed_move(self, tool_calls: ToolCallStore, source: str, target: str) -> None:
        created = tool_calls.insert(call("c1", source, input="in", created_at=5.0))
        moved = tool_calls.transition("c1", [source], target)
        assert moved is not None and moved.status == target
        assert (moved.input, moved.created_at) == ("in", 5.0)
        assert moved.updated_at >= created.updated_at
        assert tool_calls.get("c1").to_dict() == moved.to_dict()  # type: ignore[union-attr]

    def test_forbidden_moves_raise_and_write_nothing(self, tool_calls: ToolCallStore) -> None:
        assert FORBIDDEN
        for i, (source, target) in enumerate(FORBIDDEN):
            cid = f"c{i}"
            before = tool_calls.insert(call(cid, source))
            with pytest.raises(InvalidInputError):
                tool_calls.transition(cid, [source], target, result="x", error="e")
            after = tool_calls.get(cid)
            assert after is not None and after.to_dict() == before.to_dict()

    def test_a_move_forbidden_from_any_expected_status_raises(
        self, tool_calls: ToolCallStore
    ) -> None:
        """Whether a move is allowed depends on the request, not on the call's status."""
        tool_calls.insert(call("c1"))
        with pytest.raises(InvalidInputError):  # executing → executing is not a move
            tool_calls.transition("c1", ["pending", "executing"], "executing")
        with pytest.raises(InvalidInputError):  # completed is final
            tool_calls.transition("c1", ["pending", "completed"], "cancelled-by-user")
        assert status_of(tool_calls, "c1") == "pending"

    def test_unknown_statuses_raise_and_write_nothing(self, tool_calls: ToolCallStore) -> None:
        before = tool_calls.insert(call("c1"))
        with pytest.raises(InvalidInputError):
            tool_calls.transition("c1", ["pending"], "bogus")
        with pytest.raises(InvalidInputError):
            tool_calls.transition("c1", ["bogus"], "executing")
        with pytest.raises(InvalidInputError):
            tool_calls.transition("c1", [], "executing")
        assert tool_calls.get("c1").to_dict() == before.to_dict()  # type: ignore[union-attr]

    def test_an_unencodable_result_writes_nothing(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1", "executing", executor="w"))
        with pytest.raises(InvalidInputError):
            tool_calls.transition("c1", ["executing"], "completed", result=object())
        stored = tool_calls.get("c1")
        assert stored is not None and stored.status == "executing" and stored.result is None

    def test_wrong_expected_status_returns_none_and_changes_nothing(
        self, tool_calls: ToolCallStore
    ) -> None:
        before = tool_calls.insert(call("c1", "awaiting-approval"))
        assert tool_calls.transition("c1", ["pending"], "executing") is None
        assert tool_calls.transition("c1", ["pending", "executing"], "failed", error="x") is None
        assert tool_calls.get("c1").to_dict() == before.to_dict()  # type: ignore[union-attr]

    def test_a_single_status_string_is_one_status(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1"))
        moved = tool_calls.transition("c1", "pending", "awaiting-approval")
        assert moved is not None and moved.status == "awaiting-approval"

    def test_result_error_and_approval_are_stored_when_given(
        self, tool_calls: ToolCallStore
    ) -> None:
        tool_calls.insert(call("c1"))
        decision = {"decision": "approved", "by": "alice", "reason": None, "at": 1.0}
        tool_calls.transition("c1", ["pending"], "awaiting-approval")
        back = tool_calls.transition("c1", ["awaiting-approval"], "pending", approval=decision)
        assert back is not None and back.approval == decision
        tool_calls.transition("c1", ["pending"], "executing", executor="w", claim=True)
        done = tool_calls.transition(
            "c1", ["executing"], "completed", executor="w", result={"hits": [1, 2]}
        )
        assert done is not None and (done.status, done.result, done.error) == (
            "completed",
            {"hits": [1, 2]},
            None,
        )
        assert done.approval == decision and done.finished
        assert tool_calls.get("c1").to_dict() == done.to_dict()  # type: ignore[union-attr]

    def test_a_failure_keeps_its_error(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1", "executing", executor="w"))
        failed = tool_calls.transition("c1", ["executing"], "failed", error="boom")
        assert failed is not None and (failed.status, failed.error) == ("failed", "boom")
        assert tool_calls.get("c1").error == "boom"  # type: ignore[union-attr]

    def test_any_open_call_can_be_cancelled_at_once(self, tool_calls: ToolCallStore) -> None:
        for status in OPEN:
            tool_calls.insert(call(status, status))
        for status in OPEN:
            moved = tool_calls.transition(status, OPEN, "cancelled-by-user")
            assert moved is not None and moved.cancelled and moved.finished

    def test_final_statuses_never_move(self, tool_calls: ToolCallStore) -> None:
        for final in sorted(TOOL_CALL_FINISHED):
            before = tool_calls.insert(call(final, final, result="r"))
            assert tool_calls.transition(final, OPEN, "cancelled-by-error") is None
            assert tool_calls.transition(final, ["executing"], "completed", result="x") is None
            for target in TOOL_CALL_STATUSES:
                with pytest.raises(InvalidInputError):
                    tool_calls.transition(final, [final], target)
            after = tool_calls.get(final)
            assert after is not None and after.to_dict() == before.to_dict()


class TestToolCallClaims:
    def test_a_claim_sets_the_executor_and_counts_attempts(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1"))
        claimed = tool_calls.transition("c1", ["pending"], "executing", executor="w1", claim=True)
        assert claimed is not None
        assert (claimed.status, claimed.executor, claimed.attempts) == ("executing", "w1", 1)
        stored = tool_calls.get("c1")
        assert stored is not None and (stored.executor, stored.attempts) == ("w1", 1)

    def test_a_claim_needs_an_executor(self, tool_calls: ToolCallStore) -> None:
        before = tool_calls.insert(call("c1"))
        with pytest.raises(InvalidInputError):
            tool_calls.transition("c1", ["pending"], "executing", claim=True)
        assert tool_calls.get("c1").to_dict() == before.to_dict()  # type: ignore[union-attr]

    def test_a_call_is_claimed_once(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1"))
        first = tool_calls.transition("c1", ["pending"], "executing", executor="w1", claim=True)
        second = tool_calls.transition("c1", ["pending"], "executing", executor="w2", claim=True)
        assert first is not None and second is None
        stored = tool_calls.get("c1")
        assert stored is not None and (stored.executor, stored.attempts) == ("w1", 1)

    def test_only_the_holder_moves_the_call(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1"))
        tool_calls.transition("c1", ["pending"], "executing", executor="w1", claim=True)
        assert (
            tool_calls.transition("c1", ["executing"], "completed", executor="w2", result="x")
            is None
        )
        stored = tool_calls.get("c1")
        assert stored is not None and (stored.status, stored.result) == ("executing", None)
        done = tool_calls.transition("c1", ["executing"], "completed", executor="w1", result="ok")
        assert done is not None and (done.status, done.result, done.executor) == (
            "completed",
            "ok",
            "w1",
        )
        assert done.attempts == 1  # only claims count

    def test_an_unheld_call_does_not_match_an_executor(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1"))
        assert tool_calls.transition("c1", ["pending"], "failed", executor="w1") is None
        assert status_of(tool_calls, "c1") == "pending"

    def test_without_an_executor_anyone_may_move_it(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1"))
        tool_calls.transition("c1", ["pending"], "executing", executor="w1", claim=True)
        moved = tool_calls.transition("c1", ["executing"], "cancelled-by-timeout")
        assert moved is not None and moved.status == "cancelled-by-timeout"
        assert moved.executor == "w1"

    def test_attempts_count_every_claim(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1", attempts=2))
        tool_calls.transition("c1", ["pending"], "awaiting-approval")
        tool_calls.transition("c1", ["awaiting-approval"], "pending")
        claimed = tool_calls.transition("c1", ["pending"], "executing", executor="w", claim=True)
        assert claimed is not None and claimed.attempts == 3

    def test_exactly_one_of_racing_threads_claims_the_call(self, tool_calls: ToolCallStore) -> None:
        n_calls, n_threads = 5, 8
        for i in range(n_calls):
            tool_calls.insert(call(f"c{i}"))
        barrier = threading.Barrier(n_threads)
        wins: dict[str, list[str]] = {f"c{i}": [] for i in range(n_calls)}
        errors: list[BaseException] = []
        lock = threading.Lock()

        def worker(name: str) -> None:
            try:
                barrier.wait()
                for i in range(n_calls):
                    got = tool_calls.transition(
                        f"c{i}", ["pending"], "executing", executor=name, claim=True
                    )
                    if got is not None:
                        with lock:
                            wins[f"c{i}"].append(name)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(f"w{t}",)) for t in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert errors == []
        for cid, winners in wins.items():
            assert len(winners) == 1, (cid, winners)
            stored = tool_calls.get(cid)
            assert stored is not None
            assert (stored.status, stored.executor, stored.attempts) == (
                "executing",
                winners[0],
                1,
            )


def claimed(store: ToolCallStore, cid: str, executor: str, lease_until: float | None) -> None:
    store.insert(call(cid, durable=True))
    got = store.transition(
        cid, ["pending"], "executing", executor=executor, claim=True, lease_until=lease_until
    )
    assert got is not None and got.lease_until == lease_until


class TestToolCallLeases:
    """A claim's visibility timeout: renewed by its holder, lapsed back to pending."""

    def test_a_claim_records_its_lease(self, tool_calls: ToolCallStore) -> None:
        claimed(tool_calls, "c1", "w1", 1000.0)
        stored = tool_calls.get("c1")
        assert stored is not None and (stored.executor, stored.lease_until) == ("w1", 1000.0)
        assert tool_calls.next_deadline() == 1000.0

    def test_only_a_claim_sets_a_lease_and_bad_times_are_refused(
        self, tool_calls: ToolCallStore
    ) -> None:
        before = tool_calls.insert(call("c1"))
        with pytest.raises(InvalidInputError):
            tool_calls.transition("c1", ["pending"], "awaiting-approval", lease_until=5.0)
        # deliberately ill-typed: the store must refuse what a caller's types let through
        bad_leases: tuple[Any, ...] = (float("nan"), float("inf"), "soon", True)
        for bad in bad_leases:
            with pytest.raises(InvalidInputError):
                tool_calls.transition(
                    "c1", ["pending"], "executing", executor="w", claim=True, lease_until=bad
                )
        with pytest.raises(InvalidInputError):
            tool_calls.insert(call("c2", deadline_at=float("nan")))
        assert tool_calls.get("c1").to_dict() == before.to_dict()  # type: ignore[union-attr]
        assert tool_calls.get("c2") is None

    def test_the_holder_renews_and_nobody_else(self, tool_calls: ToolCallStore) -> None:
        claimed(tool_calls, "c1", "w1", 1000.0)
        assert tool_calls.renew("c1", "w2", 5000.0) is None
        renewed = tool_calls.renew("c1", "w1", 2000.0)
        assert renewed is not None and renewed.lease_until == 2000.0
        assert tool_calls.get("c1").lease_until == 2000.0  # type: ignore[union-attr]
        assert tool_calls.next_deadline() == 2000.0
        assert tool_calls.renew("nope", "w1", 3000.0) is None

    def test_a_lapsed_claim_goes_back_to_pending_and_another_claims_it(
        self, tool_calls: ToolCallStore
    ) -> None:
        claimed(tool_calls, "c1", "w1", 1000.0)
        claimed(tool_calls, "c2", "w1", 3000.0)
        assert tool_calls.lapse(999.0) == []
        [lapsed] = tool_calls.lapse(1000.0)
        assert (lapsed.id, lapsed.status, lapsed.executor, lapsed.lease_until) == (
            "c1",
            "pending",
            None,
            None,
        )
        assert tool_calls.get("c1").to_dict() == lapsed.to_dict()  # type: ignore[union-attr]
        assert status_of(tool_calls, "c2") == "executing"  # its lease is still ahead
        # the old holder holds nothing any more: no renewal, no result
        assert tool_calls.renew("c1", "w1", 5000.0) is None
        assert tool_calls.transition("c1", ["executing"], "completed", executor="w1") is None
        again = tool_calls.transition(
            "c1", ["pending"], "executing", executor="w2", claim=True, lease_until=4000.0
        )
        assert again is not None and (again.executor, again.attempts) == ("w2", 2)
        assert tool_calls.transition("c1", ["executing"], "completed", executor="w1") is None
        done = tool_calls.transition("c1", ["executing"], "completed", executor="w2", result=1)
        assert done is not None and done.lease_until is None
        assert tool_calls.lapse(10_000.0) == [tool_calls.get("c2")]

    def test_a_renewed_lease_does_not_lapse(self, tool_calls: ToolCallStore) -> None:
        claimed(tool_calls, "c1", "w1", 1000.0)
        tool_calls.renew("c1", "w1", 2000.0)
        assert tool_calls.lapse(1500.0) == []
        assert status_of(tool_calls, "c1") == "executing"

    def test_a_claim_without_a_lease_never_lapses(self, tool_calls: ToolCallStore) -> None:
        claimed(tool_calls, "c1", "inline", None)
        assert tool_calls.lapse(1e12) == []
        assert tool_calls.next_deadline() is None

    def test_every_other_move_ends_the_lease(self, tool_calls: ToolCallStore) -> None:
        claimed(tool_calls, "c1", "w1", 1000.0)
        back = tool_calls.transition("c1", ["executing"], "pending")
        assert back is not None and (back.lease_until, back.status) == (None, "pending")
        assert tool_calls.next_deadline() is None and tool_calls.lapse(1e12) == []


class TestToolCallDeadlines:
    """An open call past its deadline is cancelled-by-timeout, an ask included."""

    @pytest.mark.parametrize("status", OPEN)
    def test_an_open_call_past_its_deadline_is_cancelled_by_timeout(
        self, tool_calls: ToolCallStore, status: str
    ) -> None:
        tool_calls.insert(call("c1", status, deadline_at=1000.0, approval={"approval_id": "a"}))
        assert tool_calls.expire(999.0) == []
        [expired] = tool_calls.expire(1000.0)
        assert (expired.id, expired.status) == ("c1", "cancelled-by-timeout")
        assert expired.error and "timed out" in expired.error and expired.finished
        assert tool_calls.get("c1").to_dict() == expired.to_dict()  # type: ignore[union-attr]
        if status == "awaiting-approval":
            assert expired.approval is not None
            assert (expired.approval["decision"], expired.approval["approval_id"]) == (
                "timeout",
                "a",
            )
        assert tool_calls.expire(2000.0) == [] and tool_calls.next_deadline() is None

    def test_final_calls_and_calls_without_a_deadline_never_expire(
        self, tool_calls: ToolCallStore
    ) -> None:
        tool_calls.insert(call("done", "completed", deadline_at=1.0))
        tool_calls.insert(call("open"))
        assert tool_calls.expire(1e12) == []
        assert tool_calls.next_deadline() is None
        assert status_of(tool_calls, "done") == "completed"

    def test_set_deadline_moves_clears_and_respects_expect(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1", "awaiting-approval", deadline_at=1000.0))
        assert tool_calls.set_deadline("c1", 50.0, expect=["pending"]) is None
        moved = tool_calls.set_deadline("c1", 3000.0)
        assert moved is not None and (moved.deadline_at, moved.status) == (
            3000.0,
            "awaiting-approval",
        )
        assert tool_calls.next_deadline() == 3000.0
        assert tool_calls.expire(2000.0) == []
        cleared = tool_calls.set_deadline("c1", None)
        assert cleared is not None and cleared.deadline_at is None
        assert tool_calls.expire(1e12) == [] and tool_calls.next_deadline() is None
        tool_calls.insert(call("f", "failed"))
        assert (
            tool_calls.set_deadline("f", 1.0) is None and tool_calls.set_deadline("x", 1.0) is None
        )
        with pytest.raises(InvalidInputError):
            tool_calls.set_deadline("c1", float("inf"))

    def test_next_deadline_is_the_earliest_lease_or_deadline(
        self, tool_calls: ToolCallStore
    ) -> None:
        tool_calls.insert(call("a", deadline_at=5000.0))
        claimed(tool_calls, "b", "w", 4000.0)
        tool_calls.set_deadline("b", 6000.0)
        tool_calls.insert(call("c", "completed", deadline_at=10.0))
        assert tool_calls.next_deadline() == 4000.0
        tool_calls.renew("b", "w", 7000.0)
        assert tool_calls.next_deadline() == 5000.0

    def test_a_lapsed_call_past_its_deadline_then_expires(self, tool_calls: ToolCallStore) -> None:
        claimed(tool_calls, "c1", "w", 1000.0)
        tool_calls.set_deadline("c1", 1500.0)
        assert [r.id for r in tool_calls.lapse(1200.0)] == ["c1"]
        assert [r.id for r in tool_calls.expire(1600.0)] == ["c1"]
        assert status_of(tool_calls, "c1") == "cancelled-by-timeout"

    def test_sweeps_roll_back_with_their_block(self, tool_calls: ToolCallStore) -> None:
        claimed(tool_calls, "c1", "w", 1000.0)
        tool_calls.insert(call("c2", deadline_at=1000.0))

        def sweep() -> None:
            tool_calls.lapse(2000.0)
            tool_calls.expire(2000.0)

        rolled_back(tool_calls, sweep)
        assert status_of(tool_calls, "c1") == "executing"
        assert status_of(tool_calls, "c2") == "pending"


class TestToolCallLateResults:
    @pytest.mark.parametrize("cancelled", CANCELLED)
    def test_a_cancelled_call_keeps_a_late_result_beside_it(
        self, tool_calls: ToolCallStore, cancelled: str
    ) -> None:
        tool_calls.insert(call("c1"))
        tool_calls.transition("c1", ["pending"], "executing", executor="w", claim=True)
        tool_calls.transition("c1", ["executing"], cancelled, error="stopped")
        late = tool_calls.store_late("c1", result={"late": True}, error=None)
        assert late is not None
        assert (late.status, late.result, late.error) == (cancelled, None, "stopped")
        assert late.late_result == {"late": True} and late.late_error is None
        assert late.late_at is not None and late.late_at > 0
        assert tool_calls.get("c1").to_dict() == late.to_dict()  # type: ignore[union-attr]
        # the executor's completion never lands on a cancelled call
        assert tool_calls.transition("c1", ["executing"], "completed", executor="w") is None
        assert status_of(tool_calls, "c1") == cancelled

    def test_a_late_error(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("c1", "cancelled-by-timeout"))
        late = tool_calls.store_late("c1", error="crashed after the timeout")
        assert late is not None and (late.late_result, late.late_error) == (
            None,
            "crashed after the timeout",
        )

    def test_only_a_cancelled_call_keeps_a_late_result(self, tool_calls: ToolCallStore) -> None:
        statuses = [s for s in TOOL_CALL_STATUSES if s not in CANCELLED]
        for status in statuses:
            before = tool_calls.insert(call(status, status))
            with pytest.raises(InvalidInputError):
                tool_calls.store_late(status, result="late")
            after = tool_calls.get(status)
            assert after is not None and after.to_dict() == before.to_dict()

    def test_an_unencodable_late_result_writes_nothing(self, tool_calls: ToolCallStore) -> None:
        before = tool_calls.insert(call("c1", "cancelled-by-user"))
        with pytest.raises(InvalidInputError):
            tool_calls.store_late("c1", result=object())
        assert tool_calls.get("c1").to_dict() == before.to_dict()  # type: ignore[union-attr]


class TestToolCallAudit:
    def test_audit_appends_in_order(self, tool_calls: ToolCallStore) -> None:
        a = tool_calls.audit("c1", "approved", by="alice", reason="looks fine")
        b = tool_calls.audit("c2", "denied", by="bob")
        c = tool_calls.audit("c1", "timeout", by=None, reason="no answer")
        assert a.seq < b.seq < c.seq
        assert (a.tool_call_id, a.decision, a.by, a.reason) == (
            "c1",
            "approved",
            "alice",
            "looks fine",
        )
        assert a.at > 0 and a.at <= b.at <= c.at
        assert tool_calls.audit_rows() == [a, b, c]
        assert tool_calls.audit_rows("c1") == [a, c]
        assert tool_calls.audit_rows("c2") == [b]
        assert tool_calls.audit_rows("nope") == []

    def test_audit_is_append_only(self, tool_calls: ToolCallStore) -> None:
        """Transitions, late results and more rows never change a row written before."""
        tool_calls.insert(call("c1"))
        first = tool_calls.audit("c1", "approved", by="alice")
        tool_calls.transition("c1", ["pending"], "awaiting-approval")
        tool_calls.transition(
            "c1", ["awaiting-approval"], "cancelled-by-user", approval={"decision": "cancelled"}
        )
        tool_calls.store_late("c1", result=1)
        tool_calls.audit("c1", "cancelled", by="bob")
        rows = tool_calls.audit_rows("c1")
        assert rows[0] == first and [r.decision for r in rows] == ["approved", "cancelled"]

    def test_bad_audit_writes_nothing(self, tool_calls: ToolCallStore) -> None:
        with pytest.raises(InvalidInputError):
            tool_calls.audit("c1", "approved", by=object())  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            tool_calls.audit("c1", "approved", by="a", reason=3)  # type: ignore[arg-type]
        assert tool_calls.audit_rows() == []


class TestToolCallRows:
    def test_oldest_first(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("late", created_at=300.0))
        tool_calls.insert(call("early", created_at=100.0))
        tool_calls.insert(call("b-tie", created_at=200.0))
        tool_calls.insert(call("a-tie", created_at=200.0))
        assert [r.id for r in tool_calls.rows()] == ["early", "a-tie", "b-tie", "late"]

    def test_an_update_does_not_reorder(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("a", created_at=1.0))
        tool_calls.insert(call("b", created_at=2.0))
        tool_calls.transition("a", ["pending"], "failed", error="x")
        assert [r.id for r in tool_calls.rows()] == ["a", "b"]

    def test_filters(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("p1", run_id="r1", tool_name="search", created_at=1.0))
        tool_calls.insert(call("e1", "executing", run_id="r1", tool_name="fetch", created_at=2.0))
        tool_calls.insert(call("d1", "completed", run_id="r1", tool_name="search", created_at=3.0))
        tool_calls.insert(call("p2", run_id="r2", tool_name="search", created_at=4.0))
        tool_calls.insert(call("x", tool_name="shell", created_at=5.0))

        def ids(**kw: object) -> list[str]:
            return [r.id for r in tool_calls.rows(**kw)]  # type: ignore[arg-type]

        assert ids() == ["p1", "e1", "d1", "p2", "x"]
        assert ids(status="pending") == ["p1", "p2", "x"]
        assert ids(status=["executing", "completed"]) == ["e1", "d1"]
        assert ids(status=[]) == []
        assert ids(run_id="r1") == ["p1", "e1", "d1"]
        assert ids(run_id="nope") == []
        assert ids(tool_names=["search"]) == ["p1", "d1", "p2"]
        assert ids(tool_names={"fetch", "shell"}) == ["e1", "x"]
        assert ids(tool_names=[]) == []
        assert ids(status="pending", run_id="r1") == ["p1"]
        assert ids(status=["pending", "completed"], run_id="r1", tool_names=["search"]) == [
            "p1",
            "d1",
        ]

    def test_an_unknown_status_filter_raises(self, tool_calls: ToolCallStore) -> None:
        with pytest.raises(InvalidInputError):
            tool_calls.rows("bogus")
        with pytest.raises(InvalidInputError):
            tool_calls.rows(["pending", "bogus"])


class TestToolCallTransactions:
    def test_rollback_leaves_nothing_written(self, tool_calls: ToolCallStore) -> None:
        tool_calls.insert(call("kept"))
        tool_calls.insert(call("gone", "cancelled-by-user"))
        before = {r.id: r.to_dict() for r in tool_calls.rows()}

        def writes() -> None:
            tool_calls.insert(call("lost"))
            tool_calls.transition("kept", ["pending"], "executing", executor="w", claim=True)
            tool_calls.store_late("gone", result="late")
            tool_calls.audit("kept", "approved", by="a")

        rolled_back(tool_calls, writes)
        assert {r.id: r.to_dict() for r in tool_calls.rows()} == before
        assert tool_calls.audit_rows() == []
        # the claim was undone: the call can be claimed again
        again = tool_calls.transition("kept", ["pending"], "executing", executor="w2", claim=True)
        assert again is not None and (again.executor, again.attempts) == ("w2", 1)

    def test_commit_and_nesting(self, tool_calls: ToolCallStore) -> None:
        with tool_calls.transaction():
            tool_calls.insert(call("a"))
            tool_calls.transition("a", ["pending"], "executing", executor="w", claim=True)
            tool_calls.audit("a", "approved", by="u")
        assert status_of(tool_calls, "a") == "executing"
        assert len(tool_calls.audit_rows()) == 1
        nested_rolled_back(
            tool_calls,
            lambda: tool_calls.insert(call("outer")),
            lambda: tool_calls.transition("a", ["executing"], "completed", result=1),
        )
        assert [r.id for r in tool_calls.rows()] == ["a"]
        assert status_of(tool_calls, "a") == "executing"
        inner_failure_caught(
            tool_calls,
            lambda: tool_calls.insert(call("in")),
            lambda: tool_calls.transition("a", ["executing"], "completed", result=1),
        )
        assert sorted(r.id for r in tool_calls.rows()) == ["a", "in"]
        assert status_of(tool_calls, "a") == "completed"

    def test_a_refused_move_inside_a_block_does_not_undo_it(
        self, tool_calls: ToolCallStore
    ) -> None:
        tool_calls.insert(call("a"))
        with tool_calls.transaction():
            tool_calls.insert(call("b"))
            with pytest.raises(InvalidInputError):
                tool_calls.transition("a", ["pending"], "completed")
            assert tool_calls.transition("a", ["executing"], "completed") is None
            tool_calls.transition("a", ["pending"], "denied")
        assert status_of(tool_calls, "a") == "denied"
        assert status_of(tool_calls, "b") == "pending"


class TestToolCallPersistence:
    def test_tool_calls_and_audit_survive_a_reopen(self, stores: Stores, reopen: Reopen) -> None:
        again_of = need_reopen(reopen)
        store = stores.tool_calls()
        store.insert(
            call(
                "a",
                run_id="r",
                input={"x": [1, 2]},
                durable=True,
                created_at=1.0,
                deadline_at=9000.0,
            )
        )
        store.insert(call("b", created_at=2.0))
        store.transition(
            "a", ["pending"], "executing", executor="w", claim=True, lease_until=8000.0
        )
        store.transition("b", ["pending"], "cancelled-by-user")
        store.store_late("b", result="late")
        store.audit("a", "approved", by="alice", reason="ok")
        before = [r.to_dict() for r in store.rows()]
        audit = store.audit_rows()
        again = again_of(stores).tool_calls()
        assert [r.to_dict() for r in again.rows()] == before
        assert again.audit_rows() == audit
        assert again.next_deadline() == 8000.0
        with pytest.raises(InvalidInputError):
            again.insert(call("a"))
        assert again.transition("a", ["pending"], "executing", executor="w2", claim=True) is None
        done = again.transition("a", ["executing"], "completed", executor="w", result=7)
        assert done is not None and done.attempts == 1
        assert again.audit("a", "approved", by="x").seq > audit[-1].seq
