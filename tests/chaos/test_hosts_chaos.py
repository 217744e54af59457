"""Chaos under placement ``hosts``: SIGKILL of an agent host process (by pid) while 32
of its agents are mid-turn and some have alarms pending.

A host's death takes all its agents at once. Asserted for every agent: its user
message is stored once (none lost, none doubled), no tool ran twice, nothing is left
open and every assistant message has a truthful status, the next turn works (it wakes
on another host), and each pending alarm fires exactly once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from thinkray.runtime.errors import RunInterruptedError

from tests.helpers import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.chaos]

AGENTS = 32
ALARMS = 4
OPEN_TOOL_STATES = ("input-streaming", "input-available", "approval-requested")


def _consume(stream: Any, seen: threading.Event, outcome: dict[str, Any]) -> None:
    try:
        chunks = []
        for chunk in stream:
            chunks.append(chunk)
            if chunk["type"] == "text-delta":
                seen.set()  # mid-turn: past the tool call, streaming its answer
        outcome["last"] = chunks[-1]["type"] if chunks else None
    except RunInterruptedError as exc:
        outcome["interrupted"] = exc
    except BaseException as exc:  # reported by the test
        outcome["error"] = exc
    finally:
        seen.set()


def _check(agent: Any, log_lines: list[str], note: str) -> None:
    history = agent.get_history.remote().result()
    users = [m for m in history if m["role"] == "user"]
    assert len(users) == 1, f"{note}: {len(users)} user messages"
    for message in history:
        for part in message["parts"]:
            if part["type"] == "dynamic-tool":
                assert part["state"] not in OPEN_TOOL_STATES, f"{note}: open tool call {part}"
            if part["type"] in ("text", "reasoning"):
                assert part.get("state") != "streaming", f"{note}: open {part['type']} part"
        if message["role"] == "assistant":
            status = (message.get("metadata") or {}).get("status")
            assert status in ("completed", "aborted", "error", "interrupted"), (
                f"{note}: assistant message without a truthful status: {status}"
            )


@pytest.mark.timeout(900)
def test_host_kill_with_32_agents_mid_turn(namespace_factory, tmp_path):
    from tests.agents import CrashAgent

    log = tmp_path / "tools.log"
    ns = namespace_factory(
        CrashAgent,
        # few chunks, spaced: turns last seconds (the kill lands mid-turn) at little CPU
        # (32 turns share one process on a loaded 2-core machine)
        agent_kwargs={"tool_log": str(log), "chunks": 40, "delay": 0.1},
        idle_timeout=None,
        placement="hosts",
        host_capacity=AGENTS,
    )
    names = [f"h{i}" for i in range(AGENTS)]
    agents = {n: ns.get(n) for n in names}
    for name in names:  # wake all first: the kill must find them on the hosts
        ns.wake(name)
    alarm_due = time.time() + 6.0
    for i, name in enumerate(names[:ALARMS]):
        agents[name].schedule.remote(alarm_due - time.time(), "note_alarm", i).result()
    outcomes: dict[str, dict[str, Any]] = {n: {} for n in names}
    seen = {n: threading.Event() for n in names}
    threads = []
    for name in names:
        stream = agents[name].stream_chat.remote(f"weather in Quito for {name}")
        thread = threading.Thread(target=_consume, args=(stream, seen[name], outcomes[name]))
        thread.start()
        threads.append(thread)
    for name in names:
        assert seen[name].wait(120), f"{name}: no chunk"
    pids = {int(ns.where(n)["pid"]) for n in names if ns.where(n) is not None}
    assert pids and os.getpid() not in pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive()
    interrupted = sum(1 for o in outcomes.values() if "interrupted" in o)
    for name, outcome in outcomes.items():
        assert "error" not in outcome, f"{name}: {outcome.get('error')!r}"
        if "interrupted" not in outcome:
            assert outcome["last"] == "finish", f"{name}: ended with {outcome['last']}"
    assert interrupted, "the kill landed after every turn ended"
    lines = log.read_text().splitlines() if log.exists() else []
    calls = [line.split()[0] for line in lines]
    assert len(calls) == len(set(calls)), f"a tool call ran twice: {calls}"
    for name in names:
        _check(agents[name], lines, name)
    # the alarms fire once each, on new hosts (the kill came before they were due)
    for i, name in enumerate(names[:ALARMS]):
        fired = wait_until(lambda a=agents[name]: a.alarms_fired.remote().result(), timeout=60)
        assert fired == [i], f"{name}: {fired}"
    # the next turns, all at once (each streams for seconds): on new hosts
    responses = {name: agents[name].chat.remote("and now?") for name in names}
    for name, response in responses.items():
        result = response.result()
        assert result.status == "completed", f"{name}: {result.status} {result.error}"
        assert int(ns.where(name)["pid"]) not in pids
    for i, name in enumerate(names[:ALARMS]):
        assert agents[name].alarms_fired.remote().result() == [i], f"{name}: fired twice"
