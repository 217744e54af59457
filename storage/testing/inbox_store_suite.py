"""Conformance suite for :class:`thinkray.storage.protocols.InboxStore`. Fixtures: see
:mod:`thinkray.storage.testing.store_helpers`; the suite's own ``inbox`` fixture is
``stores.inbox()``."""

from __future__ import annotations

from typing import Any

import pytest
from thinkray.storage.errors import InboxMessageNotFoundError, InvalidInputError
from thinkray.storage.protocols import InboxStore, Stores
from thinkray.storage.testing.store_helpers import (
    Reopen,
    inner_failure_caught,
    need_reopen,
    nested_rolled_back,
    rolled_back,
)

__all__ = [
    "TestInboxClaimAndFinish",
    "TestInboxInsert",
    "TestInboxOrderAndReads",
    "TestInboxPersistence",
    "TestInboxTransactions",
    "inbox",
]


@pytest.fixture
def inbox(stores: Stores) -> InboxStore:
    return stores.inbox()


def ids(rows: list[Any]) -> list[str]:
    return [r.id for r in rows]


class TestInboxInsert:
    def test_insert_returns_what_get_reads(self, inbox: InboxStore) -> None:
        parts = [{"type": "text", "text": "hello"}]
        row, created = inbox.insert(parts, sender="ada", message_id="m1", metadata={"k": 1})
        assert created is True
        assert (row.id, row.sender, row.status, row.attempts) == ("m1", "ada", "pending", 0)
        assert row.content == parts and row.metadata == {"k": 1}
        assert row.reply is None and row.error is None and not row.finished
        stored = inbox.get("m1")
        assert stored is not None and stored.to_dict() == row.to_dict()

    def test_fresh_ids_are_unique(self, inbox: InboxStore) -> None:
        made = {inbox.insert("x")[0].id for _ in range(5)}
        assert len(made) == 5 and all(isinstance(i, str) and i for i in made)

    def test_insert_is_idempotent_on_the_id(self, inbox: InboxStore) -> None:
        first, _ = inbox.insert("first", sender="a", message_id="m1")
        again, created = inbox.insert("second", sender="b", message_id="m1", metadata={"x": 1})
        assert created is False
        assert again.to_dict() == first.to_dict()
        assert inbox.get("m1").content == "first"  # type: ignore[union-attr]
        assert inbox.count() == 1

    def test_insert_of_a_finished_id_changes_nothing(self, inbox: InboxStore) -> None:
        inbox.insert("q", message_id="m1")
        inbox.claim(["m1"])
        inbox.complete(["m1"], "answer")
        row, created = inbox.insert("q", message_id="m1")
        assert created is False and row.status == "done" and row.reply == "answer"

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"message_id": ""},
            {"message_id": 5},
            {"message_id": "x" * 257},
            {"sender": 5},
            {"metadata": "not a dict"},
            {"content": object()},
        ],
    )
    def test_bad_input_writes_nothing(self, inbox: InboxStore, kwargs: dict[str, Any]) -> None:
        kwargs = dict(kwargs)  # the parameter is shared by every backend
        content = kwargs.pop("content", "hi")
        with pytest.raises(InvalidInputError):
            inbox.insert(content, **kwargs)
        assert inbox.count() == 0

    def test_longest_id_is_accepted(self, inbox: InboxStore) -> None:
        assert inbox.insert("hi", message_id="x" * 256)[1] is True


class TestInboxClaimAndFinish:
    def test_claim_moves_pending_rows_once(self, inbox: InboxStore) -> None:
        for mid in ("a", "b", "c"):
            inbox.insert(mid, message_id=mid)
        claimed = inbox.claim(["c", "a", "unknown", "a"])
        assert ids(claimed) == ["a", "c"]  # oldest first, whatever order was asked
        assert all(r.status == "processing" and r.attempts == 1 for r in claimed)
        assert inbox.get("a").to_dict() == claimed[0].to_dict()  # type: ignore[union-attr]
        assert inbox.claim(["a", "c"]) == []  # claimed twice, processed once
        assert ids(inbox.pending()) == ["b"]
        assert inbox.claim([]) == []

    def test_complete_and_fail_leave_finished_rows_alone(self, inbox: InboxStore) -> None:
        for mid in ("a", "b", "c"):
            inbox.insert(mid, message_id=mid)
        inbox.claim(["a", "b"])
        done = inbox.complete(["a"], "the answer", extra={"run_id": "r1"})
        assert ids(done) == ["a"]
        row = inbox.get("a")
        assert row is not None and (row.status, row.reply, row.error) == (
            "done",
            "the answer",
            None,
        )
        assert row.extra == {"run_id": "r1"} and row.finished
        failed = inbox.fail(["b", "a"], "boom")
        assert ids(failed) == ["b"]
        row = inbox.get("b")
        assert row is not None and (row.status, row.error, row.reply) == ("failed", "boom", None)
        assert inbox.complete(["a", "b"], "late") == []
        assert inbox.get("a").reply == "the answer"  # type: ignore[union-attr]
        assert inbox.get("b").status == "failed"  # type: ignore[union-attr]
        assert ids(inbox.complete(["c", "unknown"], "early")) == ["c"]  # pending may finish

    def test_requeue_processing(self, inbox: InboxStore) -> None:
        for mid in ("once", "thrice", "waiting"):
            inbox.insert(mid, message_id=mid)
        inbox.claim(["once", "thrice"])
        assert inbox.requeue_processing() == (2, 0)
        inbox.claim(["thrice"])
        inbox.requeue_processing()
        inbox.claim(["once", "thrice"])
        assert inbox.requeue_processing(max_attempts=3) == (1, 1)
        once, thrice = inbox.get("once"), inbox.get("thrice")
        assert once is not None and (once.status, once.attempts) == ("pending", 2)
        assert thrice is not None and (thrice.status, thrice.attempts) == ("failed", 3)
        assert thrice.error and "3 attempts" in thrice.error
        assert inbox.get("waiting").status == "pending"  # type: ignore[union-attr]
        assert inbox.requeue_processing() == (0, 0)

    def test_delete_and_purge(self, inbox: InboxStore) -> None:
        for mid in ("done", "failed", "pending", "processing"):
            inbox.insert(mid, message_id=mid)
        inbox.claim(["done", "failed", "processing"])
        inbox.complete(["done"], "ok")
        inbox.fail(["failed"], "no")
        assert inbox.purge(older_than=0.0) == 0  # finished after the epoch began
        assert inbox.purge() == 2
        assert ids(inbox.rows()) == ["pending", "processing"]
        assert inbox.delete(["pending", "unknown"]) == 1
        assert inbox.delete([]) == 0
        assert ids(inbox.rows()) == ["processing"]


class TestInboxOrderAndReads:
    def test_rows_are_in_insertion_order(self, inbox: InboxStore) -> None:
        for mid in ("z", "b", "m", "a"):
            inbox.insert(mid, message_id=mid)
        assert ids(inbox.rows()) == ["z", "b", "m", "a"]
        assert ids(inbox.pending()) == ["z", "b", "m", "a"]
        assert ids(inbox.pending(limit=2)) == ["z", "b"]
        inbox.claim(["b"])
        assert ids(inbox.rows("pending")) == ["z", "m", "a"]
        assert ids(inbox.rows(["processing", "pending"])) == ["z", "b", "m", "a"]

    @pytest.mark.parametrize("limit", [0, -1, True, "2"])
    def test_bad_limit(self, inbox: InboxStore, limit: Any) -> None:
        with pytest.raises(InvalidInputError):
            inbox.pending(limit=limit)

    def test_unknown_status_is_refused(self, inbox: InboxStore) -> None:
        with pytest.raises(InvalidInputError):
            inbox.rows("bogus")
        with pytest.raises(InvalidInputError):
            inbox.count("bogus")

    def test_not_found(self, inbox: InboxStore) -> None:
        assert inbox.get("nope") is None
        with pytest.raises(InboxMessageNotFoundError):
            inbox.require("nope")
        assert issubclass(InboxMessageNotFoundError, KeyError)
        inbox.insert("hi", message_id="m1")
        assert inbox.require("m1").content == "hi"

    def test_counts(self, inbox: InboxStore) -> None:
        assert inbox.count() == 0 and not inbox.has_pending()
        inbox.insert("a", message_id="a")
        inbox.insert("b", message_id="b")
        assert inbox.has_pending()
        inbox.claim(["a", "b"])
        assert not inbox.has_pending()
        assert (inbox.count(), inbox.count("processing"), inbox.count("pending")) == (2, 2, 0)


class TestInboxTransactions:
    def test_rollback_leaves_nothing_written(self, inbox: InboxStore) -> None:
        inbox.insert("kept", message_id="kept")

        def writes() -> None:
            inbox.insert("lost", message_id="lost")
            inbox.claim(["kept"])
            inbox.complete(["kept"], "lost reply")

        rolled_back(inbox, writes)
        assert ids(inbox.rows()) == ["kept"]
        row = inbox.get("kept")
        assert row is not None and (row.status, row.attempts, row.reply) == ("pending", 0, None)
        # After a rollback the id is free, and the order still holds.
        inbox.insert("again", message_id="lost")
        assert ids(inbox.rows()) == ["kept", "lost"]

    def test_commit_and_nesting(self, inbox: InboxStore) -> None:
        with inbox.transaction():
            inbox.insert("a", message_id="a")
            assert ids(inbox.claim(["a"])) == ["a"]
        assert inbox.get("a").status == "processing"  # type: ignore[union-attr]
        nested_rolled_back(
            inbox,
            lambda: inbox.insert("o", message_id="outer"),
            lambda: inbox.complete(["a"], "inner"),
        )
        assert ids(inbox.rows()) == ["a"] and inbox.get("a").status == "processing"  # type: ignore[union-attr]
        inner_failure_caught(
            inbox,
            lambda: inbox.complete(["a"], "kept"),
            lambda: inbox.insert("b", message_id="b"),
        )
        assert inbox.get("a").reply == "kept"  # type: ignore[union-attr]
        assert ids(inbox.rows()) == ["a", "b"]


class TestInboxPersistence:
    def test_rows_and_order_survive_a_reopen(self, stores: Stores, reopen: Reopen) -> None:
        again_of = need_reopen(reopen)
        inbox = stores.inbox()
        inbox.insert([{"type": "text", "text": "one"}], sender="s", message_id="a")
        inbox.insert("two", message_id="b", metadata={"m": [1]})
        inbox.claim(["a"])
        inbox.complete(["a"], "reply", extra={"x": 1})
        before = [r.to_dict() for r in inbox.rows()]

        again = again_of(stores).inbox()
        assert [r.to_dict() for r in again.rows()] == before
        assert again.insert("dupe", message_id="a")[1] is False
        again.insert("three", message_id="c")
        assert ids(again.rows()) == ["a", "b", "c"]  # later than anything before the reopen
