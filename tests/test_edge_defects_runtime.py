"""Defects of issue 26 in the runtime (no Ray), each as the scenario a user hits.

Timing-dependent ones are made deterministic: the recorder's flush timer is fired by
hand at the bad moment, an event holds a coroutine where the race needs it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from thinkray.runtime import Think, tool
from thinkray.runtime.models.testing import (
    FunctionModel,
    ScriptedModel,
    fail,
    pause,
    reply,
    tool_call,
)
from thinkray.runtime.tools.base import ToolPolicy
from thinkray.runtime.turn.recorder import Recorder

from tests.conftest import Collector

# -- item 2: a completed turn stays completed, whatever the flush timing ---------------


class CountingAgent(Think):
    """Answers every turn with one text; counts the model's calls."""

    recover_generations = "resume"
    calls: list[int] = []

    def get_model(self) -> Any:
        def step(request: Any, n: int) -> Any:
            CountingAgent.calls.append(n)
            return reply("the answer")

        return FunctionModel(step, model_id="counting")


@pytest.fixture
def timer_after_finish(monkeypatch):
    """The recorder's 30 ms flush timer fires right after the ``finish`` chunk was
    recorded and before the turn's final commit (what a slow ``message_metadata`` hook
    or a descheduled process does by chance)."""
    original = Recorder.record

    def record(self: Recorder, chunk: Any) -> None:
        original(self, chunk)
        if chunk["type"] == "finish":
            self._on_timer()

    monkeypatch.setattr(Recorder, "record", record)


async def test_a_turn_flushed_early_is_not_interrupted_nor_answered_again_at_wake(
    tmp_path, timer_after_finish
):
    path = tmp_path / "agent.duckdb"
    CountingAgent.calls = []
    agent = CountingAgent(path)
    result = await agent.chat("question")
    assert result.status == "completed"
    agent.close()

    woken = CountingAgent(path)  # the next wake: the constructor path
    await woken.on_wake()
    await asyncio.gather(*woken._resumes)
    assert woken.recovered_runs == []
    [_, answer] = woken.get_history()
    assert answer["metadata"]["status"] == "completed"
    replay = [c async for c in woken.resume(run_id=result.run_id)]
    assert replay[-1]["type"] == "finish"
    assert not any(c["type"] == "error" for c in replay)
    assert CountingAgent.calls == [0]  # the model was asked once
    woken.close()


# -- item 8: hibernating right after schedule() -----------------------------------------


class Scheduling(Think):
    def ping(self, payload: Any) -> None:
        """A scheduled method."""


async def test_hibernating_right_after_schedule_returns(tmp_path):
    agent = Scheduling(tmp_path / "agent.duckdb", model=ScriptedModel())
    await agent.on_wake()
    scheduler = agent.durable.schedules()
    waiting = asyncio.Event()
    scheduler.on_next_due = lambda at: waiting.set()  # told right before the timer waits
    agent.schedule(60, "ping")
    await waiting.wait()  # the timer now waits, with a timeout, for its next due time
    agent.schedule(120, "ping")  # wakes it...
    # ...and, with no pause, the close cancels the timer just as its wait finished.
    await asyncio.wait_for(agent.aclose(), 30)
    assert not scheduler.running
    agent.close()


# -- item 7: a local executor's failure ends its call; the turn goes on ----------------


@tool(policy=ToolPolicy(executor="local"))
async def crunch(n: int) -> int:
    """Run by the agent's local executor."""
    return n * 2


@tool(policy=ToolPolicy(executor="local"))
async def fetch(url: str) -> str:
    """A local tool whose library's task is cancelled under it."""
    inner = asyncio.ensure_future(asyncio.sleep(3600))
    inner.cancel()
    return await inner  # type: ignore[return-value]


def calling(store: Any, name: str, args: dict[str, Any]) -> Think:
    model = ScriptedModel([reply(tool_call(name, args, id="call-1")), reply("done")])
    agent = Think(store, model=model)
    agent.get_tools = lambda: {crunch.name: crunch, fetch.name: fetch}  # type: ignore[method-assign]
    return agent


async def test_a_failing_result_write_back_cancels_the_call_by_error(store):
    agent = calling(store, "crunch", {"n": 2})
    submit = agent.tool_calls.submit

    def write_back(call_id: str, executor: str, **outcome: Any) -> str:
        if executor.startswith("local-"):
            raise RuntimeError("result sink unavailable")
        return submit(call_id, executor, **outcome)

    agent.tool_calls.submit = write_back  # type: ignore[method-assign]
    collector = Collector()
    result = await asyncio.wait_for(agent.chat("crunch", collector), 30)
    assert result.status == "completed" and result.text == "done"
    call = agent.get_tool_call("call-1")
    assert call["status"] == "cancelled-by-error"
    assert "result sink unavailable" in call["error"]
    [out] = [c for c in collector.events if c["type"].startswith("tool-output")]
    assert out["type"] == "tool-output-error" and "result sink unavailable" in out["errorText"]


async def test_a_local_tool_cancelled_from_inside_fails_its_call(store):
    agent = calling(store, "fetch", {"url": "x"})
    result = await asyncio.wait_for(agent.chat("fetch"), 30)
    assert result.status == "completed"
    call = agent.get_tool_call("call-1")
    assert call["status"] == "failed" and "CancelledError" in call["error"]


# -- item 4: a tool call reaches a consumer only once it is stored ---------------------


@tool
async def lookup(q: str) -> str:
    """An inline tool."""
    return f"found {q}"


async def test_a_consumer_sees_a_tool_call_only_after_its_rows_are_written(store):
    # The model produces a call, then keeps streaming for long (as a model does with
    # parallel calls): the turn has not started executing it yet.
    model = ScriptedModel([reply(tool_call("lookup", {"q": "x"}, id="call-1"), pause(3600))])
    agent = Think(store, model=model)
    agent.flush_interval = 3600.0  # no timer flush: only what the turn writes on purpose
    agent.get_tools = lambda: {"lookup": lookup}  # type: ignore[method-assign]
    seen: dict[str, Any] = {}
    shown = asyncio.Event()

    class Client(Collector):
        def on_event(self, chunk: dict) -> None:
            super().on_event(chunk)
            if chunk["type"] == "tool-input-available":
                # What a crash right now would leave behind:
                [_, message] = agent.get_history()
                seen["part"] = message["parts"][-1]
                seen["row"] = agent.get_tool_call("call-1")
                shown.set()

    turn = asyncio.ensure_future(agent.chat("look", Client()))
    await asyncio.wait_for(shown.wait(), 30)
    assert seen["part"]["toolCallId"] == "call-1"
    assert seen["part"]["state"] == "input-available" and seen["part"]["input"] == {"q": "x"}
    # An agent without a permission check writes an inline call's row already claimed
    # (one write instead of insert-then-claim: the turn's write path), durable before
    # any client sees the call.
    assert seen["row"] is not None and seen["row"]["status"] == "executing"
    assert seen["row"]["attempts"] == 1
    assert seen["row"]["input"] == {"q": "x"}
    agent.abort()
    assert (await turn).status == "aborted"
    assert agent.get_tool_call("call-1")["status"] == "cancelled-by-user"


async def test_a_call_refused_by_permission_is_denied_in_the_ledger(store):
    agent = Think(
        store, model=ScriptedModel([reply(tool_call("lookup", {"q": "x"}, id="c")), "ok"])
    )
    agent.get_tools = lambda: {"lookup": lookup}  # type: ignore[method-assign]

    async def refuse(name: str, value: Any, call_id: str, options: Any = None) -> str:
        return "permission denied: not today"

    agent.check_tool_permission = refuse  # type: ignore[method-assign]
    assert (await agent.chat("look")).status == "completed"
    call = agent.get_tool_call("c")
    assert call["status"] == "denied" and "not today" in call["error"]


# -- item 5: a resumed generation continues its reply -----------------------------------


class Resumer(Think):
    """Starts answering, then stalls; asked again (its partial reply in the history),
    it finishes."""

    recover_generations = "resume"

    def get_model(self) -> Any:
        def step(request: Any, n: int) -> Any:
            if any(m.role == "assistant" for m in request.messages):
                return reply("the rest")
            return reply("partial ", pause(3600))

        return FunctionModel(step, model_id="resumer")


async def test_a_resumed_generation_leaves_one_reply_to_the_user_message(tmp_path):
    path = tmp_path / "agent.duckdb"
    agent = Resumer(path)
    started = asyncio.Event()

    class Client(Collector):
        def on_event(self, chunk: dict) -> None:
            if chunk["type"] == "text-delta":
                started.set()

    turn = asyncio.ensure_future(agent.chat("question", Client()))
    await asyncio.wait_for(started.wait(), 30)
    agent.close()  # a forced hibernation under the run
    with pytest.raises(asyncio.CancelledError):
        await turn

    woken = Resumer(path)
    await woken.on_wake()
    await asyncio.gather(*woken._resumes)
    for run in list(woken.turns.runs.values()):
        assert run.task is not None
        await asyncio.wait_for(run.task, 30)
    [user, answer] = woken.get_history()
    assert user["role"] == "user" and answer["role"] == "assistant"
    text = "".join(p.get("text", "") for p in answer["parts"] if p["type"] == "text")
    assert text == "partial the rest"
    assert answer["metadata"]["status"] == "completed" and answer["metadata"]["resumed"]
    woken.close()


async def test_a_turn_that_fails_after_the_model_made_a_call_cancels_it_by_error(store):
    # Seed 003's cascading cancellation, through the public API: the model produced a
    # call, then its stream broke; the call never ran and says why.
    model = ScriptedModel([reply(tool_call("crunch", {"n": 1}, id="call-1"), fail("overloaded"))])
    agent = Think(store, model=model)
    agent.get_tools = lambda: {crunch.name: crunch}  # type: ignore[method-assign]
    result = await asyncio.wait_for(agent.chat("crunch"), 30)
    assert result.status == "error"
    call = agent.get_tool_call("call-1")
    assert call["status"] == "cancelled-by-error" and "overloaded" in call["error"]
