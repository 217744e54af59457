"""Worker agents (seed 003 §2.2) and async tool jobs (§1.5), without Ray."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field
from thinkray.runtime.abort import AbortController, AbortError
from thinkray.runtime.agents.think import Think
from thinkray.runtime.agents.worker import (
    FINAL_RESULT_TOOL,
    JobRegistry,
    WorkerAgent,
    WorkerInputError,
    WorkerOutputError,
    WorkerTimeoutError,
    check_job_tool,
)
from thinkray.runtime.models.base import ModelRequest
from thinkray.runtime.models.testing import (
    FunctionModel,
    ScriptedModel,
    last_user_text,
    pause,
    reply,
    tool_call,
)
from thinkray.runtime.tools.base import tool
from thinkray.storage.session_store import DuckDBSessionStore
from thinkray.storage.stores import open_stores


class Verdict(BaseModel):
    claim: str
    verdict: Literal["true", "false", "unclear"]
    confidence: float = Field(ge=0, le=1)


class Article(BaseModel):
    text: str = Field(min_length=1)
    max_words: int = Field(gt=0)


class Summary(BaseModel):
    summary: str
    words: int


def request_text(request: ModelRequest) -> str:
    return json.dumps(request.model_dump(mode="json"))


def tool_results(request: ModelRequest) -> list:
    return [c for m in request.messages if m.role == "tool" for c in m.content]


# -- fresh context ------------------------------------------------------------------------


async def test_each_call_has_a_fresh_context():
    model = FunctionModel(lambda req, step: f"echo: {last_user_text(req)}")
    worker = WorkerAgent("echo", instructions="Echo the input.", model=model)
    assert await worker.run("first secret") == "echo: first secret"
    assert await worker.run("second") == "echo: second"
    second = model.requests[1]
    assert second.system == "Echo the input."
    assert [m.role for m in second.messages] == ["user"]
    assert "first secret" not in request_text(second)
    assert "echo:" not in request_text(second)


async def test_build_messages_controls_the_prompt():
    model = FunctionModel(lambda req, step: "ok")
    worker = WorkerAgent(
        "summarize",
        instructions="Summarize.",
        model=model,
        input_type=Article,
        build_messages=lambda a: f"Summarize in {a.max_words} words:\n{a.text}",
    )
    assert await worker.run({"text": "Long text.", "max_words": 3}) == "ok"
    assert last_user_text(model.requests[0]) == "Summarize in 3 words:\nLong text."


# -- structured output --------------------------------------------------------------------


async def test_structured_output_through_final_result_with_a_retry():
    model = ScriptedModel(
        [
            reply(
                tool_call(
                    FINAL_RESULT_TOOL,
                    {"claim": "sky is green", "verdict": "maybe", "confidence": 2},
                )
            ),
            reply(
                tool_call(
                    FINAL_RESULT_TOOL,
                    {"claim": "sky is green", "verdict": "false", "confidence": 0.9},
                )
            ),
        ]
    )
    worker = WorkerAgent(
        "fact_check", instructions="Check the claim.", model=model, output_type=Verdict
    )
    result = await worker.run_detailed("The sky is green.")
    assert result.output == Verdict(claim="sky is green", verdict="false", confidence=0.9)
    assert result.steps == 2
    # the tool schema is the output model
    spec = next(t for t in model.requests[0].tools if t.name == FINAL_RESULT_TOOL)
    assert set(spec.input_schema["properties"]) == {"claim", "verdict", "confidence"}
    # the validation error went back to the model as the tool result
    [error] = tool_results(model.requests[1])
    assert error.is_error and "verdict" in error.output and "confidence" in error.output


async def test_plain_text_answer_is_nudged_to_final_result():
    model = ScriptedModel(
        [
            reply("I think it is false."),
            reply(
                tool_call(FINAL_RESULT_TOOL, {"claim": "c", "verdict": "false", "confidence": 0.5})
            ),
        ]
    )
    worker = WorkerAgent("fc", instructions="Check.", model=model, output_type=Verdict)
    assert (await worker.run("c")).verdict == "false"
    assert "final_result" in last_user_text(model.requests[1])


async def test_invalid_output_until_max_steps_raises():
    bad = reply(tool_call(FINAL_RESULT_TOOL, {"claim": "c", "verdict": "nope", "confidence": 0}))
    model = ScriptedModel([bad], loop=True)
    worker = WorkerAgent("fc", instructions="Check.", model=model, output_type=Verdict, max_steps=3)
    with pytest.raises(WorkerOutputError, match="within 3 steps.*verdict"):
        await worker.run("c")
    assert len(model.requests) == 3


async def test_bad_input_is_rejected_before_any_model_call():
    model = ScriptedModel([reply("never")])
    worker = WorkerAgent("s", instructions="S.", model=model, input_type=Article)
    with pytest.raises(WorkerInputError, match="max_words"):
        await worker.run({"text": "x", "max_words": -1})
    with pytest.raises(WorkerInputError, match="text"):
        await worker.run({"max_words": 3})
    text_worker = WorkerAgent("t", instructions="T.", model=model)
    with pytest.raises(WorkerInputError, match="string"):
        await text_worker.run(42)
    with pytest.raises(WorkerInputError, match="empty"):
        await text_worker.run("   ")
    assert model.requests == []


async def test_worker_uses_its_own_tools():
    calls = []

    @tool
    def count_words(text: str) -> int:
        """Count words."""
        calls.append(text)
        return len(text.split())

    def step(req: ModelRequest, i: int):
        if i == 0:
            return reply(tool_call("count_words", {"text": last_user_text(req)}))
        [result] = tool_results(req)
        return reply(tool_call(FINAL_RESULT_TOOL, {"summary": "short", "words": result.output}))

    worker = WorkerAgent(
        "sum",
        instructions="Summarize.",
        model=FunctionModel(step),
        tools=[count_words],
        output_type=Summary,
    )
    assert await worker.run("one two three") == Summary(summary="short", words=3)
    assert calls == ["one two three"]


# -- as a tool ----------------------------------------------------------------------------


async def test_blocking_tool_of_a_think_with_trace_in_the_parent_store(store):
    inner = FunctionModel(
        lambda req, i: reply(tool_call(FINAL_RESULT_TOOL, {"summary": "tiny", "words": 1}))
    )
    worker = WorkerAgent(
        "summarize",
        instructions="Summarize.",
        model=inner,
        input_type=Article,
        output_type=Summary,
        persist=True,
    )
    parent_model = ScriptedModel(
        [
            reply(tool_call("summarize", {"text": "a b c", "max_words": 1}, id="call_s")),
            reply("Summary: tiny"),
        ]
    )
    agent = Think(store, model=parent_model)
    result = await agent.chat("summarize it", tools={"summarize": worker.as_tool()})
    assert result.status == "completed" and result.text == "Summary: tiny"
    [out] = tool_results(parent_model.requests[1])
    assert out.output == {"summary": "tiny", "words": 1} and not out.is_error
    # the worker saw only its input, not the parent's conversation
    assert "summarize it" not in request_text(inner.requests[0])
    # observability: its own ephemeral session, correlated with the parent call
    visible = agent.get_sessions()
    traces = [s for s in agent.get_sessions(include_ephemeral=True) if s not in visible]
    [trace] = traces
    assert trace.metadata["parent_run_id"] == result.run_id
    assert trace.metadata["parent_tool_call_id"] == "call_s"
    assert trace.metadata["status"] == "completed"
    assert trace.parent_session_id == result.session_id
    roles = [m["role"] for m in store.get_history(trace.id)]
    assert roles == ["user", "assistant"]
    parts = store.get_history(trace.id)[-1]["parts"]
    assert any(p.get("toolName") == FINAL_RESULT_TOOL for p in parts)


async def test_worker_calls_another_worker_as_a_tool():
    translate = WorkerAgent(
        "translate", instructions="To French.", model=FunctionModel(lambda r, i: "bonjour")
    )

    def outer_step(req: ModelRequest, i: int):
        if i == 0:
            return reply(tool_call("translate", {"input": "hello"}))
        return reply(f"translated: {tool_results(req)[0].output}")

    outer = WorkerAgent(
        "greeter", instructions="Greet.", model=FunctionModel(outer_step), tools=[translate]
    )
    assert await outer.run("greet") == "translated: bonjour"


async def test_async_tool_with_check_job_and_push(store):
    gate = asyncio.Event()

    async def slow(req: ModelRequest, i: int):
        await gate.wait()
        return reply(f"report on {last_user_text(req)}")

    worker = WorkerAgent("research", instructions="Research.", model=FunctionModel(slow))

    def parent_step(req: ModelRequest, i: int):
        if i == 0:
            return reply(tool_call("research", {"input": "tides"}, id="c1"))
        if i == 1:
            started = tool_results(req)[-1].output
            assert started["status"] == "running"  # returned before the job finished
            gate.set()
            return reply(tool_call("check_job", {"job_id": started["job_id"], "wait_seconds": 5}))
        return reply(f"done: {tool_results(req)[-1].output['result']}")

    agent = Think(store, model=FunctionModel(parent_step))
    registry = JobRegistry.for_agent(agent)
    pushed = []
    registry.subscribe(lambda job: pushed.append((job.id, job.status)))
    result = await agent.chat("look into tides", tools=worker.job_tools())
    assert result.text == "done: report on tides"
    assert pushed == [("job-c1", "running"), ("job-c1", "completed")]
    # persisted in the agent's database: a new registry on it sees the result
    again = JobRegistry(store.stores().jobs())
    assert again.get("job-c1").result == "report on tides"


async def test_job_registry_interrupts_jobs_of_a_dead_incarnation(tmp_path):
    stores = open_stores(tmp_path / "jobs.duckdb")
    registry = JobRegistry(stores.jobs())

    async def forever(signal):
        await asyncio.sleep(60)

    registry.start(forever, kind="test", job_id="j1")
    await asyncio.sleep(0)
    # no aclose: the process "died"; the next incarnation finds the row running
    fresh = JobRegistry(stores.jobs())
    assert fresh.interrupted == 1 and fresh.get("j1").status == "interrupted"
    await registry.aclose()
    stores.close()


async def test_job_cancel_and_failure():
    registry = JobRegistry()

    async def forever(signal):
        await signal.wait()
        raise AbortError(signal.reason)

    async def broken(signal):
        raise ValueError("boom")

    registry.start(forever, job_id="a")
    registry.start(broken, job_id="b")
    assert registry.cancel("a", "user said stop")
    assert (await registry.wait("a", 1)).status == "cancelled"
    failed = await registry.wait("b", 1)
    assert failed.status == "failed" and "boom" in failed.error
    tool_ = check_job_tool(registry)
    assert tool_.name == "check_job"


# -- cancellation and timeout -------------------------------------------------------------


async def test_aborting_the_parent_aborts_the_worker(store):
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def hang(req: ModelRequest, i: int):
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return reply("late")

    worker = WorkerAgent("slow", instructions="Slow.", model=FunctionModel(hang))
    parent = Think(
        store, model=ScriptedModel([reply(tool_call("slow", {"input": "x"}, id="c")), "after"])
    )
    run = parent.start_chat("go", tools={"slow": worker.as_tool()})
    await asyncio.wait_for(started.wait(), 5)
    parent.abort(reason="user stop")
    result = await asyncio.wait_for(run.task, 30)
    assert result.status == "aborted"
    # the worker's model call was cancelled, not left to sleep its 30 s out
    await asyncio.wait_for(cancelled.wait(), 30)
    [part] = [p for p in result.message["parts"] if p.get("type") == "dynamic-tool"]
    assert part["state"] == "output-error" and "aborted" in part["errorText"]


async def test_signal_aborts_a_direct_run():
    model = ScriptedModel([reply("a", pause(30), "b")])
    worker = WorkerAgent("w", instructions="W.", model=model)
    controller = AbortController()
    task = asyncio.ensure_future(worker.run("x", signal=controller.signal))
    await asyncio.sleep(0.05)
    controller.abort("stop")
    with pytest.raises(AbortError, match="stop"):
        await asyncio.wait_for(task, 2)


async def test_timeout(tmp_path):
    model = ScriptedModel([reply("a", pause(30), "b")])
    # The timeout counts from the run's start: 0.2 s was sometimes spent before "a" was
    # streamed while four xdist workers loaded both cores (the run then recorded an
    # empty text part, truthfully, and the check below failed). 2 s leaves room.
    worker = WorkerAgent("w", instructions="W.", model=model, timeout=2.0)
    store = DuckDBSessionStore(tmp_path / "trace.duckdb")
    # the model pauses 30 s between "a" and "b": the 2 s timeout ends the run there
    with pytest.raises(WorkerTimeoutError, match="timed out"):
        await worker.run("x", session_store=store)
    [trace] = store.list_sessions(include_ephemeral=True)
    assert trace.metadata["status"] == "timeout"
    # the partial output was recorded, truthfully
    [_, assistant] = store.get_history(trace.id)
    assert assistant["parts"][-1]["text"] == "a"
    store.close()


# -- direct invocation --------------------------------------------------------------------


def test_direct_invocation_with_asyncio_run():
    worker = WorkerAgent(
        "fc",
        instructions="Check.",
        model=lambda: ScriptedModel(
            [
                reply(
                    tool_call(FINAL_RESULT_TOOL, {"claim": "c", "verdict": "true", "confidence": 1})
                )
            ]
        ),
        output_type=Verdict,
    )
    assert asyncio.run(worker.run("c")).verdict == "true"
    assert asyncio.run(worker.run("c")).verdict == "true"  # a fresh model per call


def test_bad_configuration_is_refused():
    model = ScriptedModel()
    with pytest.raises(ValueError, match="invalid worker name"):
        WorkerAgent("has space", instructions="x", model=model)
    with pytest.raises(TypeError, match="output_type"):
        WorkerAgent("w", instructions="x", model=model, output_type=dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mode"):
        WorkerAgent("w", instructions="x", model=model).as_tool("later")  # type: ignore[arg-type]


def test_a_worker_without_a_model_is_refused_at_construction():
    from thinkray.runtime.errors import ModelNotConfiguredError, UserError

    with pytest.raises(ModelNotConfiguredError, match="worker 'w' has no model") as caught:
        WorkerAgent("w", instructions="Do it.", model=None)  # type: ignore[arg-type]
    assert isinstance(caught.value, UserError)


def test_a_think_without_a_model_says_how_to_give_it_one(tmp_path):
    from thinkray.runtime.agents.think import Think
    from thinkray.runtime.errors import ModelNotConfiguredError

    agent = Think(tmp_path / "a.duckdb")
    with pytest.raises(ModelNotConfiguredError, match="Think has no model"):
        agent.get_model()
