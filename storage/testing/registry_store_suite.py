"""Conformance suite for :class:`thinkray.storage.protocols.RegistryStore`. Fixtures:
see :mod:`thinkray.storage.testing.store_helpers`; the suite's own ``registry`` fixture is
``stores.registry()``."""

from __future__ import annotations

import pytest
from thinkray.storage.errors import InvalidInputError, SubAgentNotFoundError
from thinkray.storage.protocols import RegistryStore, Stores, SubAgentRecord
from thinkray.storage.testing.store_helpers import (
    Reopen,
    inner_failure_caught,
    need_reopen,
    nested_rolled_back,
    rolled_back,
)

__all__ = [
    "TestRegistryCrud",
    "TestRegistryPersistence",
    "TestRegistryTransactions",
    "registry",
]


@pytest.fixture
def registry(stores: Stores) -> RegistryStore:
    return stores.registry()


def names(registry: RegistryStore) -> list[str]:
    return [r.name for r in registry.list()]


class TestRegistryCrud:
    def test_add_get_update(self, registry: RegistryStore) -> None:
        record = SubAgentRecord(name="writer", id="1", config={"model": {"provider": "x"}})
        assert registry.add(record) is record
        assert registry.has("writer") and not registry.has("reader")
        assert registry.get("writer") == record
        updated = registry.update("writer", status="busy", last_task="draft", message_count=2)
        assert (updated.status, updated.last_task, updated.message_count) == ("busy", "draft", 2)
        assert registry.get("writer") == updated
        assert registry.get("writer").config == {"model": {"provider": "x"}}

    def test_add_refuses_an_existing_name(self, registry: RegistryStore) -> None:
        registry.add(SubAgentRecord(name="writer", id="1"))
        with pytest.raises(InvalidInputError, match="already exists"):
            registry.add(SubAgentRecord(name="writer", id="2", access="read"))
        assert registry.get("writer").id == "1"
        assert names(registry) == ["writer"]

    def test_unknown_name_is_not_found(self, registry: RegistryStore) -> None:
        with pytest.raises(SubAgentNotFoundError):
            registry.get("ghost")
        with pytest.raises(SubAgentNotFoundError):
            registry.update("ghost", status="busy")
        with pytest.raises(SubAgentNotFoundError):
            registry.remove("ghost")
        assert issubclass(SubAgentNotFoundError, KeyError)
        assert registry.list() == []

    def test_bad_update_writes_nothing(self, registry: RegistryStore) -> None:
        registry.add(SubAgentRecord(name="writer", id="1"))
        with pytest.raises(InvalidInputError, match="unknown registry field"):
            registry.update("writer", status="busy", colour="red")
        with pytest.raises(InvalidInputError):
            registry.update("writer", last_task=object())
        stored = registry.get("writer")
        assert stored.status == "idle" and stored.last_task is None

    def test_unencodable_record_is_refused(self, registry: RegistryStore) -> None:
        with pytest.raises(InvalidInputError):
            registry.add(SubAgentRecord(name="odd", id="1", config={"x": object()}))
        assert not registry.has("odd")

    def test_list_is_by_name_and_remove(self, registry: RegistryStore) -> None:
        for name in ("writer", "critic", "reader"):
            registry.add(SubAgentRecord(name=name, id=name))
        assert names(registry) == ["critic", "reader", "writer"]
        registry.remove("reader")
        assert names(registry) == ["critic", "writer"]
        with pytest.raises(SubAgentNotFoundError):
            registry.get("reader")


class TestRegistryTransactions:
    def test_rollback_leaves_nothing_written(self, registry: RegistryStore) -> None:
        registry.add(SubAgentRecord(name="kept", id="1"))

        def writes() -> None:
            registry.add(SubAgentRecord(name="lost", id="2"))
            registry.update("kept", status="error", last_error="lost")
            registry.remove("kept")

        rolled_back(registry, writes)
        assert names(registry) == ["kept"]
        assert registry.get("kept").status == "idle"

    def test_commit_and_nesting(self, registry: RegistryStore) -> None:
        with registry.transaction():
            registry.add(SubAgentRecord(name="a", id="1"))
            registry.update("a", status="busy")
        assert registry.get("a").status == "busy"
        nested_rolled_back(
            registry,
            lambda: registry.update("a", status="error"),
            lambda: registry.add(SubAgentRecord(name="b", id="2")),
        )
        assert names(registry) == ["a"] and registry.get("a").status == "busy"
        inner_failure_caught(
            registry,
            lambda: registry.add(SubAgentRecord(name="b", id="2")),
            lambda: registry.remove("a"),
        )
        assert names(registry) == ["b"]


class TestRegistryPersistence:
    def test_records_survive_a_reopen(self, stores: Stores, reopen: Reopen) -> None:
        again_of = need_reopen(reopen)
        registry = stores.registry()
        registry.add(SubAgentRecord(name="writer", id="1", config={"k": [1, "two"]}))
        registry.update("writer", status="busy", last_active=12.5)
        before = registry.list()
        again = again_of(stores).registry()
        assert again.list() == before
        with pytest.raises(InvalidInputError):
            again.add(SubAgentRecord(name="writer", id="2"))
