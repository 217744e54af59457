"""Conformance suite for :class:`thinkray.storage.protocols.AgentStateStore`. Fixtures:
see :mod:`thinkray.storage.testing.store_helpers`; the suite's own ``agent_state``
fixture is ``stores.agent_state()``."""

from __future__ import annotations

import pytest
from thinkray.storage.errors import InvalidInputError
from thinkray.storage.protocols import AgentStateStore, Stores
from thinkray.storage.testing.store_helpers import Reopen, need_reopen, rolled_back

__all__ = ["TestAgentState", "TestAgentStatePersistence", "agent_state"]


@pytest.fixture
def agent_state(stores: Stores) -> AgentStateStore:
    return stores.agent_state()


class TestAgentState:
    def test_nothing_until_the_first_put(self, agent_state: AgentStateStore) -> None:
        assert isinstance(agent_state, AgentStateStore)
        assert agent_state.get() is None

    def test_each_put_replaces_the_value_and_bumps_the_version(
        self, agent_state: AgentStateStore
    ) -> None:
        first = agent_state.put({"count": 1, "tags": ("a", "b")}, now=10.0)
        assert (first.value, first.version, first.updated_at) == (
            {"count": 1, "tags": ["a", "b"]},
            1,
            10.0,
        )
        second = agent_state.put({"title": "héllo"}, now=11.0)
        assert second.version == 2
        assert agent_state.get() == second
        assert agent_state.get().value == {"title": "héllo"}  # type: ignore[union-attr]

    def test_a_value_that_is_not_json_writes_nothing(self, agent_state: AgentStateStore) -> None:
        agent_state.put({"count": 1})
        for bad in ({"x": object()}, {"x": float("nan")}, {(1, 2): "tuple key"}, b"bytes"):
            with pytest.raises(InvalidInputError):
                agent_state.put(bad)
        record = agent_state.get()
        assert record is not None and (record.value, record.version) == ({"count": 1}, 1)

    def test_a_rolled_back_put_leaves_the_version(self, agent_state: AgentStateStore) -> None:
        agent_state.put({"count": 1})
        rolled_back(agent_state, lambda: agent_state.put({"count": 2}))
        record = agent_state.get()
        assert record is not None and (record.value, record.version) == ({"count": 1}, 1)
        assert agent_state.put({"count": 3}).version == 2


class TestAgentStatePersistence:
    def test_the_state_survives_a_reopen(self, stores: Stores, reopen: Reopen) -> None:
        again_of = need_reopen(reopen)
        stores.agent_state().put({"count": 1})
        stores.agent_state().put({"count": 2})
        record = again_of(stores).agent_state().get()
        assert record is not None and (record.value, record.version) == ({"count": 2}, 2)
