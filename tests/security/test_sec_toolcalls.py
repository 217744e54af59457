"""Attacks on durable tool calls and approvals (issue 21, items 13 and 14): a dead
executor must not hold a call forever, a stale or foreign executor cannot report or
renew a call it does not hold, a lease cannot be stretched without bound, and an
approval past its expiry cannot be answered, whatever happened to the process that
waited for it. Crashes are real: SIGKILL of the worker's or the agent's process."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest
from thinkray.runtime import Think, tool
from thinkray.runtime.capabilities.permissions import ApprovalExpiredError
from thinkray.runtime.errors import ClaimLostError, RunInterruptedError
from thinkray.runtime.models.testing import ScriptedModel, reply, tool_call
from thinkray.runtime.tools.base import ToolPolicy
from thinkray.storage.errors import InvalidInputError

from tests.helpers import start_driver, wait_until

WORKER = """
import asyncio, sys
from thinkray.actors import AgentNamespace
from thinkray.runtime import tool
from thinkray.runtime.tools.worker import ToolCallWorker

handle = AgentNamespace.connect(sys.argv[1]).get(sys.argv[2])
marker = sys.argv[3]

@tool(name="render")
async def render(scene: str) -> str:
    with open(marker, "a", encoding="utf-8") as marks:
        marks.write("started\\n")
    await asyncio.sleep(3600)  # it never finishes: the worker is killed first
    return "never"

asyncio.run(ToolCallWorker(handle, [render], name="worker-1").run(wait=10))
"""


def _kill_agent(ns: Any, name: str) -> None:
    """SIGKILL the process hosting agent ``name`` and wait until it is gone."""
    pid = int(ns.where(name)["pid"])
    os.kill(pid, signal.SIGKILL)

    def gone() -> bool:
        where = ns.where(name)
        return where is None or where["pid"] != pid

    wait_until(gone, timeout=30)


def _call(agent: Any, call_id: str) -> dict[str, Any]:
    return agent.get_tool_call.remote(call_id).result()


def _tool_part(agent: Any, call_id: str) -> dict[str, Any]:
    for message in agent.get_history.remote().result():
        for part in message["parts"]:
            if part.get("toolCallId") == call_id:
                return part
    raise AssertionError(f"no part for {call_id}")


@pytest.mark.ray
def test_a_worker_killed_mid_call_loses_its_claim_and_the_next_worker_finishes_the_turn_once(
    namespace_factory, ray_local, tmp_path
):
    from tests.toolcall_agents import LeasedRenderAgent

    ns = namespace_factory(LeasedRenderAgent, idle_timeout=None)
    agent = ns.get("leased")
    pending = agent.chat.remote("render dusk")
    wait_until(lambda: _call(agent, "render-call"), timeout=60)
    marker = tmp_path / "started.txt"
    worker = start_driver(ray_local, WORKER, ns.name, "leased", str(marker))
    try:
        wait_until(lambda: marker.exists() or worker.poll() is not None, timeout=120)
        assert worker.poll() is None, worker.stderr.read()[-3000:] if worker.stderr else ""
        first = _call(agent, "render-call")
        assert (first["status"], first["executor"], first["attempts"]) == (
            "executing",
            "worker-1",
            1,
        )
        # The live worker beats: its lease moves on while the tool runs.
        wait_until(lambda: _call(agent, "render-call")["lease_until"] > first["lease_until"])
    finally:
        os.kill(worker.pid, signal.SIGKILL)  # a real crash of the worker's process
        worker.communicate(timeout=60)
    # Nobody renews any more: the claim lapses and the next worker gets the call.
    [claimed] = agent.claim_tool_calls.remote(["render"], "worker-2", 1, 30.0).result()
    assert (claimed["tool_call_id"], claimed["attempts"]) == ("render-call", 2)
    with pytest.raises(ClaimLostError):  # the dead worker's claim is gone for good
        agent.submit_tool_result.remote("render-call", "worker-1", "stale.png").result()
    with pytest.raises(ClaimLostError):
        agent.renew_tool_call.remote("render-call", "worker-1").result()
    assert agent.submit_tool_result.remote("render-call", "worker-2", "dusk.png").result() == (
        "accepted"
    )
    result = pending.result(timeout_s=60)
    assert result.status == "completed"
    answers = [
        "".join(p.get("text", "") for p in m["parts"] if p["type"] == "text")
        for m in agent.get_history.remote().result()
        if m["role"] == "assistant"
    ]
    assert answers == ["done: dusk.png"]  # the turn finished once, with worker-2's result
    call = _call(agent, "render-call")
    assert (call["status"], call["executor"], call["result"]) == (
        "completed",
        "worker-2",
        "dusk.png",
    )
    assert marker.read_text().count("started") == 1


@pytest.mark.ray
def test_an_approval_past_its_expiry_after_a_sigkill_is_cancelled_and_a_late_answer_refused(
    namespace_factory, tmp_path
):
    """The issue's case: ``approval_timeout=3``, a SIGKILL of the session actor's
    process, a wake more than a second past ``expires_at``."""
    from tests.toolcall_agents import ExpiringApprovalAgent

    ns = namespace_factory(ExpiringApprovalAgent, idle_timeout=None)
    agent = ns.get("expiring")
    marks = tmp_path / "deploys.txt"
    pending = agent.chat.remote(f"deploy {marks}")
    [ask] = wait_until(lambda: agent.pending_approvals.remote().result(), timeout=60)
    assert ask["expires_at"] is not None
    _kill_agent(ns, "expiring")
    with pytest.raises(RunInterruptedError):
        pending.result(timeout_s=30)
    wait_until(lambda: time.time() > ask["expires_at"] + 1, timeout=30)
    # The wake (this call binds the agent again) finds the ask expired.
    call = _call(agent, "deploy-call")
    assert call["status"] == "cancelled-by-timeout"
    assert call["approval"]["decision"] == "timeout"
    assert agent.pending_approvals.remote().result() == []
    with pytest.raises(ApprovalExpiredError):
        agent.answer_approval.remote(ask["approval_id"], "once", "alice").result()
    assert agent.get_approval.remote(ask["approval_id"]).result()["status"] == "timed-out"
    part = _tool_part(agent, "deploy-call")
    assert part["state"] == "output-error" and "timed out" in part["errorText"]
    assert _call(agent, "deploy-call")["status"] == "cancelled-by-timeout"
    assert not marks.exists()  # the tool never ran


# -- in process: who may touch a claim ------------------------------------------------


def _rendering_agent(store: Any) -> Think:
    @tool(name="render", policy=ToolPolicy(executor="external", lease=5.0))
    async def render(scene: str) -> str:
        """External."""
        raise AssertionError("never inline")

    model = ScriptedModel([reply(tool_call("render", {"scene": "x"}, id="c1")), reply("ok")])
    agent = Think(store, model=model)
    agent.get_tools = lambda: {"render": render}  # type: ignore[method-assign]
    return agent


async def _started(agent: Think) -> None:
    for _ in range(2000):
        if agent.get_tool_call("c1") is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the call was never written")


async def test_a_foreign_executor_can_neither_renew_nor_report_a_claimed_call(store):
    agent = _rendering_agent(store)
    turn = asyncio.ensure_future(agent.chat("draw"))
    await _started(agent)
    with pytest.raises(ClaimLostError):  # nobody holds it yet
        agent.submit_tool_result("c1", "mallory", "forged")
    [claimed] = await agent.claim_tool_calls(["render"], "gpu", wait=10)
    before = agent.get_tool_call("c1")
    with pytest.raises(ClaimLostError):
        agent.renew_tool_call("c1", "mallory")
    with pytest.raises(ClaimLostError):
        agent.submit_tool_result("c1", "mallory", "forged")
    assert agent.get_tool_call("c1") == before  # nothing changed
    agent.submit_tool_result("c1", "gpu", "real")
    assert (await asyncio.wait_for(turn, 30)).status == "completed"
    assert agent.get_tool_call("c1")["result"] == "real" and claimed["attempts"] == 1


async def test_a_lease_cannot_be_stretched_without_bound(store):
    agent = _rendering_agent(store)
    turn = asyncio.ensure_future(agent.chat("draw"))
    await _started(agent)
    with pytest.raises(InvalidInputError):
        await agent.claim_tool_calls(["render"], "gpu", 1, 0.0, 10.0**12)
    assert agent.get_tool_call("c1")["status"] == "pending"
    await agent.claim_tool_calls(["render"], "gpu", wait=10)
    before = agent.get_tool_call("c1")
    for bad in (10.0**12, -5, 0, float("nan")):
        with pytest.raises(InvalidInputError):
            agent.renew_tool_call("c1", "gpu", bad)
    assert agent.get_tool_call("c1") == before
    agent.submit_tool_result("c1", "gpu", "ok")
    assert (await asyncio.wait_for(turn, 30)).status == "completed"
