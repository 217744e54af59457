"""An agent's synced state through Ray (issue 25, part 3): the handle's ``get_state`` /
``set_state`` (typed: the model instance crosses the boundary), the state surviving a
hibernation (set, hibernate, wake, read), and the session actor's ``state_events``
stream, which carries every change to the ingress: the agent's own, a handle's, a
client's, until the agent hibernates."""

from __future__ import annotations

import pytest
import ray
from thinkray.runtime.errors import InvalidAgentStateError, StateChangeRefusedError

from tests.agents import Board, StateAgent

pytestmark = pytest.mark.ray


def test_state_survives_hibernation(namespace_factory):
    ns = namespace_factory(StateAgent)
    agent = ns.get("keeper")
    assert agent.get_state.remote().result() == Board(title="new board")
    stored = agent.set_state.remote(Board(count=7, items=["a"])).result()
    assert stored == Board(count=7, items=["a"])
    assert ns.hibernate("keeper")
    assert ns.where("keeper") is None
    # The next call wakes the agent from its file.
    assert agent.get_state.remote().result() == Board(count=7, items=["a"])
    assert agent.state_snapshot.remote().result()["version"] == 1
    assert ns.where("keeper") is not None


def test_invalid_state_through_the_handle_stores_nothing(namespace_factory):
    ns = namespace_factory(StateAgent)
    agent = ns.get("strict")
    agent.set_state.remote({"count": 1}).result()
    with pytest.raises(InvalidAgentStateError, match="does not fit Board"):
        agent.set_state.remote({"count": "lots"}).result()
    with pytest.raises(StateChangeRefusedError):
        agent.set_client_state.remote({"count": -1}, origin="c").result()
    assert agent.state_snapshot.remote().result()["version"] == 1


# Under both placements in every run: the ingress's state feed calls ``state_events``
# on whichever actor hosts the agent (an agent host lacked it once, and the feed, which
# only logs a failed watch, went silent).
@pytest.mark.parametrize("placement", ["dedicated", "hosts"])
def test_state_events_carry_every_change_until_the_agent_hibernates(namespace_factory, placement):
    ns = namespace_factory(StateAgent, placement=placement)
    agent = ns.get("feed")
    agent.set_state.remote({"count": 1}).result()
    actor = agent._actor_sync()
    events = actor.state_events.options(num_returns="streaming").remote("feed")
    first = ray.get(next(events))
    assert (first["state"]["count"], first["version"]) == (1, 1)  # the state now, first

    assert agent.bump.remote(2).result() == 3  # a change made inside the agent
    change = ray.get(next(events))
    assert change == {
        "state": {"count": 3, "title": "", "items": []},
        "version": 2,
        "origin": None,
        "exact": False,
    }
    agent.set_client_state.remote({"count": 4}, origin="conn-9").result()
    change = ray.get(next(events))
    assert (change["version"], change["origin"], change["exact"]) == (3, "conn-9", False)

    assert ns.hibernate("feed")
    with pytest.raises(StopIteration):  # the watch ends with the binding
        ray.get(next(events))
    # Nothing is kept awake by it, and the state is there after the wake.
    assert agent.get_state.remote().result().count == 4
