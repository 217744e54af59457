"""Defects of issue 26 at the actor layer, each as the scenario a user hits."""

from __future__ import annotations

import asyncio

import pytest
from thinkray.actors.errors import RunInterruptedError
from thinkray.actors.session_actor import _bounded
from thinkray.runtime.agents.recovery import INTERRUPTED_ERROR

from tests.defects_agents import CallThenStall, SlowTalker
from tests.helpers import kill_agent_process


def test_a_tool_call_a_client_saw_survives_a_crash_right_after(namespace_factory):
    ns = namespace_factory(CallThenStall, idle_timeout=None)
    agent = ns.get("seen-call")
    stream = agent.stream_chat.remote("call")
    for chunk in stream:
        if chunk["type"] == "tool-input-available":
            break
    kill_agent_process(ns, "seen-call")  # a crash the moment the client saw the call
    with pytest.raises(RunInterruptedError):
        for _ in stream:
            pass
    # The next call wakes the agent from its file: the call left its trace.
    calls = agent.list_tool_calls.remote().result(timeout_s=60)
    # The call's row was written claimed (an agent without a permission check): a crash
    # before it finished leaves it failed, with an error that says the turn was cut off.
    assert [(c["tool_call_id"], c["status"]) for c in calls] == [("call-1", "failed")]
    assert calls[0]["error"].startswith("interrupted")
    [_, message] = agent.get_history.remote().result()
    [part] = [p for p in message["parts"] if p.get("toolCallId") == "call-1"]
    assert part["state"] == "output-error" and part["input"] == {"q": "x"}
    assert message["metadata"]["status"] == "interrupted"


async def test_a_hibernation_hook_that_never_returns_is_cut_off():
    # A hook that swallows its cancel (the schedule timer did, on Python 3.11): the
    # bound still returns, and says the hook did not finish.
    release = asyncio.Event()

    async def stuck() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    assert await asyncio.wait_for(_bounded(stuck, 0.05), 30) is False
    release.set()
    assert await _bounded(lambda: None, 30) is True
    with pytest.raises(ValueError):
        await _bounded(lambda: (_ for _ in ()).throw(ValueError("hook failed")), 30)


def test_a_forced_hibernation_ends_the_live_stream_as_the_replay_ends(namespace_factory):
    ns = namespace_factory(SlowTalker, idle_timeout=None)
    agent = ns.get("talker")
    stream = agent.stream_chat.remote("talk")
    live = []
    for chunk in stream:
        live.append(chunk)
        if chunk["type"] == "text-delta":
            break
    assert ns.hibernate("talker", force=True)
    live.extend(stream)  # the rest of the live stream, to its end
    assert live[-1] == {"type": "error", "errorText": INTERRUPTED_ERROR}
    replay = list(agent.resume.remote(stream.session_id, stream.run_id))  # wakes the agent
    assert replay == live
    [_, message] = agent.get_history.remote().result()
    assert message["metadata"]["status"] == "interrupted"


async def test_a_call_that_arrives_while_the_agent_hibernates_is_refused_not_cut_off(
    ray_local, tmp_path
):
    """A turn sent while the agent's hibernation hooks ran was admitted, then cut off
    by the close that ends the hibernation: it read back "interrupted" with no crash
    (seen as failed turns in bench_w1's bursts of new sessions). Now it is refused as
    "not bound here" (the call never ran; a handle re-sends it to the woken agent)."""
    from thinkray.actors.relay import NotBoundError
    from thinkray.actors.session_actor import BindSpec, SessionActor

    from tests.defects_agents import SlowToHibernate

    SlowToHibernate.entered, SlowToHibernate.gate = asyncio.Event(), asyncio.Event()
    actor = SessionActor((), False, None)  # the object a session actor or host runs
    await actor.bind(BindSpec("ns", "a", str(tmp_path / "a.duckdb"), SlowToHibernate))
    first = await actor.invoke("a", "chat", ("before",))
    assert first.status == "completed"
    hibernating = asyncio.ensure_future(actor.hibernate("a"))
    await SlowToHibernate.entered.wait()
    with pytest.raises(NotBoundError):
        await actor.invoke("a", "chat", ("during",))
    with pytest.raises(NotBoundError):
        await anext(actor.invoke_stream("a", "stream_chat", ("during, streamed",)))
    SlowToHibernate.gate.set()
    assert (await hibernating)["ok"]
    # Nothing of the refused calls reached the file.
    await actor.bind(BindSpec("ns", "a", str(tmp_path / "a.duckdb"), SlowToHibernate))
    history = await actor.invoke("a", "get_history")
    assert [m["role"] for m in history] == ["user", "assistant"]
    SlowToHibernate.gate.set()
    await actor.hibernate("a", force=True)


async def test_a_call_that_arrives_while_the_agent_wakes_waits_for_the_wake(ray_local, tmp_path):
    """The agent is set before its ``on_wake`` runs: a call admitted then ran before the
    wake finished (and a failed wake closed the agent under it). It is refused as "not
    bound here" until the bind is done; then the same call runs."""
    from thinkray.actors.relay import NotBoundError
    from thinkray.actors.session_actor import BindSpec, SessionActor

    from tests.defects_agents import SlowToWake

    SlowToWake.entered, SlowToWake.gate = asyncio.Event(), asyncio.Event()
    actor = SessionActor((), False, None)
    binding = asyncio.ensure_future(
        actor.bind(BindSpec("ns", "b", str(tmp_path / "b.duckdb"), SlowToWake))
    )
    await SlowToWake.entered.wait()
    with pytest.raises(NotBoundError):
        await actor.invoke("b", "chat", ("too early",))
    SlowToWake.gate.set()
    await binding
    assert (await actor.invoke("b", "chat", ("after the wake",))).status == "completed"
    assert [m["role"] for m in await actor.invoke("b", "get_history")] == ["user", "assistant"]
    await actor.hibernate("b", force=True)
