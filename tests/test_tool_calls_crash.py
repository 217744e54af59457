"""Durable tool calls survive crashes (issue 12, "Done when"): the session actor is
SIGKILLed while a tool call runs, and no tool call executes twice."""

from __future__ import annotations

import os
import signal

import pytest
from thinkray.runtime.errors import RunInterruptedError

from tests.agents import DurableToolAgent
from tests.helpers import wait_until

pytestmark = pytest.mark.ray


def _kill(ns, name: str) -> int:
    pid = ns.where(name)["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: ns.where(name) is None or ns.where(name)["pid"] != pid, timeout=30)
    return pid


def test_an_inline_call_cut_off_by_a_crash_fails_and_never_runs_again(namespace_factory, tmp_path):
    ns = namespace_factory(DurableToolAgent)
    agent = ns.get("crashy-tools")
    marks = tmp_path / "marks.txt"
    pending = agent.chat.remote(f"slow {marks}")
    wait_until(lambda: marks.exists() and marks.read_text().count("ran") == 1, timeout=30)
    _kill(ns, "crashy-tools")
    with pytest.raises(RunInterruptedError):
        pending.result(timeout_s=30)  # the turn died with its process
    calls = agent.list_tool_calls.remote().result()  # wakes the agent on a new actor
    assert [(c["tool_call_id"], c["status"]) for c in calls] == [("slow-0", "failed")]
    assert "died" in calls[0]["error"]
    # The woken agent does not run it again, and a new turn's call is a new id.
    agent.chat.remote("nothing").result()
    assert marks.read_text().count("ran") == 1


def test_an_external_executor_keeps_its_claim_across_the_agents_crash(namespace_factory):
    ns = namespace_factory(DurableToolAgent)
    agent = ns.get("crashy-render")
    pending = agent.chat.remote("render sunset")
    claimed = agent.claim_tool_calls.remote(["render"], "gpu-1", 1, 10.0).result()
    assert [c["tool_call_id"] for c in claimed] == ["render-1"]
    _kill(ns, "crashy-render")
    with pytest.raises(RunInterruptedError):
        pending.result(timeout_s=30)
    # After the wake the call is still the executor's: nobody else can claim it, and
    # its result is taken once.
    assert agent.claim_tool_calls.remote(["render"], "gpu-2", 1, 0.0).result() == []
    assert agent.submit_tool_result.remote("render-1", "gpu-1", "an image").result() == "accepted"
    call = agent.get_tool_call.remote("render-1").result()
    assert (call["status"], call["executor"], call["attempts"]) == ("completed", "gpu-1", 1)
    with pytest.raises(Exception, match="completed"):
        agent.submit_tool_result.remote("render-1", "gpu-1", "again").result()
