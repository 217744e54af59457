"""Durable tool calls (issue 12, items 1 and 3): every call is a row written before it
runs; executors claim calls by compare-and-set; results, timeouts, aborts and late
results move the row as seed 003 §1 says. In process, on the shipped test models."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from thinkray.runtime import Think, tool
from thinkray.runtime.abort import AbortController
from thinkray.runtime.errors import ToolCallStateError, UnknownToolCallError
from thinkray.runtime.models.testing import ScriptedModel, reply, tool_call
from thinkray.runtime.tools.base import ToolContext, ToolPolicy
from thinkray.storage.errors import InvalidInputError
from thinkray.storage.records import ToolCallRecord

from tests.conftest import Collector

executions: list[str] = []


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    executions.append("add")
    return a + b


@tool
async def broken() -> int:
    """Always fails."""
    raise RuntimeError("no luck")


@tool(policy=ToolPolicy(timeout=0.05))
async def slow(seconds: float) -> str:
    """Sleeps."""
    await asyncio.sleep(seconds)
    return "woke"


@tool(policy=ToolPolicy(executor="external"))
async def render(scene: str) -> str:
    """Rendered by an external worker pool."""
    raise AssertionError("an external tool never runs in the agent")


@tool(policy=ToolPolicy(executor="local"))
async def crunch(n: int, ctx: Any) -> dict[str, Any]:
    """Run by the agent's local executor, decoupled from the turn."""
    return {"n": n * 2, "call": ctx.tool_call_id}


TOOLS = {t.name: t for t in (add, broken, slow, render, crunch)}


def agent_calling(
    store: Any, name: str, args: dict[str, Any], call_id: str = "call-1", **kw: Any
) -> Think:
    model = ScriptedModel([reply(tool_call(name, args, id=call_id)), reply("done")])
    agent = Think(store, model=model)
    agent.get_tools = lambda: TOOLS  # type: ignore[method-assign]
    for key, value in kw.items():
        setattr(agent, key, value)
    return agent


def outputs(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in chunks if c["type"].startswith("tool-output")]


async def test_an_inline_call_is_recorded_before_it_runs_and_completed_after(store):
    executions.clear()
    agent = agent_calling(store, "add", {"a": 2, "b": 3})
    seen: list[str] = []
    original = agent.tool_calls.store.insert

    def spy(rec: ToolCallRecord) -> ToolCallRecord:
        seen.append(f"{rec.status} before {len(executions)} executions")
        return original(rec)

    agent.tool_calls.store.insert = spy  # type: ignore[method-assign]
    collector = Collector()
    result = await agent.chat("add", collector)
    assert result.status == "completed"
    assert seen == ["pending before 0 executions"]  # written when the model made the call
    call = agent.get_tool_call("call-1")
    assert call["status"] == "completed" and call["result"] == 5
    assert call["input"] == {"a": 2, "b": 3} and call["attempts"] == 1
    assert call["run_id"] == result.run_id and call["session_id"] == result.session_id
    assert call["executor"].startswith("inline-")


async def test_a_failing_tool_is_failed_and_a_slow_one_cancelled_by_timeout(store):
    agent = agent_calling(store, "broken", {})
    collector = Collector()
    await agent.chat("go", collector)
    call = agent.get_tool_call("call-1")
    assert call["status"] == "failed" and "no luck" in call["error"]
    assert outputs(collector.events)[0]["type"] == "tool-output-error"

    agent = agent_calling(store, "slow", {"seconds": 5}, call_id="call-2")
    collector = Collector()
    await agent.chat("go", collector)
    call = agent.get_tool_call("call-2")
    assert call["status"] == "cancelled-by-timeout"
    assert "timed out" in outputs(collector.events)[0]["errorText"]


async def test_aborting_the_turn_cancels_its_calls_by_user(store):
    agent = agent_calling(store, "slow", {"seconds": 5})
    agent.get_tools = lambda: {"slow": tool(policy=ToolPolicy())(slow.fn)}  # no timeout
    controller = AbortController()
    task = asyncio.ensure_future(agent.chat("go", signal=controller.signal))
    while agent.get_tool_call("call-1") is None:
        await asyncio.sleep(0.01)
    controller.abort("stop")
    result = await task
    assert result.status == "aborted"
    assert agent.get_tool_call("call-1")["status"] == "cancelled-by-user"


async def external_worker(agent: Think, executor: str, answer: Any) -> dict[str, Any]:
    claimed = await agent.claim_tool_calls(["render"], executor, wait=5)
    assert len(claimed) == 1
    assert agent.submit_tool_result(claimed[0]["tool_call_id"], executor, answer) == "accepted"
    return claimed[0]


async def test_an_external_executor_claims_the_call_and_the_turn_goes_on_with_its_result(store):
    agent = agent_calling(store, "render", {"scene": "sunset"})
    collector = Collector()
    turn = asyncio.ensure_future(agent.chat("draw", collector))
    claimed = await external_worker(agent, "gpu-1", "an image")
    result = await asyncio.wait_for(turn, 10)
    assert result.status == "completed"
    assert claimed["input"] == {"scene": "sunset"} and claimed["durable"]
    out = outputs(collector.events)
    assert [(c["type"], c["output"]) for c in out] == [("tool-output-available", "an image")]
    call = agent.get_tool_call("call-1")
    assert (call["status"], call["executor"], call["result"]) == ("completed", "gpu-1", "an image")


async def test_racing_executors_get_a_call_once_and_bad_results_are_refused(store):
    agent = agent_calling(store, "render", {"scene": "x"})
    turn = asyncio.ensure_future(agent.chat("draw"))
    while agent.get_tool_call("call-1") is None:
        await asyncio.sleep(0.01)
    got = await asyncio.gather(
        *(agent.claim_tool_calls(["render"], f"worker-{i}", wait=0) for i in range(5))
    )
    winners = [i for i, claimed in enumerate(got) if claimed]
    assert len(winners) == 1
    winner = f"worker-{winners[0]}"
    with pytest.raises(ToolCallStateError, match="held by"):
        agent.submit_tool_result("call-1", "worker-other", "stolen")
    with pytest.raises(UnknownToolCallError):
        agent.submit_tool_result("no-such-call", winner, "x")
    with pytest.raises(InvalidInputError):
        agent.submit_tool_result("call-1", winner, object())  # not storable
    assert agent.get_tool_call("call-1")["status"] == "executing"  # nothing changed
    assert agent.submit_tool_result("call-1", winner, "ok") == "accepted"
    with pytest.raises(ToolCallStateError, match="completed"):
        agent.submit_tool_result("call-1", winner, "again")
    assert (await turn).status == "completed"
    assert agent.get_tool_call("call-1")["result"] == "ok"


@pytest.mark.parametrize("policy", ["discard", "store"])
async def test_a_late_result_never_resumes_a_cancelled_call(store, policy):
    agent = agent_calling(store, "render", {"scene": "x"}, late_tool_results=policy)
    agent.tool_calls.late_results = policy
    controller = AbortController()
    turn = asyncio.ensure_future(agent.chat("draw", signal=controller.signal))
    claimed = await agent.claim_tool_calls(["render"], "gpu", wait=5)
    controller.abort("user stopped")
    assert (await turn).status == "aborted"
    answer = agent.submit_tool_result(claimed[0]["tool_call_id"], "gpu", "too late")
    call = agent.get_tool_call("call-1")
    assert call["status"] == "cancelled-by-user" and call["result"] is None
    if policy == "store":
        assert answer == "stored-late" and call["late_result"] == "too late"
        assert call["late_at"] is not None
    else:
        assert answer == "discarded-late" and call["late_result"] is None


async def test_the_local_executor_runs_the_call_decoupled_from_the_turn(store):
    agent = agent_calling(store, "crunch", {"n": 21})
    collector = Collector()
    assert (await agent.chat("go", collector)).status == "completed"
    call = agent.get_tool_call("call-1")
    assert call["status"] == "completed" and call["durable"]
    assert call["executor"].startswith("local-") and call["result"] == {"n": 42, "call": "call-1"}
    assert outputs(collector.events)[0]["output"] == {"n": 42, "call": "call-1"}


async def test_a_finished_call_is_never_executed_again(store):
    executions.clear()
    agent = agent_calling(store, "add", {"a": 1, "b": 1})
    first = await agent.chat("one")
    assert executions == ["add"]
    # The same call of the same run again (a turn re-run after recovery): the stored
    # result, not a second execution.
    add_tool = TOOLS["add"]
    ctx = ToolContext("call-1", "add", AbortController().signal, run_id=first.run_id)
    assert await agent.tool_calls.execute(add_tool, add_tool.validate({"a": 1, "b": 1}), ctx) == 2
    assert executions == ["add"]
    # A scripted model repeating its call id in a new run: a new call, its own row.
    again = agent_calling(store, "add", {"a": 2, "b": 2})
    second = await again.chat("two")
    assert executions == ["add", "add"]
    assert again.get_tool_call(f"call-1~{second.run_id}")["result"] == 4


def test_calls_found_executing_on_wake_fail_or_go_back_to_pending(tmp_path):
    from thinkray.storage.session_store import DuckDBSessionStore

    path = tmp_path / "agent.duckdb"
    store = DuckDBSessionStore(path)
    calls = store.stores().tool_calls()
    for call_id, name in (("c-add", "add"), ("c-retry", "idem"), ("c-ext", "render")):
        calls.insert(
            ToolCallRecord(
                id=call_id,
                tool_name=name,
                status="executing",
                executor="inline-dead" if name != "render" else "gpu-7",
                durable=name == "render",
                attempts=1,
            )
        )
    store.close()

    @tool(policy=ToolPolicy(on_crash="retry"))
    def idem() -> str:
        """Safe to run twice."""
        return "same"

    class Woken(Think):
        def get_tools(self) -> dict[str, Any]:
            return {**TOOLS, "idem": idem}

    agent = Woken(DuckDBSessionStore(path))
    assert agent.recovered_tool_calls == {"retried": 1, "failed": 1, "expired": 0, "lapsed": 0}
    assert agent.get_tool_call("c-add")["status"] == "failed"
    assert "died" in agent.get_tool_call("c-add")["error"]
    assert agent.get_tool_call("c-retry")["status"] == "pending"
    ext = agent.get_tool_call("c-ext")
    assert ext["status"] == "executing"  # its executor lives on, until its lease lapses
    # written before leases and deadlines: recovery gave it both, from the tool's policy
    assert ext["lease_until"] is not None and ext["deadline_at"] is not None
    assert agent.submit_tool_result("c-ext", "gpu-7", "late but fine") == "accepted"
    agent.store.close()


async def test_a_tools_own_timeout_error_is_a_failure_not_a_policy_timeout(store):
    @tool
    async def flaky() -> str:
        """Raises a TimeoutError of its own."""
        raise TimeoutError("upstream took too long")

    agent = agent_calling(store, "flaky", {})
    agent.get_tools = lambda: {"flaky": flaky}  # type: ignore[method-assign]
    collector = Collector()
    await agent.chat("go", collector)
    call = agent.get_tool_call("call-1")
    assert call["status"] == "failed" and "upstream took too long" in call["error"]
    assert outputs(collector.events)[0]["errorText"] == "TimeoutError: upstream took too long"
