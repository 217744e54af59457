"""The ingress's state feed (``actors/ingress/state.py``) when a watch fails: an agent
that went away ends it quietly (the feed looks again); any other failure is logged as a
warning, since its clients would only see silence (an agent host lacked
``state_events`` once, and the feed went silent under ``placement="hosts"`` with only
a debug line to show for it). No Ray: the actor is a stand-in."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import ray
from thinkray.actors.ingress.auth import Principal
from thinkray.actors.ingress.state import state_changes
from thinkray.actors.relay import NotBoundError


def _ingress(failure: Exception):
    class Events:
        def options(self, **_: object) -> Events:
            return self

        def remote(self, name: str) -> object:
            raise failure

    actor = SimpleNamespace(state_events=Events())

    class Handle:
        async def _actor_async(self, stale: bool = False) -> object:
            return actor

    async def agent(slug: str, name: str, who: Principal, *, claim: bool) -> Handle:
        return Handle()

    return SimpleNamespace(agents=SimpleNamespace(agent=agent))


async def _drain(failure: Exception) -> list:
    who = Principal(id="alice")
    return [c async for c in state_changes(_ingress(failure), ("chat", "a"), who, False)]


@pytest.mark.parametrize(
    "failure",
    [NotBoundError("a", None), ray.exceptions.RayActorError()],
    ids=["unbound", "actor-died"],
)
async def test_an_agent_that_went_away_ends_the_watch_quietly(failure, caplog):
    with caplog.at_level(logging.DEBUG, logger="thinkray"):
        assert await _drain(failure) == []
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


async def test_any_other_failure_of_the_watch_is_a_warning(caplog):
    failure = AttributeError("'ActorHandle' object has no attribute 'state_events'")
    with caplog.at_level(logging.DEBUG, logger="thinkray"):
        assert await _drain(failure) == []
    [record] = caplog.records
    assert record.levelno == logging.WARNING and "state_events" in record.getMessage()
