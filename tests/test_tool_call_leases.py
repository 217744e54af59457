"""Leases and deadlines of durable tool calls (issue 21, items 13 and 14), in process:
an external claim holds only while its executor renews it, a lapsed claim goes to the
next executor, every external call has a deadline, and an approval's expiry is
enforced on the answer, not only by the coroutine that waited for it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from thinkray.runtime import Think, tool
from thinkray.runtime.capabilities.permissions import ApprovalExpiredError
from thinkray.runtime.errors import ClaimLostError, ToolCallStateError
from thinkray.runtime.models.testing import ScriptedModel, reply, tool_call
from thinkray.runtime.tools.base import DEFAULT_EXTERNAL_TIMEOUT, ToolContext, ToolPolicy
from thinkray.runtime.tools.worker import ToolCallWorker
from thinkray.storage.errors import InvalidInputError
from thinkray.storage.session_store import DuckDBSessionStore

from tests.conftest import Collector
from tests.test_permissions import CALLS, Agent, script, wait_pending


@pytest.fixture(autouse=True)
def _reset_calls():
    # CALLS is test_permissions' list, shared by every test of the xdist worker that
    # imported it: what ran before in that worker must not count here.
    CALLS.clear()


def render_tool(**policy: Any) -> Any:
    @tool(name="render", policy=ToolPolicy(executor="external", **policy))
    async def render(scene: str) -> str:
        """Rendered by an external worker."""
        raise AssertionError("an external tool never runs in the agent")

    return render


def rendering_agent(store: Any, **policy: Any) -> Think:
    model = ScriptedModel([reply(tool_call("render", {"scene": "dusk"}, id="call-1")), reply("ok")])
    agent = Think(store, model=model)
    tools = {"render": render_tool(**policy)}
    agent.get_tools = lambda: tools  # type: ignore[method-assign]
    return agent


def outputs(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in chunks if c["type"].startswith("tool-output")]


async def until(predicate: Any, timeout: float = 20.0) -> Any:
    """Wait for a condition (never for a time): fail if it does not come."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met")


async def test_a_lapsed_claim_goes_to_the_next_executor_and_the_turn_finishes_once(store):
    agent = rendering_agent(store, lease=0.2)
    collector = Collector()
    turn = asyncio.ensure_future(agent.chat("draw", collector))
    [first] = await agent.claim_tool_calls(["render"], "gpu-dead", wait=10)
    assert first["lease_until"] is not None and first["attempts"] == 1
    # gpu-dead never renews: the agent's alarm puts the call back when the lease is
    # over, and a claimant waiting meanwhile gets it.
    [second] = await agent.claim_tool_calls(["render"], "gpu-live", wait=30)
    assert (second["tool_call_id"], second["attempts"]) == ("call-1", 2)
    with pytest.raises(ClaimLostError):
        agent.renew_tool_call("call-1", "gpu-dead")
    assert agent.submit_tool_result("call-1", "gpu-live", "dusk.png") == "accepted"
    with pytest.raises(ClaimLostError):  # the old claimant's result is refused
        agent.submit_tool_result("call-1", "gpu-dead", "stale.png")
    assert (await asyncio.wait_for(turn, 30)).status == "completed"
    assert [(c["type"], c.get("output")) for c in outputs(collector.events)] == [
        ("tool-output-available", "dusk.png")
    ]
    call = agent.get_tool_call("call-1")
    assert (call["status"], call["executor"], call["result"]) == (
        "completed",
        "gpu-live",
        "dusk.png",
    )
    assert call["lease_until"] is None


async def test_the_worker_renews_its_claim_while_the_tool_runs(store):
    agent = rendering_agent(store, lease=0.2)
    release = asyncio.Event()
    seen: list[int] = []

    @tool(name="render")
    async def real_render(scene: str, ctx: ToolContext) -> str:
        """The worker's implementation."""
        seen.append(ctx.extras["attempts"])
        await release.wait()
        return f"{scene}.png"

    turn = asyncio.ensure_future(agent.chat("draw"))
    worker = ToolCallWorker(agent, [real_render])
    work = asyncio.ensure_future(worker.run_once(wait=10))
    await until(lambda: seen)
    first = agent.get_tool_call("call-1")["lease_until"]
    # Several leases' worth of renewals later the claim is still the worker's.
    await until(lambda: agent.get_tool_call("call-1")["lease_until"] > first + 0.6)
    call = agent.get_tool_call("call-1")
    assert (call["status"], call["executor"], call["attempts"]) == ("executing", worker.name, 1)
    release.set()
    assert await asyncio.wait_for(work, 30) == ["call-1"]
    assert (await asyncio.wait_for(turn, 30)).status == "completed"
    assert worker.outcomes == {"call-1": "accepted"} and seen == [1]
    assert agent.get_tool_call("call-1")["result"] == "dusk.png"


async def test_a_worker_that_lost_its_claim_stops_the_tool_and_reports_nothing(store):
    agent = rendering_agent(store, lease=0.3)
    stopped = asyncio.Event()

    @tool(name="render")
    async def stuck(scene: str, ctx: ToolContext) -> str:
        """Hangs until aborted."""
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()
        return "never"

    turn = asyncio.ensure_future(agent.chat("draw"))
    worker = ToolCallWorker(agent, [stuck])
    work = asyncio.ensure_future(worker.run_once(wait=10))
    await until(lambda: (agent.get_tool_call("call-1") or {}).get("executor") == worker.name)
    # Its claim lapses as if it had stopped beating (the sweep an alarm would run,
    # at a time past the lease), and another executor takes the call.
    lease = agent.get_tool_call("call-1")["lease_until"]
    agent.tool_calls.sweep(now=lease + 0.01)
    [taken] = await agent.claim_tool_calls(["render"], "other", wait=10)
    await asyncio.wait_for(stopped.wait(), 30)  # its next heartbeat aborted the tool
    assert await asyncio.wait_for(work, 30) == ["call-1"]
    assert worker.outcomes == {"call-1": "lost"}
    assert agent.get_tool_call("call-1")["executor"] == "other" and taken["attempts"] == 2
    agent.submit_tool_result("call-1", "other", "ok")
    assert (await asyncio.wait_for(turn, 30)).status == "completed"


async def test_every_external_call_has_a_deadline_by_default(store):
    assert ToolPolicy(executor="external").deadline == DEFAULT_EXTERNAL_TIMEOUT
    assert ToolPolicy(executor="external", timeout=float("inf")).deadline is None
    assert ToolPolicy().deadline is None and ToolPolicy(timeout=2).deadline == 2
    agent = rendering_agent(store)
    turn = asyncio.ensure_future(agent.chat("draw"))
    call = await until(lambda: agent.get_tool_call("call-1"))
    assert call["deadline_at"] == pytest.approx(
        call["created_at"] + DEFAULT_EXTERNAL_TIMEOUT, abs=5
    )
    # the agent's alarm is armed for it (a one-shot schedule of its sweep)
    alarms = [s for s in agent.list_schedules() if s.method == "sweep_tool_calls"]
    assert alarms and min(s.next_run_at for s in alarms) <= call["deadline_at"] + 0.01
    [claimed] = await agent.claim_tool_calls(["render"], "w", wait=10)
    agent.submit_tool_result("call-1", "w", "x")
    assert (await asyncio.wait_for(turn, 30)).status == "completed"


async def test_a_call_claimed_past_its_deadline_is_cancelled_and_the_turn_goes_on(store):
    agent = rendering_agent(store, timeout=0.3)
    collector = Collector()
    turn = asyncio.ensure_future(agent.chat("draw", collector))
    [claimed] = await agent.claim_tool_calls(["render"], "slowpoke", wait=10)
    result = await asyncio.wait_for(turn, 30)
    assert result.status == "completed"
    call = agent.get_tool_call("call-1")
    assert call["status"] == "cancelled-by-timeout" and "timed out" in call["error"]
    [out] = outputs(collector.events)
    assert out["type"] == "tool-output-error" and "timed out" in out["errorText"]
    with pytest.raises(ClaimLostError):
        agent.renew_tool_call(claimed["tool_call_id"], "slowpoke")
    # its result comes too late to resume anything
    assert agent.submit_tool_result("call-1", "slowpoke", "late") == "discarded-late"


async def test_the_alarm_sweeps_deadlines_even_when_no_turn_waits(tmp_path):
    """A call's turn is gone (its coroutine died) but its row is open: the agent's
    alarm still ends it at its deadline."""
    agent = rendering_agent(DuckDBSessionStore(tmp_path / "a.duckdb"), timeout=0.3)
    turn = asyncio.ensure_future(agent.chat("draw"))
    await until(lambda: agent.get_tool_call("call-1"))
    turn.cancel()  # the waiting coroutine is gone; the row stays open
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert agent.get_tool_call("call-1")["status"] == "pending"
    await until(lambda: agent.get_tool_call("call-1")["status"] == "cancelled-by-timeout")
    assert await agent.claim_tool_calls(["render"], "late-worker") == []
    agent.close()


async def test_an_answer_after_expires_at_is_refused_even_if_the_waiting_turn_died(tmp_path):
    """Item 14 without the process dying: the coroutine that timed the ask is gone
    (its task cancelled) and no alarm runs; the answer itself enforces ``expires_at``."""

    class Quick(Agent):
        approval_timeout = 0.3

    agent = Quick(DuckDBSessionStore(tmp_path / "a.duckdb"), model=script("ls"))
    turn = agent.start_chat("list")
    [ask] = await wait_pending(agent)
    assert turn.task is not None
    turn.task.cancel()  # the waiting coroutine dies with the row still awaiting
    with pytest.raises(asyncio.CancelledError):
        await turn.task
    await agent.durable.aclose()  # and no alarm runs
    assert agent.get_tool_call("call0")["status"] == "awaiting-approval"
    await until(lambda: time.time() > ask["expires_at"])
    with pytest.raises(ApprovalExpiredError):
        agent.answer_approval(ask["approval_id"], "once", answered_by="alice")
    call = agent.get_tool_call("call0")
    assert call["status"] == "cancelled-by-timeout" and CALLS == []
    assert [a.decision for a in agent.tool_calls.store.audit_rows("call0")] == ["timeout"]
    assert agent.pending_approvals() == []
    with pytest.raises(ApprovalExpiredError):  # and stays refused
        agent.answer_approval(ask["approval_id"], "once", answered_by="alice")
    agent.close()


async def test_a_lease_out_of_bounds_is_refused_and_claims_nothing(store):
    agent = rendering_agent(store)
    turn = asyncio.ensure_future(agent.chat("draw"))
    await until(lambda: agent.get_tool_call("call-1"))
    for bad in (0, -1, float("nan"), float("inf"), 10**9, True):
        with pytest.raises(InvalidInputError):
            await agent.claim_tool_calls(["render"], "w", 1, 0.0, bad)
    assert agent.get_tool_call("call-1")["status"] == "pending"
    [claimed] = await agent.claim_tool_calls(["render"], "w", 1, 0.0, 5.0)
    assert claimed["lease_until"] - claimed["updated_at"] == pytest.approx(5.0, abs=1.0)
    with pytest.raises(ToolCallStateError):
        agent.renew_tool_call("call-1", "not-the-holder")
    agent.submit_tool_result("call-1", "w", "done")
    assert (await asyncio.wait_for(turn, 30)).status == "completed"


async def test_an_approved_external_call_gets_its_deadline_and_an_executor_can_claim_it(store):
    """The ask writes the call's row before it runs: as the external call it is
    (claimable once approved), with the ask's expiry as its deadline until then."""
    render = render_tool()

    class Asking(Agent):
        permission_rules = ({"tool": "render", "action": "ask"},)
        approval_timeout = 60.0

        def get_tools(self) -> dict[str, Any]:
            return {"render": render}

    model = ScriptedModel([reply(tool_call("render", {"scene": "dusk"}, id="call-1")), reply("ok")])
    agent = Asking(store, model=model)
    turn = agent.start_chat("draw")
    [ask] = await wait_pending(agent)
    call = agent.get_tool_call("call-1")
    assert call["durable"] and call["deadline_at"] == ask["expires_at"]
    assert await agent.claim_tool_calls(["render"], "gpu") == []  # not before the answer
    agent.answer_approval(ask["approval_id"], "once", answered_by="alice")
    [claimed] = await agent.claim_tool_calls(["render"], "gpu", wait=10)
    assert claimed["deadline_at"] == pytest.approx(
        claimed["updated_at"] + DEFAULT_EXTERNAL_TIMEOUT, abs=5
    )
    agent.submit_tool_result("call-1", "gpu", "dusk.png")
    assert turn.task is not None
    assert (await asyncio.wait_for(turn.task, 30)).status == "completed"
    assert agent.get_tool_call("call-1")["result"] == "dusk.png"
