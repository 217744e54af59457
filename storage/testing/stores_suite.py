"""Conformance suite for :class:`thinkray.storage.protocols.Stores`: one object per
kind, one transaction scope across every store of the database, and the lifetime.
Fixtures: see :mod:`thinkray.storage.testing.store_helpers`."""

from __future__ import annotations

import pytest
from thinkray.storage.errors import DatabaseClosedError, InvalidInputError
from thinkray.storage.protocols import (
    FiberStore,
    InboxStore,
    JobRecord,
    JobStore,
    KeyValueStore,
    RegistryStore,
    Stores,
    SubAgentRecord,
    ToolCallRecord,
    ToolCallStore,
    WorkspaceStore,
)
from thinkray.storage.testing.store_helpers import Boom, Reopen, need_reopen

__all__ = ["TestStoresLifetime", "TestStoresObjects", "TestStoresTransactions"]


def write_everywhere(stores: Stores, tag: str) -> None:
    """One write to each kind of store."""
    stores.fibers().insert_fiber("m", fiber_id=f"fiber-{tag}")
    stores.fibers().insert_schedule("m", kind="once", next_run_at=1.0, schedule_id=f"s-{tag}")
    stores.jobs().insert(JobRecord(id=f"job-{tag}", status="running"))
    stores.tool_calls().insert(ToolCallRecord(id=f"call-{tag}", tool_name="t"))
    stores.inbox().insert("hi", message_id=f"inbox-{tag}")
    stores.registry().add(SubAgentRecord(name=f"agent-{tag}", id=tag))
    stores.kv().set(f"kv-{tag}", tag)
    stores.workspace().write(f"{tag}.txt", tag)


def written(stores: Stores, tag: str) -> dict[str, bool]:
    """Which kinds of store hold ``tag``'s write."""
    return {
        "fiber": stores.fibers().get_fiber(f"fiber-{tag}") is not None,
        "schedule": stores.fibers().get_schedule(f"s-{tag}") is not None,
        "job": stores.jobs().get(f"job-{tag}") is not None,
        "tool_call": stores.tool_calls().get(f"call-{tag}") is not None,
        "inbox": stores.inbox().get(f"inbox-{tag}") is not None,
        "registry": stores.registry().has(f"agent-{tag}"),
        "kv": stores.kv().get(f"kv-{tag}") == tag,
        "workspace": stores.workspace().exists(f"{tag}.txt"),
    }


ALL = dict.fromkeys(
    ["fiber", "schedule", "job", "tool_call", "inbox", "registry", "kv", "workspace"], True
)
NONE = dict.fromkeys(ALL, False)


class TestStoresObjects:
    def test_each_kind_implements_its_protocol(self, stores: Stores) -> None:
        assert isinstance(stores, Stores)
        assert isinstance(stores.fibers(), FiberStore)
        assert isinstance(stores.jobs(), JobStore)
        assert isinstance(stores.tool_calls(), ToolCallStore)
        assert isinstance(stores.inbox(), InboxStore)
        assert isinstance(stores.registry(), RegistryStore)
        assert isinstance(stores.kv(), KeyValueStore)
        assert isinstance(stores.workspace(), WorkspaceStore)

    def test_one_object_per_kind(self, stores: Stores) -> None:
        assert stores.fibers() is stores.fibers()
        assert stores.jobs() is stores.jobs()
        assert stores.tool_calls() is stores.tool_calls()
        assert stores.inbox() is stores.inbox()
        assert stores.registry() is stores.registry()
        assert stores.kv() is stores.kv()
        assert stores.workspace() is stores.workspace()
        assert stores.workspace("x", max_entries=5) is stores.workspace("x", max_entries=5)
        assert stores.workspace("x") is not stores.workspace("y")
        assert stores.workspace("x", max_entries=5) is not stores.workspace("x", max_entries=6)

    def test_a_fresh_database_is_empty(self, stores: Stores) -> None:
        assert stores.fibers().list_fibers() == []
        assert stores.fibers().list_schedules(include_disabled=True) == []
        assert stores.jobs().rows() == []
        assert stores.tool_calls().rows() == []
        assert stores.tool_calls().audit_rows() == []
        assert stores.inbox().count() == 0
        assert stores.registry().list() == []
        assert stores.kv().items() == {}
        assert stores.workspace().usage() == {"entries": 0, "bytes": 0}


class TestStoresTransactions:
    def test_writes_to_every_store_commit_together(self, stores: Stores) -> None:
        with stores.transaction():
            write_everywhere(stores, "a")
        assert written(stores, "a") == ALL

    def test_writes_to_every_store_roll_back_together(self, stores: Stores) -> None:
        """Each store is first used inside the block (tables are made on first use):
        after the rollback they are all still usable."""
        with pytest.raises(Boom), stores.transaction():
            write_everywhere(stores, "a")
            raise Boom
        assert written(stores, "a") == NONE

    def test_any_stores_transaction_is_the_same_scope(self, stores: Stores) -> None:
        """A store's own ``transaction()`` covers writes to the other stores, and
        blocks of different stores nest into one."""
        with pytest.raises(Boom), stores.kv().transaction():
            write_everywhere(stores, "a")
            raise Boom
        assert written(stores, "a") == NONE
        with pytest.raises(Boom), stores.workspace().transaction():
            stores.kv().set("outer", 1)
            with stores.fibers().transaction():
                stores.registry().add(SubAgentRecord(name="inner", id="1"))
            raise Boom
        assert stores.kv().get("outer") is None and not stores.registry().has("inner")
        with stores.jobs().transaction():
            write_everywhere(stores, "b")
        assert written(stores, "b") == ALL

    def test_a_failed_call_inside_a_block_does_not_undo_the_block(self, stores: Stores) -> None:
        """A store call that refuses its input writes nothing, and the block it ran in
        still commits what else it wrote when it exits normally."""
        stores.kv().set("k", 0)
        with stores.transaction():
            stores.kv().set("k", 1)
            with pytest.raises(InvalidInputError):
                stores.kv().set("bad", object())
            stores.registry().add(SubAgentRecord(name="a", id="1"))
        assert stores.kv().items() == {"k": 1}
        assert stores.registry().has("a")


class TestStoresLifetime:
    def test_everything_survives_a_reopen(self, stores: Stores, reopen: Reopen) -> None:
        again_of = need_reopen(reopen)
        write_everywhere(stores, "a")
        again = again_of(stores)
        assert written(again, "a") == ALL

    def test_stores_of_a_closed_database_raise(self, stores: Stores, reopen: Reopen) -> None:
        again_of = need_reopen(reopen)
        kv, fibers, workspace = stores.kv(), stores.fibers(), stores.workspace()
        kv.set("k", 1)
        again_of(stores)  # closes the database these stores were on
        with pytest.raises(DatabaseClosedError):
            kv.get("k")
        with pytest.raises(DatabaseClosedError):
            fibers.list_fibers()
        with pytest.raises(DatabaseClosedError):
            workspace.write("a.txt", "x")
        with pytest.raises(DatabaseClosedError), kv.transaction():
            pass

    def test_close_is_idempotent(self, stores: Stores) -> None:
        stores.close()
        stores.close()
