"""Conformance suite for :class:`thinkray.storage.protocols.KeyValueStore`. Fixtures:
see :mod:`thinkray.storage.testing.store_helpers`; the suite's own ``kv`` fixture is
``stores.kv()``."""

from __future__ import annotations

import pytest
from thinkray.storage.errors import InvalidInputError
from thinkray.storage.protocols import KeyValueStore, Stores
from thinkray.storage.testing.store_helpers import (
    Reopen,
    inner_failure_caught,
    need_reopen,
    nested_rolled_back,
    rolled_back,
)

__all__ = ["TestKeyValue", "TestKeyValuePersistence", "TestKeyValueTransactions", "kv"]


@pytest.fixture
def kv(stores: Stores) -> KeyValueStore:
    return stores.kv()


class TestKeyValue:
    def test_missing_keys_give_the_default(self, kv: KeyValueStore) -> None:
        assert kv.get("missing") is None
        assert kv.get("missing", 7) == 7
        kv.set("none", None)
        assert kv.get("none", 7) is None  # a stored None is a value

    def test_set_replaces(self, kv: KeyValueStore) -> None:
        kv.set("grant:a", {"agent": "a", "access": "read"})
        kv.set("grant:a", {"agent": "a", "access": "read-write"})
        assert kv.get("grant:a") == {"agent": "a", "access": "read-write"}
        assert kv.items() == {"grant:a": {"agent": "a", "access": "read-write"}}

    def test_values_round_trip_as_msgpack_returns_them(self, kv: KeyValueStore) -> None:
        value = {"s": "héllo", "n": [1, 2.5, None, True], "b": b"\x00\xff", "t": (1, 2)}
        kv.set("v", value)
        assert kv.get("v") == {**value, "t": [1, 2]}

    def test_unencodable_value_writes_nothing(self, kv: KeyValueStore) -> None:
        kv.set("k", 1)
        with pytest.raises(InvalidInputError):
            kv.set("k", object())
        with pytest.raises(InvalidInputError):
            kv.set("new", {"x": object()})
        assert kv.items() == {"k": 1}

    def test_delete(self, kv: KeyValueStore) -> None:
        kv.set("k", 1)
        kv.delete("k")
        kv.delete("k")  # missing: nothing happens
        assert kv.get("k") is None and kv.items() == {}

    def test_items_by_prefix_ordered_by_key(self, kv: KeyValueStore) -> None:
        for key in ("grant:z", "other", "grant:a", "grant:m", "gran"):
            kv.set(key, key.upper())
        assert list(kv.items("grant:")) == ["grant:a", "grant:m", "grant:z"]
        assert kv.items("grant:")["grant:m"] == "GRANT:M"
        assert list(kv.items()) == ["gran", "grant:a", "grant:m", "grant:z", "other"]
        assert kv.items("nothing") == {}


class TestKeyValueTransactions:
    def test_rollback_leaves_nothing_written(self, kv: KeyValueStore) -> None:
        kv.set("kept", 1)

        def writes() -> None:
            kv.set("lost", 2)
            kv.set("kept", "changed")
            kv.delete("kept")

        rolled_back(kv, writes)
        assert kv.items() == {"kept": 1}

    def test_commit_and_nesting(self, kv: KeyValueStore) -> None:
        with kv.transaction():
            kv.set("a", 1)
            assert kv.get("a") == 1
        nested_rolled_back(kv, lambda: kv.set("outer", 1), lambda: kv.set("a", "inner"))
        assert kv.items() == {"a": 1}
        inner_failure_caught(kv, lambda: kv.set("a", 2), lambda: kv.set("b", 3))
        assert kv.items() == {"a": 2, "b": 3}


class TestKeyValuePersistence:
    def test_values_survive_a_reopen(self, stores: Stores, reopen: Reopen) -> None:
        again_of = need_reopen(reopen)
        kv = stores.kv()
        kv.set("grant:a", {"agent": "a", "access": "read-write"})
        kv.set("gone", 1)
        kv.delete("gone")
        again = again_of(stores).kv()
        assert again.items() == {"grant:a": {"agent": "a", "access": "read-write"}}
