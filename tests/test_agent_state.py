"""An agent's synced state without Ray (issue 25, part 3): the class declares a pydantic
``state_model``; ``set_state`` validates, stores in the agent's own database and tells
the subscribers; clients go through ``set_client_state`` (``client_can_set_state`` and
the ``validate_state_change`` hook); nothing invalid is ever stored; the state survives
a reopen of the file (the wake path)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from pydantic import BaseModel
from thinkray.runtime.agents.state import StateChange
from thinkray.runtime.agents.think import Think
from thinkray.runtime.errors import (
    AccessDeniedError,
    InvalidAgentStateError,
    NoAgentStateError,
    StateChangeRefusedError,
)
from thinkray.storage.errors import UserError

from tests.agents import Board, ServerStateAgent, StateAgent


def make(cls: type[Think], path: Any) -> Any:
    return cls(str(path))


def test_the_initial_state_until_one_is_set(tmp_path):
    agent = make(StateAgent, tmp_path / "a.duckdb")
    assert agent.state == Board(title="new board")
    assert agent.get_state() == Board(title="new board")
    assert agent.state_snapshot() == {
        "state": {"count": 0, "title": "new board", "items": []},
        "version": 0,
        "origin": None,
        "exact": False,
    }
    agent.close()


def test_set_state_validates_stores_and_survives_a_reopen(tmp_path):
    path = tmp_path / "a.duckdb"
    agent = make(StateAgent, path)
    assert agent.set_state({"count": "3", "items": ["x"]}) == Board(count=3, items=["x"])
    assert agent.set_state(Board(count=4, title="t")).count == 4
    assert agent.state_snapshot()["version"] == 2
    agent.close()
    again = make(StateAgent, path)  # what a wake does: a new agent on the file
    assert again.state == Board(count=4, title="t")
    assert again.state_snapshot()["version"] == 2
    again.close()


def test_the_state_property_is_a_copy(tmp_path):
    agent = make(StateAgent, tmp_path / "a.duckdb")
    board = agent.state
    board.count = 99  # changing the copy changes nothing until it is set
    assert agent.state.count == 0
    agent.close()


def test_invalid_state_is_refused_and_nothing_is_stored(tmp_path):
    agent = make(StateAgent, tmp_path / "a.duckdb")
    agent.set_state({"count": 1})
    heard: list[StateChange] = []
    agent.synced_state.subscribe(heard.append)
    for bad in ({"count": "many"}, {"items": "not a list"}, ["a", "list"], 7):
        with pytest.raises(InvalidAgentStateError) as info:
            agent.set_state(bad)
        assert "does not fit Board" in str(info.value)
    mutated = agent.state
    mutated.count = "x"  # type: ignore[assignment]  # assignment is not validated by pydantic
    with pytest.raises(InvalidAgentStateError):
        agent.set_state(mutated)
    with pytest.raises(StateChangeRefusedError, match="below zero"):
        agent.set_state({"count": -1})  # the hook refuses the server too
    assert heard == []
    assert agent.state_snapshot()["version"] == 1 and agent.state.count == 1
    agent.close()


def test_state_over_the_size_limit_is_refused(tmp_path):
    class Small(StateAgent):
        max_state_bytes = 100

    agent = make(Small, tmp_path / "a.duckdb")
    with pytest.raises(InvalidAgentStateError, match="over the 100-byte limit"):
        agent.set_state({"items": ["x" * 200]})
    assert agent.state_snapshot()["version"] == 0
    agent.close()


def test_clients_set_state_only_where_the_class_allows(tmp_path):
    agent = make(ServerStateAgent, tmp_path / "a.duckdb")
    with pytest.raises(StateChangeRefusedError, match="client_can_set_state"):
        agent.set_client_state({"count": 5}, origin="conn-1")
    assert agent.state_snapshot()["version"] == 0
    agent.set_state({"count": 5})  # the agent itself may
    assert agent.state.count == 5
    agent.close()


def test_a_client_change_names_its_origin_and_whether_it_was_stored_as_sent(tmp_path):
    agent = make(StateAgent, tmp_path / "a.duckdb")
    heard: list[StateChange] = []
    agent.synced_state.subscribe(heard.append)
    sent = {"count": 2, "title": "", "items": []}
    change = agent.set_client_state(sent, origin="conn-1")
    assert change == {"state": sent, "version": 1, "origin": "conn-1", "exact": True}
    # Coerced or completed by the model: the sender must hear the stored state back.
    coerced = agent.set_client_state({"count": "3"}, origin="conn-1")
    assert coerced["exact"] is False and coerced["state"]["count"] == 3
    http = agent.set_client_state({"count": 4})  # no connection: nobody to leave out
    assert http["origin"] is None and http["exact"] is False
    assert [c.version for c in heard] == [1, 2, 3]
    with pytest.raises(StateChangeRefusedError):
        agent.set_client_state({"count": -2}, origin="conn-1")
    assert agent.state.count == 4
    agent.close()


def test_on_state_update_runs_after_the_change_and_cannot_undo_it(tmp_path):
    seen: list[tuple[int, str]] = []

    class Hooked(StateAgent):
        def on_state_update(self, state: Any, source: Any) -> None:
            seen.append((state.count, source))
            raise RuntimeError("a broken hook")

    agent = make(Hooked, tmp_path / "a.duckdb")
    agent.set_state({"count": 1})
    agent.set_client_state({"count": 2}, origin="c")
    assert seen == [(1, "server"), (2, "client")]
    assert agent.state.count == 2
    agent.close()


def test_an_agent_without_state(tmp_path):
    agent = make(Think, tmp_path / "a.duckdb")
    assert agent.state is None
    for call in (agent.get_state, agent.state_snapshot, lambda: agent.set_state({"a": 1})):
        with pytest.raises(NoAgentStateError, match="declares no state_model"):
            call()
    with pytest.raises(NoAgentStateError):
        agent.set_client_state({"a": 1}, origin="c")
    agent.close()


def test_a_stored_state_that_no_longer_fits_the_class(tmp_path):
    class Strict(BaseModel):
        count: int
        owner: str  # a field the stored state never had

    class Changed(StateAgent):
        state_model = Strict
        initial_state = {"count": 0, "owner": "nobody"}

    path = tmp_path / "a.duckdb"
    agent = make(StateAgent, path)
    agent.set_state({"count": 1})
    agent.close()
    changed = make(Changed, path)  # still wakes
    with pytest.raises(InvalidAgentStateError, match="owner"):
        changed.get_state()
    changed.set_state({"count": 2, "owner": "me"})  # a valid state replaces it
    assert changed.state_snapshot()["version"] == 2
    changed.close()


def test_the_errors_survive_pickling_and_are_user_errors():
    for exc in (
        InvalidAgentStateError("bad"),
        StateChangeRefusedError("no"),
        NoAgentStateError("none"),
    ):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and str(again) == str(exc)
        assert isinstance(again, UserError)
    assert isinstance(StateChangeRefusedError("no"), AccessDeniedError)
