"""The stream lane between real actors and this driver (thinkray.actors.lane).

A stream through a handle travels the actor's lane when the caller is on its node,
under both placements, and gives what the Ray stream gives: the same items with their
types, the same errors, a re-resolve after hibernation, and an interrupted turn (not a
hang, not a re-run) when the actor is killed mid-stream. ``THINKRAY_STREAM_LANE=0``
sends the same calls through Ray, for comparison.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import kill_agent_process, text_of, wait_until
from tests.lane_agents import LaneAgent

pytestmark = pytest.mark.ray

PLACEMENTS = ["hosts", "dedicated"]


def _ns(namespace_factory: Any, placement: str, **kwargs: Any) -> Any:
    kwargs.setdefault("idle_timeout", None)
    if placement == "hosts":
        kwargs.setdefault("host_capacity", 8)
        kwargs.setdefault("max_live", 7)
    return namespace_factory(LaneAgent, placement=placement, **kwargs)


def _lane_streams(ns: Any, name: str) -> int:
    """Streams the actor hosting ``name`` served over its lane."""
    import ray

    actor = ns.get(name)._actor_sync()
    return int(ray.get(actor.ready.remote())["lane_streams"])


def _lane_figures(ns: Any, name: str) -> tuple[int, int]:
    """Streams and connections the actor hosting ``name`` served over its lane."""
    import ray

    info = ray.get(ns.get(name)._actor_sync().ready.remote())
    return int(info["lane_streams"]), int(info["lane_connections"])


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_callers_turns_share_one_lane_connection(namespace_factory, placement):
    """A turn's stream read to its end leaves its connection for the caller's next
    turn (tests/test_lane_pool.py has the rules): three turns, one connection, from a
    blocking caller and from an event loop."""
    import asyncio

    ns = _ns(namespace_factory, placement)
    handle = ns.get("kept")
    assert handle.chat.remote("warm").result().status == "completed"  # through Ray
    streams, connections = _lane_figures(ns, "kept")
    for turn in range(3):
        assert list(handle.stream_chat.remote(f"turn {turn}"))[-1]["type"] == "finish"
    assert _lane_figures(ns, "kept") == (streams + 3, connections + 1)

    async def turns() -> None:
        for turn in range(3):
            chunks = [chunk async for chunk in handle.stream_chat.remote(f"async {turn}")]
            assert chunks[-1]["type"] == "finish"

    asyncio.run(turns())
    assert _lane_figures(ns, "kept") == (streams + 6, connections + 2)


def _shape(chunks: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """A turn's chunks without their generated ids."""
    return [(c["type"], c.get("delta")) for c in chunks]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_turn_streams_over_the_lane_as_it_would_through_ray(
    namespace_factory, placement, monkeypatch
):
    ns = _ns(namespace_factory, placement)
    handle = ns.get("a")
    assert handle.chat.remote("warm").result().status == "completed"
    before = _lane_streams(ns, "a")
    stream = handle.stream_chat.remote("over the lane")
    chunks = list(stream)
    assert _lane_streams(ns, "a") == before + 1
    assert stream.run_id and stream.receiver is not None

    monkeypatch.setenv("THINKRAY_STREAM_LANE", "0")
    through_ray = list(handle.stream_chat.remote("over the lane"))
    assert _lane_streams(ns, "a") == before + 1  # not the lane this time
    assert _shape(chunks) == _shape(through_ray)
    assert chunks[-1]["type"] == "finish"


@pytest.mark.parametrize("lane_on", ["1", "0"])
def test_items_and_errors_are_the_same_over_the_lane_and_ray(
    namespace_factory, lane_on, monkeypatch
):
    """Run once over the lane, once through Ray: the same assertions hold."""
    import ray
    from thinkray.runtime.errors import SessionBusyError

    monkeypatch.setenv("THINKRAY_STREAM_LANE", lane_on)
    ns = _ns(namespace_factory, "hosts")
    handle = ns.get("typed")
    items = list(handle.typed.remote(3))
    assert items == [
        {"i": i, "pair": (i, "x"), "set": {i}, "raw": b"\x00\xff", "big": 2**70} for i in range(3)
    ]
    assert type(items[0]["pair"]) is tuple

    failing = iter(handle.failing.remote("busy"))
    assert next(failing) == 1
    with pytest.raises(SessionBusyError, match="busy"):
        next(failing)
    with pytest.raises(ray.exceptions.RayTaskError) as caught:
        list(handle.failing.remote("plain"))
    assert isinstance(caught.value, ValueError) and "a plain bug" in str(caught.value)
    assert (_lane_streams(ns, "typed") > 0) == (lane_on == "1")


def test_async_callers_stream_over_the_lane(namespace_factory):
    import asyncio

    ns = _ns(namespace_factory, "hosts")
    handle = ns.get("b")

    async def turn() -> list[dict[str, Any]]:
        return [chunk async for chunk in handle.stream_chat.remote("async")]

    chunks = asyncio.run(turn())
    assert chunks[-1]["type"] == "finish"
    assert _lane_streams(ns, "b") >= 1


def test_a_hibernated_agent_is_found_again_over_the_lane(namespace_factory):
    """The handle still names the host the agent left: the host answers NotBound over
    the lane, the handle re-resolves and the turn runs once, on the woken agent."""
    ns = _ns(namespace_factory, "hosts")
    handle = ns.get("c")
    list(handle.stream_chat.remote("first"))
    assert ns.hibernate("c")
    chunks = list(handle.stream_chat.remote("second"))
    assert chunks[-1]["type"] == "finish"
    users = [m for m in handle.get_history.remote().result() if m["role"] == "user"]
    assert len(users) == 2


def test_a_caller_that_leaves_early_detaches_and_the_turn_completes(namespace_factory):
    ns = _ns(namespace_factory, "hosts", agent_kwargs={"chunks": 20, "delay": 0.02})
    handle = ns.get("d")
    stream = handle.stream_chat.remote("leave early")
    next(iter(stream))
    stream.close()  # the connection closes; the run goes on

    def answer() -> str:
        history = handle.get_history.remote().result()
        return text_of(history[-1]) if history[-1]["role"] == "assistant" else ""

    wait_until(lambda: "chunk19" in answer(), timeout=30)  # the whole answer, kept
    assert answer().count("chunk") == 20


def test_a_host_killed_mid_stream_interrupts_the_turn_over_the_lane(namespace_factory):
    """SIGKILL of the host while a turn streams over the lane: the caller's iteration
    raises RunInterruptedError (the connection closed: a dead actor), the turn is not
    re-run, and the next call wakes the agent elsewhere."""
    from thinkray.runtime.errors import RunInterruptedError

    ns = _ns(namespace_factory, "hosts", agent_kwargs={"chunks": 200, "delay": 0.02})
    handle = ns.get("e")
    stream = handle.stream_chat.remote("a long answer")
    chunks = iter(stream)
    next(chunks)
    assert _lane_streams(ns, "e") >= 1
    pid = kill_agent_process(ns, "e")
    with pytest.raises(RunInterruptedError) as caught:
        list(chunks)
    assert caught.value.run_id == stream.run_id
    after = handle.whoami.remote().result()
    assert after["pid"] != pid
    history = handle.get_history.remote().result()
    assert [m["role"] for m in history].count("user") == 1
