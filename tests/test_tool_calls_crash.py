"""Durable tool calls survive crashes (issue 12, "Done when"): the session actor is
SIGKILLed while a tool call runs, and no tool call executes twice."""

from __future__ import annotations

import os
import signal

import pytest
from thinkray.runtime.errors import RunInterruptedError

from tests.agents import DurableToolAgent, ResumingAgent
from tests.helpers import hibernated_after, wait_until

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def _durable_tools(module_namespace_factory):
    return module_namespace_factory(DurableToolAgent)


@pytest.fixture(scope="module")
def _resuming(module_namespace_factory):
    return module_namespace_factory(ResumingAgent)


@pytest.fixture
def durable_tools(_durable_tools):
    """The module's namespace of DurableToolAgents (each test names its own agent);
    its agents hibernate after each test and leave their actors to the next."""
    yield from hibernated_after(_durable_tools)


@pytest.fixture
def resuming(_resuming):
    """Likewise for ResumingAgents."""
    yield from hibernated_after(_resuming)


def _kill(ns, name: str) -> int:
    pid = ns.where(name)["pid"]
    os.kill(pid, signal.SIGKILL)

    def gone() -> bool:
        where = ns.where(name)
        return where is None or where["pid"] != pid

    wait_until(gone, timeout=30)
    return pid


def test_an_inline_call_cut_off_by_a_crash_fails_and_never_runs_again(durable_tools, tmp_path):
    ns = durable_tools
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


def test_an_external_executor_keeps_its_claim_across_the_agents_crash(durable_tools):
    ns = durable_tools
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


# -- generation recovery (issue 12, item 4): recover_generations = "resume" ------------


def _answers(agent) -> list[str]:
    history = agent.get_history.remote().result()
    return [
        "".join(p.get("text", "") for p in m["parts"] if p["type"] == "text")
        for m in history
        if m["role"] == "assistant"
    ]


def _tool_part(agent, call_id: str) -> dict:
    for message in agent.get_history.remote().result():
        for part in message["parts"]:
            if part.get("toolCallId") == call_id:
                return part
    raise AssertionError(f"no part for {call_id}")


def test_an_approval_given_after_a_crash_runs_the_tool_once_and_resumes(resuming, tmp_path):
    ns = resuming
    agent = ns.get("resume-approval")
    marks = tmp_path / "deploys.txt"
    pending = agent.chat.remote(f"deploy {marks}")
    wait_until(lambda: agent.pending_approvals.remote().result(), timeout=30)
    _kill(ns, "resume-approval")
    with pytest.raises(RunInterruptedError):
        pending.result(timeout_s=30)
    # The woken agent still lists the ask (from its database) and takes the answer.
    [ask] = agent.pending_approvals.remote().result()
    assert ask["tool_call_id"] == "deploy-call"
    assert _tool_part(agent, "deploy-call")["state"] == "approval-requested"
    agent.answer_approval.remote(ask["approval_id"], "once", "alice").result()
    wait_until(lambda: _answers(agent)[-1:] == ["done: deployed"], timeout=30)
    assert marks.read_text().count("deployed") == 1
    part = _tool_part(agent, "deploy-call")
    assert (part["state"], part["output"]) == ("output-available", "deployed")
    call = agent.get_tool_call.remote("deploy-call").result()
    assert call["status"] == "completed" and call["approval"]["answered_by"] == "alice"


def test_an_external_result_after_a_crash_resumes_the_generation(resuming):
    ns = resuming
    agent = ns.get("resume-render")
    pending = agent.chat.remote("render dusk")
    [claimed] = agent.claim_tool_calls.remote(["render"], "gpu-1", 1, 10.0).result()
    _kill(ns, "resume-render")
    with pytest.raises(RunInterruptedError):
        pending.result(timeout_s=30)
    assert agent.get_tool_call.remote("render-call").result()["status"] == "executing"
    assert agent.submit_tool_result.remote("render-call", "gpu-1", "dusk.png").result() == (
        "accepted"
    )
    wait_until(lambda: _answers(agent)[-1:] == ["done: dusk.png"], timeout=30)
    assert claimed["tool_call_id"] == "render-call"


def test_a_generation_whose_calls_are_settled_resumes_at_wake(resuming, tmp_path):
    ns = resuming
    agent = ns.get("resume-wake")
    marks = tmp_path / "marks.txt"
    pending = agent.chat.remote(f"slow {marks}")
    wait_until(lambda: marks.exists() and marks.read_text().count("ran") == 1, timeout=30)
    _kill(ns, "resume-wake")
    with pytest.raises(RunInterruptedError):
        pending.result(timeout_s=30)
    # Waking alone resumes it: the inline call failed with the process (its tool may
    # have had effects, so it is not re-run); the model is asked again with that.
    ns.wake("resume-wake")
    wait_until(lambda: _answers(agent)[-1].startswith("done"), timeout=30)
    assert len(_answers(agent)) == 1  # the resumed answer continues the interrupted reply
    assert "died" in _answers(agent)[-1]
    assert marks.read_text().count("ran") == 1
    assert _tool_part(agent, "slow-call")["state"] == "output-error"
