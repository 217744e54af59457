"""Persistent agents (seed 003 §2.1) in-process: the inbox loop, batching, memory,
idempotency, crash recovery, and use as a tool by another agent."""

from __future__ import annotations

import asyncio

import pytest
from thinkray.runtime.agents.persistent import (
    InboxMessageFailedError,
    PersistentAgent,
    history_text,
    inbox_notifier,
    persistent_agent_tool,
    persistent_agent_tools,
)
from thinkray.runtime.agents.think import Think
from thinkray.runtime.agents.worker import JobRegistry, WorkerAgent
from thinkray.runtime.models.base import ModelRequest
from thinkray.runtime.models.testing import (
    FunctionModel,
    ScriptedModel,
    fail,
    last_user_text,
    reply,
    tool_call,
)
from thinkray.storage.protocols import InboxStore

from tests.agents import ScriptedPersistentAgent


def user_texts(request: ModelRequest) -> list[str]:
    return [
        "".join(getattr(c, "text", "") for c in m.content)
        for m in request.messages
        if m.role == "user"
    ]


def batch_of(request: ModelRequest) -> list[str]:
    """The user messages after the last assistant message: what this cycle answers."""
    out: list[str] = []
    for m in reversed(request.messages):
        if m.role != "user":
            break
        out.insert(0, "".join(getattr(c, "text", "") for c in m.content))
    return out


async def drain(agent: PersistentAgent, timeout: float = 5.0) -> None:
    async def idle() -> None:
        while agent.has_pending_work():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(idle(), timeout)


@pytest.fixture
def path(tmp_path):
    return tmp_path / "agent.duckdb"


async def test_send_then_reply(path):
    model = FunctionModel(lambda req, i: f"re: {last_user_text(req)}")
    agent = PersistentAgent(path, model=model, name="p", instructions="Be brief.")
    mid = await agent.send("hello", sender="alice")
    assert agent.has_pending_work()
    assert await agent.wait_reply(mid, timeout=5) == "re: hello"
    await drain(agent)
    assert not agent.has_pending_work()
    assert model.requests[0].system == "Be brief."
    row = agent.get_reply(mid)
    assert row["status"] == "done" and row["reply"] == "re: hello" and row["sender"] == "alice"
    [user, assistant] = agent.get_history()
    assert user["id"] == mid and user["metadata"]["sender"] == "alice"
    assert assistant["role"] == "assistant"
    await agent.dispose()


async def test_message_arriving_mid_generation_is_picked_up_without_going_idle(path):
    seen_idle: list[int] = []
    agent: PersistentAgent

    async def step(req: ModelRequest, i: int):
        seen_idle.append(agent.idle_transitions)
        if i == 0:
            await agent.send("second", sender="bob")  # lands while generating
            await asyncio.sleep(0.02)
        return reply(f"answer {i}: {batch_of(req)}")

    agent = PersistentAgent(path, model=FunctionModel(step))
    first = await agent.send("first")
    assert await agent.wait_reply(first, 5) == "answer 0: ['first']"
    await drain(agent)
    assert agent.cycles == 2
    assert seen_idle == [0, 0]  # the second cycle ran before the loop ever went idle
    assert agent.idle_transitions == 1
    second = agent.list_inbox("done")[-1]
    assert second["content"] == "second" and second["reply"].startswith("answer 1:")
    await agent.dispose()


async def test_history_accumulates_across_cycles(path):
    model = FunctionModel(lambda req, i: f"reply {i}")
    agent = PersistentAgent(path, model=model)
    for text in ("one", "two", "three"):
        await agent.wait_reply(await agent.send(text), 5)
    assert user_texts(model.requests[-1]) == ["one", "two", "three"]
    assistants = [m for m in model.requests[-1].messages if m.role == "assistant"]
    assert len(assistants) == 2
    assert [r for r, _ in history_text(agent)] == ["user", "assistant"] * 3
    await agent.dispose()
    # persistent memory: a new instance on the file remembers
    again = PersistentAgent(path, model=model)
    await again.wait_reply(await again.send("four"), 5)
    assert user_texts(model.requests[-1]) == ["one", "two", "three", "four"]
    await again.dispose()


async def test_pending_rows_are_batched_into_one_cycle(path):
    gate = asyncio.Event()

    async def step(req: ModelRequest, i: int):
        if i == 0:
            await gate.wait()
        return reply(f"cycle {i} saw {batch_of(req)}")

    model = FunctionModel(step)
    agent = PersistentAgent(path, model=model)
    first = await agent.send("a")
    await asyncio.sleep(0.02)  # the first cycle is generating
    rest = [await agent.send(t) for t in ("b", "c", "d")]
    gate.set()
    assert await agent.wait_reply(first, 5) == "cycle 0 saw ['a']"
    replies = [await agent.wait_reply(m, 5) for m in rest]
    assert replies == ["cycle 1 saw ['b', 'c', 'd']"] * 3
    assert len(model.requests) == 2 and agent.cycles == 2
    await agent.dispose()


async def test_max_batch_one_processes_sequentially(path):
    class OneByOne(PersistentAgent):
        max_batch = 1

    model = FunctionModel(lambda req, i: f"{batch_of(req)}")
    agent = OneByOne(path, model=model)
    ids = [await agent.send(t) for t in ("x", "y")]
    assert [await agent.wait_reply(m, 5) for m in ids] == ["['x']", "['y']"]
    assert agent.cycles == 2
    await agent.dispose()


async def test_message_id_is_idempotent(path):
    model = FunctionModel(lambda req, i: "ok")
    agent = PersistentAgent(path, model=model)
    assert await agent.send("hi", message_id="m-1") == "m-1"
    assert await agent.send("hi again", message_id="m-1") == "m-1"
    await agent.wait_reply("m-1", 5)
    await drain(agent)
    assert await agent.send("late duplicate", message_id="m-1") == "m-1"
    await drain(agent)
    assert len(model.requests) == 1
    assert [r["content"] for r in agent.list_inbox()] == ["hi"]
    assert len(agent.get_history()) == 2
    await agent.dispose()


async def test_bad_input_is_refused_before_writing(path):
    agent = PersistentAgent(path, model=ScriptedModel())
    with pytest.raises(ValueError, match="empty"):
        await agent.send("  ")
    with pytest.raises(ValueError):
        await agent.send({"id": "x", "role": "user", "parts": [{"type": "nope"}]})
    with pytest.raises(ValueError):
        await agent.send("hi", message_id="")
    assert agent.list_inbox() == []
    with pytest.raises(KeyError):
        await agent.wait_reply("unknown", 1)
    await agent.dispose()


async def test_failed_generation_marks_the_row_failed(path):
    agent = PersistentAgent(path, model=ScriptedModel([reply(fail("model down"))]))
    mid = await agent.send("hi")
    with pytest.raises(InboxMessageFailedError, match="model down"):
        await agent.wait_reply(mid, 5)
    await drain(agent)
    assert agent.get_reply(mid)["status"] == "failed"
    await agent.dispose()


async def test_wait_reply_timeout(path):
    gate = asyncio.Event()

    async def step(req, i):
        await gate.wait()
        return reply("late")

    agent = PersistentAgent(path, model=FunctionModel(step))
    mid = await agent.send("hi")
    with pytest.raises(TimeoutError):
        await agent.wait_reply(mid, timeout=0.05)
    gate.set()
    assert await agent.wait_reply(mid, 5) == "late"
    await agent.dispose()


async def test_user_hooks_pending_work_build_context_write_output(path):
    class Custom(PersistentAgent):
        contexts: list[int] = []

        def pending_work(self):
            # only messages from humans trigger generation
            return [r for r in self.inbox.pending() if r.sender != "bot"]

        async def build_context(self, rows, options):
            context = await super().build_context(rows, options)
            self.contexts.append(len(rows))
            return context[-1:]  # a one-message window

        async def write_output(self, rows, result):
            self.inbox.complete([r.id for r in rows], result.text.upper())

    model = FunctionModel(lambda req, i: f"seen {len(req.messages)}")
    agent = Custom(path, model=model)
    ignored = await agent.send("noise", sender="bot")
    mid = await agent.send("hello", sender="human")
    assert await agent.wait_reply(mid, 5) == "SEEN 1"
    await drain(agent)
    assert agent.get_reply(ignored)["status"] == "pending"
    assert agent.contexts == [1]
    await agent.dispose()


async def test_crash_recovery_rows_left_processing_are_reprocessed(path):
    started = asyncio.Event()

    async def hang(req, i):
        started.set()
        await asyncio.sleep(60)
        return reply("never")

    crashed = PersistentAgent(path, model=FunctionModel(hang))
    mid = await crashed.send("survive me", sender="alice")
    await asyncio.wait_for(started.wait(), 5)
    assert crashed.get_reply(mid)["status"] == "processing"
    # Simulate the process dying: stop the tasks and close the file, no clean shutdown.
    loop_task = crashed._loop_task
    loop_task.cancel()
    await asyncio.gather(loop_task, return_exceptions=True)
    crashed._closing = True
    crashed.store.close()
    assert InboxStore  # the row is still `processing` in the file
    model = FunctionModel(lambda req, i: f"recovered: {batch_of(req)}")
    woken = PersistentAgent(path, model=model)
    assert woken.recovered == 1
    await woken.on_wake()  # what the actor does right after binding
    assert await woken.wait_reply(mid, 5) == "recovered: ['survive me']"
    # the user message was appended once, before the crash
    texts = [t for r, t in history_text(woken) if r == "user"]
    assert texts == ["survive me"]
    await woken.dispose()


async def test_crash_loop_gives_up_after_max_attempts(path):
    db_agent = PersistentAgent(path, model=ScriptedModel())
    row, _ = db_agent.inbox.insert("poison", message_id="p")
    for _ in range(PersistentAgent.max_attempts):
        db_agent.inbox.claim(["p"])
        db_agent.inbox.requeue_processing()
    db_agent.inbox.claim(["p"])
    db_agent.close()
    again = PersistentAgent(path, model=ScriptedModel())
    assert again.gave_up == 1
    with pytest.raises(InboxMessageFailedError, match="gave up"):
        await again.wait_reply("p", 1)
    await again.dispose()


async def test_hibernation_close_requeues_the_interrupted_batch(path):
    started = asyncio.Event()

    async def hang(req, i):
        started.set()
        await asyncio.sleep(60)
        return reply("never")

    agent = PersistentAgent(path, model=FunctionModel(hang))
    mid = await agent.send("keep me")
    await asyncio.wait_for(started.wait(), 5)
    await agent.aclose()  # what the actor runs on (forced) hibernation
    agent.close()
    woken = PersistentAgent(path, model=FunctionModel(lambda r, i: "back"))
    assert woken.get_reply(mid)["status"] == "pending"
    await woken.on_wake()
    assert await woken.wait_reply(mid, 5) == "back"
    await woken.dispose()


# -- as a tool for other agents -----------------------------------------------------------


async def test_blocking_tool_for_another_think(tmp_path):
    helper = ScriptedPersistentAgent(tmp_path / "helper.duckdb", name="helper")
    caller_model = ScriptedModel(
        [reply(tool_call("ask_helper", {"message": "status?"}, id="t1")), "thanks"]
    )
    caller = Think(tmp_path / "caller.duckdb", model=caller_model)
    tool = persistent_agent_tool(helper, name="ask_helper", description="Ask the helper.")
    result = await caller.chat("check with helper", tools={"ask_helper": tool})
    assert result.text == "thanks"
    [out] = [c for m in caller_model.requests[1].messages if m.role == "tool" for c in m.content]
    assert out.output == "helper got: status? (message 1)"
    [row] = helper.list_inbox()
    assert row["id"] == "tc-t1" and row["status"] == "done"
    await helper.dispose()
    caller.close()


async def test_fire_and_forget_tool_and_reply_reader(tmp_path):
    helper = ScriptedPersistentAgent(tmp_path / "helper.duckdb", name="helper")

    def step(req: ModelRequest, i: int):
        results = [c for m in req.messages if m.role == "tool" for c in m.content]
        if i == 0:
            return reply(tool_call("tell_helper", {"message": "do the thing"}))
        if i == 1:
            sent = results[-1].output
            assert sent["status"] == "sent"
            return reply(
                tool_call(
                    "tell_helper_reply", {"message_id": sent["message_id"], "wait_seconds": 5}
                )
            )
        return reply(f"helper said: {results[-1].output['reply']}")

    caller = Think(tmp_path / "caller.duckdb", model=FunctionModel(step))
    tools = persistent_agent_tools(helper, name="tell_helper", description="Tell.", wait=False)
    assert set(tools) == {"tell_helper", "tell_helper_reply"}
    result = await caller.chat("delegate", tools=tools)
    assert result.text == "helper said: helper got: do the thing (message 1)"
    await helper.dispose()
    caller.close()


async def test_persistent_agent_delegates_to_another_persistent_agent(tmp_path):
    helper = ScriptedPersistentAgent(tmp_path / "helper.duckdb", name="helper")
    boss = ScriptedPersistentAgent(tmp_path / "boss.duckdb", name="boss", peers={"helper": helper})
    mid = await boss.send("ask helper: plan the trip")
    assert await boss.wait_reply(mid, 5) == "helper replied: helper got: plan the trip (message 1)"
    assert helper.list_inbox()[0]["sender"] == "boss"
    await boss.dispose()
    await helper.dispose()


async def test_finished_job_is_pushed_into_the_inbox(tmp_path):
    """Seed 003 §1.5 push: an async worker's result lands in the conversation as a
    message and triggers the agent's loop."""
    agent = ScriptedPersistentAgent(tmp_path / "a.duckdb", name="a")
    worker = WorkerAgent("w", instructions="W.", model=FunctionModel(lambda r, i: "42"))
    registry = JobRegistry()
    registry.subscribe(inbox_notifier(agent))

    async def work(signal):
        return await worker.run("compute", signal=signal)

    registry.start(work, job_id="j1")
    await registry.wait("j1", 5)
    reply_text = await agent.wait_reply("job-done-j1", 5)
    assert reply_text == "a got: [job j1 completed] result: 42 (message 1)"
    await agent.dispose()


async def test_running_async_jobs_keep_the_agent_awake(path):
    gate = asyncio.Event()

    async def slow(req, i):
        await gate.wait()
        return reply("job output")

    worker = WorkerAgent("research", instructions="R.", model=FunctionModel(slow))

    def step(req: ModelRequest, i: int):
        if i == 0:
            return reply(tool_call("research", {"input": "x"}, id="r1"))
        return reply("started it")

    agent = PersistentAgent(path, model=FunctionModel(step), tools=worker.job_tools())
    mid = await agent.send("research x")
    assert await agent.wait_reply(mid, 5) == "started it"
    await asyncio.sleep(0.02)
    assert not agent.loop_running and agent.has_pending_work()  # the job still runs
    gate.set()
    await drain(agent)
    assert JobRegistry.for_agent(agent).get("job-r1").result == "job output"
    await agent.dispose()
