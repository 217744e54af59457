"""The key/value store (bridge grants) and the sub-agent registry."""

from __future__ import annotations

import pytest
from thinkray.storage.db import Database
from thinkray.storage.kv import KeyValueStore
from thinkray.storage.registry import RegistryStore, SubAgentNotFoundError, SubAgentRecord
from thinkray.storage.types import InvalidInputError


def test_kv_set_replaces_get_default_prefix_items_and_persists(tmp_path):
    path = tmp_path / "kv.duckdb"
    db = Database(path)
    kv = KeyValueStore(db)
    assert kv.get("missing", 7) == 7
    kv.set("grant:a", {"agent": "a", "access": "read"})
    kv.set("grant:a", {"agent": "a", "access": "read-write"})
    kv.set("other", 1)
    assert kv.items("grant:") == {"grant:a": {"agent": "a", "access": "read-write"}}
    with pytest.raises(InvalidInputError):
        kv.set("bad", object())
    db.close()
    again = KeyValueStore(Database(path))
    assert again.get("grant:a")["access"] == "read-write"
    again.delete("grant:a")
    assert again.get("grant:a") is None


def test_registry_crud_and_clear_errors():
    registry = RegistryStore(Database())
    registry.add(SubAgentRecord(name="writer", id="1", config={"model": {"provider": "x"}}))
    with pytest.raises(InvalidInputError, match="already exists"):
        registry.add(SubAgentRecord(name="writer", id="2"))
    updated = registry.update("writer", status="busy", last_task="draft")
    assert (updated.status, updated.last_task) == ("busy", "draft")
    assert registry.get("writer").config == {"model": {"provider": "x"}}
    with pytest.raises(InvalidInputError, match="unknown registry field"):
        registry.update("writer", colour="red")
    registry.add(SubAgentRecord(name="reader", id="3"))
    assert [r.name for r in registry.list()] == ["reader", "writer"]
    registry.remove("writer")
    with pytest.raises(SubAgentNotFoundError):
        registry.get("writer")
    with pytest.raises(SubAgentNotFoundError):
        registry.remove("writer")
