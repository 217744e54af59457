"""Turns are exactly-once from the caller's side across crashes (issue 9, items 1–3):
the actor's process is SIGKILLed mid-turn, for real."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from thinkray.runtime.errors import RunInterruptedError, UnknownRunError

from tests.helpers import crash_namespace, kill_agent_process, wait_until

pytestmark = pytest.mark.ray


def _tool_runs(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def crashy(namespace_factory, tmp_path):
    log = tmp_path / "tools.log"
    return crash_namespace(namespace_factory, log, chunks=40, delay=0.05), log


def test_a_crash_mid_chat_is_reported_never_rerun(crashy):
    ns, log = crashy
    agent = ns.get("victim")
    ns.wake("victim")  # bound and live
    outcome: dict[str, Any] = {}

    def chat() -> None:
        try:
            outcome["result"] = agent.chat.remote("weather in Lima").result()
        except BaseException as exc:  # the test inspects it
            outcome["error"] = exc

    thread = threading.Thread(target=chat)
    thread.start()
    wait_until(lambda: _tool_runs(log), timeout=30)  # the tool ran, the answer streams
    old_pid = kill_agent_process(ns, "victim")
    thread.join(60)
    assert "result" not in outcome, "a crashed turn must not be reported as finished"
    error = outcome["error"]
    assert isinstance(error, RunInterruptedError), repr(error)
    assert error.message_id and error.run_id
    # Recovery happens at wake, before anyone runs a turn: read through a woken actor.
    history = agent.get_history.remote().result()
    assert ns.where("victim")["pid"] != old_pid
    users = [m for m in history if m["role"] == "user"]
    assert [m["id"] for m in users] == [error.message_id]  # stored once
    partial = history[-1]
    assert partial["role"] == "assistant"
    assert partial["metadata"]["status"] == "interrupted"
    tool = [p for p in partial["parts"] if p["type"] == "dynamic-tool"]
    # closed either way: with its output if that was flushed before the kill, else as
    # an error saying the turn was interrupted (never left open)
    assert tool and tool[0]["state"] in ("output-available", "output-error")
    if tool[0]["state"] == "output-error":
        assert "interrupted" in tool[0]["errorText"]
    assert all(p.get("state") != "streaming" for p in partial["parts"])
    assert len(_tool_runs(log)) == 1  # the tool ran once, and nothing re-ran it
    # Sending the same message again never stores it twice; the turn answers it anew.
    again = agent.chat.remote(users[0]).result()
    assert again.status == "completed"
    history = agent.get_history.remote().result()
    assert [m["id"] for m in history if m["role"] == "user"] == [error.message_id]
    assert len(_tool_runs(log)) == 1  # the answer after the partial needed no tool


def test_a_tool_call_cut_off_by_a_crash_is_closed_at_wake(crashy):
    ns, log = crashy
    agent = ns.get("mid-tool")
    stream = agent.stream_chat.remote("weather in Oslo")
    seen = []
    with pytest.raises(RunInterruptedError) as caught:
        for chunk in stream:
            seen.append(chunk)
            if chunk["type"] == "tool-input-available":
                kill_agent_process(ns, "mid-tool")
    assert caught.value.run_id == stream.run_id
    assert caught.value.session_id == stream.session_id
    message = agent.get_message.remote(stream.message_id).result()
    assert message["metadata"]["status"] == "interrupted"
    states = [p.get("state") for p in message["parts"] if p["type"] == "dynamic-tool"]
    assert "input-available" not in states and "input-streaming" not in states
    # A reconnecting client replays a complete stream: the log was closed at wake.
    replay = list(agent.resume.remote(run_id=stream.run_id))
    # What was durable when the process died (chunks land within ~30 ms) replays as it
    # was seen; then come the chunks that close what was open, and the error.
    pairs = zip(replay, seen, strict=False)
    kept = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(replay), len(seen)))
    assert kept > 0 and replay[:kept] == seen[:kept]
    closing = ("text-end", "reasoning-end", "tool-output-error", "tool-input-error", "error")
    assert all(c["type"] in closing for c in replay[kept:]), replay[kept:]
    assert replay[-1]["type"] == "error" and "interrupted" in replay[-1]["errorText"]
    # and the agent goes on
    assert agent.chat.remote("hello again").result().status == "completed"


def test_a_call_to_an_actor_that_died_while_idle_is_sent_again(crashy):
    ns, _ = crashy
    agent = ns.get("idle-crash")
    first = agent.chat.remote("hi").result()
    kill_agent_process(ns, "idle-crash")
    wait_until(lambda: _dead_or_replaced(ns, "idle-crash"), timeout=20)
    binds = ns.stats()["counters"]["binds"]
    # The handle still holds the dead actor: the turn never started there, so the
    # handle re-sends it (the woken agent has no message with its id).
    second = agent.chat.remote("still there?").result()
    assert second.status == "completed"
    assert ns.stats()["counters"]["binds"] == binds + 1  # one wake, not a second one
    users = [m for m in agent.get_history.remote().result() if m["role"] == "user"]
    assert [m["id"] for m in users] == [first.user_message_id, second.user_message_id]


def _dead_or_replaced(ns: Any, name: str) -> bool:
    import ray

    live = ns.where(name)
    if live is None:
        return True
    try:
        state = ray.util.state.get_actor(live["actor_id"])
    except Exception:
        return True
    return state is None or state.state == "DEAD"


def test_results_of_finished_runs_are_kept_and_unknown_runs_are_an_error(namespace_factory):
    from tests.agents import ScriptAgent  # noqa: F401  (the default agent class)

    ns = namespace_factory(idle_timeout=None)
    agent = ns.get("results")
    stream = agent.stream_chat.remote("hello")
    list(stream)
    # The run is over: its result is still there, and it is the true one.
    result = agent.wait_run.remote(stream.run_id).result()
    assert result.run_id == stream.run_id and result.status == "completed"
    assert result.message_id == stream.message_id
    with pytest.raises(UnknownRunError, match="run-nope"):
        agent.wait_run.remote("run-nope").result()


def test_an_alarm_reported_before_the_bind_returns_is_kept(namespace_factory):
    """A woken agent reports its next alarm to the directory as its scheduler starts,
    which can be before the bind's reply: the directory used to drop the alarm it held
    once the reply came, and with it that report, so a crash of the live agent's
    process lost the alarm."""
    import time

    from tests.agents import SlowWakeAlarmAgent

    ns = namespace_factory(SlowWakeAlarmAgent, idle_timeout=None)
    agent = ns.get("alarmed")
    agent.schedule.remote(600.0, "note_alarm", "later").result()
    due = wait_until(lambda: ns.stats()["alarms"].get("alarmed"), timeout=10)
    assert ns.hibernate("alarmed")
    assert ns.stats()["alarms"]["alarmed"] == due  # held for the hibernated agent
    agent.whoami.remote().result()  # wakes it: its report comes during the bind
    time.sleep(1.0)
    assert ns.stats()["alarms"].get("alarmed") == due


def test_an_alarm_fires_on_time_after_its_live_actor_crashed(namespace_factory):
    import time

    from tests.agents import AlarmAgent

    ns = namespace_factory(AlarmAgent, idle_timeout=None)
    agent = ns.get("alarmed")
    agent.schedule.remote(3.0, "note_alarm", "ding").result()
    due = time.time() + 3.0
    wait_until(lambda: ns.stats()["alarms"].get("alarmed"), timeout=5)  # known while live
    time.sleep(1.0)
    kill_agent_process(ns, "alarmed")
    wait_until(lambda: ns.where("alarmed") is None, timeout=5)  # the crash is noticed
    assert ns.stats()["alarms"]["alarmed"] == pytest.approx(due, abs=0.5)
    # Nobody calls the agent: the directory wakes it when the alarm is due.
    deadline = due + 5
    while time.time() < deadline and not ns.where("alarmed"):
        time.sleep(0.05)
    fired = wait_until(lambda: agent.alarms_fired.remote().result(), timeout=10)
    assert [payload for payload, _ in fired] == ["ding"]
    # woken by its alarm, not early (the wait above bounds how late); `due` was taken
    # just after the schedule call, so the alarm's own due time is a little earlier
    assert fired[0][1] >= due - 0.5
    time.sleep(1.5)
    assert len(agent.alarms_fired.remote().result()) == 1  # exactly once
