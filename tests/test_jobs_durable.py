"""Async tools on the durable model (issue 12, item 5; seed 003 §1.5 and §4.2): the
call that starts a job is a completed ledger row linked to the job row; jobs report
progress (row, status tool, remote ``get_job``/``list_jobs``, ``data-job-progress``
chunks into the session's running turn); jobs are cancelled by the remote
``cancel_job`` and the model's ``cancel_job`` tool; a result after cancellation
follows ``late_tool_results`` and is never pushed; a wake marks the dead
incarnation's jobs ``interrupted`` and push listeners report it. In process, on the
shipped test models."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel
from thinkray.runtime.abort import AbortController, AbortError
from thinkray.runtime.agents.persistent import PersistentAgent, inbox_notifier
from thinkray.runtime.agents.think import Think
from thinkray.runtime.agents.worker import (
    JOB_PROGRESS_CHUNK,
    JobContext,
    JobRegistry,
    WorkerAgent,
    async_tool,
    cancel_job_tool,
    check_job_tool,
    current_job,
)
from thinkray.runtime.errors import InvalidArgumentError, UnknownJobError
from thinkray.runtime.models.base import ModelRequest
from thinkray.runtime.models.testing import FunctionModel, ScriptedModel, reply, tool_call
from thinkray.storage.records import JobRecord

SAFETY = 10.0  # a bound on waits so a broken build fails instead of hanging (no timing)


class Task(BaseModel):
    topic: str


class Gates:
    """What a test job does, step by step, on the test's say-so."""

    def __init__(self) -> None:
        self.report = asyncio.Event()
        self.release = asyncio.Event()
        self.ended = asyncio.Event()
        self.saw_abort: list[str] = []
        self.ignore_abort = False

    async def work(self, input: Task, job: JobContext) -> Any:
        try:
            await asyncio.wait_for(self.report.wait(), SAFETY)
            job.report_progress(0.5, f"halfway through {input.topic}")
            if self.ignore_abort:
                await asyncio.wait_for(self.release.wait(), SAFETY)
                self.saw_abort.append(job.signal.reason or "")
                return {"report": f"late news on {input.topic}"}
            await asyncio.wait_for(
                asyncio.wait(
                    [
                        asyncio.ensure_future(self.release.wait()),
                        asyncio.ensure_future(job.signal.wait()),
                    ],
                    return_when=asyncio.FIRST_COMPLETED,
                ),
                SAFETY,
            )
            if job.signal.aborted:
                self.saw_abort.append(job.signal.reason or "")
                raise AbortError(job.signal.reason or "aborted")
            return {"report": f"all about {input.topic}"}
        finally:
            self.ended.set()


class JobAgent(Think):
    pass


class StoringJobAgent(Think):
    late_tool_results = "store"


def tools_for(gates: Gates, **kw: Any) -> dict[str, Any]:
    research = async_tool("research", Task, gates.work, "Research a topic in the background.", **kw)
    check = check_job_tool()
    cancel = cancel_job_tool()
    return {t.name: t for t in (research, check, cancel)}


def with_tools(agent: Think, tools: dict[str, Any]) -> Think:
    agent.get_tools = lambda: tools  # type: ignore[method-assign]
    return agent


class Events:
    def __init__(self, wanted: str | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.wanted = wanted
        self.seen = asyncio.Event()

    def on_event(self, chunk: dict[str, Any]) -> None:
        self.events.append(chunk)
        if chunk["type"] == self.wanted:
            self.seen.set()

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [c for c in self.events if c["type"] == kind]


# -- (a) the tool call and the job ---------------------------------------------------------


async def test_the_starting_call_is_a_completed_ledger_row_linked_to_the_job(store):
    gates = Gates()
    model = ScriptedModel(
        [
            reply(tool_call("research", {"topic": "tides"}, id="c1")),
            reply("started"),
            reply(tool_call("research", {"topic": "moons"}, id="c1")),  # ids repeat
            reply("started again"),
        ]
    )
    agent = with_tools(JobAgent(store, model=model), tools_for(gates))
    first = await agent.chat("research tides")
    assert first.status == "completed"
    call = agent.get_tool_call("c1")
    # completed at once, with the job id, while the job still runs
    assert call["status"] == "completed" and call["result"]["job_id"] == "job-c1"
    job = agent.get_job("job-c1")
    assert job is not None and job["status"] == "running" and job["kind"] == "research"
    assert job["parent"]["tool_call_id"] == "c1" and job["parent"]["tool_call_row"] == "c1"
    assert job["parent"]["run_id"] == call["run_id"] == first.run_id
    assert job["parent"]["session_id"] == first.session_id
    assert job["input"] == {"topic": "tides"}

    # a scripted model's repeated id in a new run: its own ledger row, its own job
    second = await agent.chat("research moons")
    row = f"c1~{second.run_id}"
    again = agent.get_tool_call(row)
    assert again["status"] == "completed" and again["result"]["job_id"] == f"job-{row}"
    other = agent.get_job(f"job-{row}")
    assert other["parent"]["tool_call_row"] == row and other["input"] == {"topic": "moons"}
    assert [j["job_id"] for j in agent.list_jobs("running")] == ["job-c1", f"job-{row}"]
    for jid in ("job-c1", f"job-{row}"):
        agent.cancel_job(jid, "test over")
    gates.report.set()


async def test_a_worker_async_tool_links_its_job_to_the_ledger_row(store):
    worker = WorkerAgent("w", instructions="W.", model=FunctionModel(lambda r, i: "42"))

    def step(req: ModelRequest, i: int):
        return reply(tool_call("w", {"input": "x"}, id="wc")) if i == 0 else reply("ok")

    agent = JobAgent(store, model=FunctionModel(step))
    result = await agent.chat("go", tools=worker.job_tools())
    registry = JobRegistry.for_agent(agent)
    done = await registry.wait("job-wc", SAFETY)
    assert done.status == "completed" and done.result == "42"
    assert agent.get_tool_call("wc")["result"]["job_id"] == "job-wc"
    assert done.parent["tool_call_row"] == "wc" and done.parent["run_id"] == result.run_id
    assert set(worker.job_tools()) == {"w", "check_job", "cancel_job"}


# -- (b) progress ---------------------------------------------------------------------------


async def test_progress_is_stored_polled_and_streamed_into_the_running_turn(store):
    gates = Gates()
    stream = Events(wanted=JOB_PROGRESS_CHUNK)
    checked: list[dict[str, Any]] = []

    async def step(req: ModelRequest, i: int):
        if i == 0:
            return reply(tool_call("research", {"topic": "tides"}, id="c1"))
        if i == 1:
            return reply("started")
        if i == 2:  # the second turn, in the same session: the job reports meanwhile
            gates.report.set()
            await asyncio.wait_for(stream.seen.wait(), SAFETY)
            return reply(tool_call("check_job", {"job_id": "job-c1"}, id="k1"))
        checked.append(req.messages[-1].content[0].output)  # type: ignore[union-attr]
        return reply("halfway, it says")

    agent = with_tools(JobAgent(store, model=FunctionModel(step)), tools_for(gates))
    first = await agent.chat("research tides")
    second = await agent.chat("how far along?", stream, session_id=first.session_id)
    assert second.status == "completed"

    chunk = stream.of(JOB_PROGRESS_CHUNK)[0]
    assert chunk["id"] == "job-c1" and chunk["transient"] is True
    data = chunk["data"]
    assert (data["jobId"], data["status"], data["progress"]) == ("job-c1", "running", 0.5)
    assert data["message"] == "halfway through tides" and data["toolCallId"] == "c1"
    assert data["runId"] == first.run_id
    # transient: on the stream, never a part of the stored message
    assert all(p["type"] != JOB_PROGRESS_CHUNK for p in second.message["parts"])
    # the status tool and the remote API read it from the row
    assert checked[0]["status"] == "running" and checked[0]["progress"] == 0.5
    assert checked[0]["progress_message"] == "halfway through tides"
    job = agent.get_job("job-c1")
    assert (job["progress"], job["message"]) == (0.5, "halfway through tides")
    assert agent.list_jobs()[0]["progress"] == 0.5
    again = store.stores().jobs().get("job-c1")  # durable
    assert again is not None and again.progress == 0.5

    gates.release.set()
    done = await JobRegistry.for_agent(agent).wait("job-c1", SAFETY)
    assert done.status == "completed" and done.result == {"report": "all about tides"}
    assert done.progress == 0.5  # the last report is kept


async def test_progress_outside_a_turn_and_bad_reports():
    registry = JobRegistry()
    heard: list[tuple[str, Any]] = []
    registry.subscribe(lambda rec: heard.append((rec.status, rec.progress)), progress=True)
    go = asyncio.Event()

    async def work(signal: Any) -> str:
        job = current_job()
        assert job is not None
        with pytest.raises(InvalidArgumentError):
            job.report_progress(1.5)
        with pytest.raises(InvalidArgumentError):
            job.report_progress("most")  # type: ignore[arg-type]
        assert job.report_progress({"pages": 3, "of": 4}, "reading")
        await asyncio.wait_for(go.wait(), SAFETY)
        return "ok"

    registry.start(work, job_id="j")
    await asyncio.sleep(0)
    assert registry.get("j").progress == {"pages": 3, "of": 4}  # type: ignore[union-attr]
    go.set()
    await registry.wait("j", SAFETY)
    assert not registry.report_progress("j", 0.9)  # finished: nothing written
    assert registry.get("j").progress == {"pages": 3, "of": 4}  # type: ignore[union-attr]
    assert heard == [
        ("running", None),
        ("running", {"pages": 3, "of": 4}),
        ("completed", {"pages": 3, "of": 4}),
    ]


# -- (c) cancellation -----------------------------------------------------------------------


async def test_the_model_cancels_a_job_with_its_tool(store):
    gates = Gates()
    outputs: list[Any] = []

    def step(req: ModelRequest, i: int):
        if i == 0:
            return reply(tool_call("research", {"topic": "tides"}, id="c1"))
        if i == 1:
            return reply(
                tool_call("cancel_job", {"job_id": "job-c1", "reason": "not needed"}, id="x1")
            )
        outputs.append(req.messages[-1].content[0].output)  # type: ignore[union-attr]
        return reply("cancelled it")

    agent = with_tools(JobAgent(store, model=FunctionModel(step)), tools_for(gates))
    assert (await agent.chat("research tides, then never mind")).status == "completed"
    assert outputs[0] == {"job_id": "job-c1", "status": "cancelled", "cancelled": True}
    job = agent.get_job("job-c1")
    assert (job["status"], job["error"]) == ("cancelled", "not needed")
    gates.report.set()
    await asyncio.wait_for(gates.ended.wait(), SAFETY)
    assert gates.saw_abort == ["not needed"]  # the work's abort signal fired
    assert agent.get_job("job-c1")["status"] == "cancelled"
    assert not JobRegistry.for_agent(agent).has_running()


@pytest.mark.parametrize("agent_cls", [JobAgent, StoringJobAgent])
async def test_a_result_after_cancellation_is_never_pushed(store, agent_cls):
    gates = Gates()
    gates.ignore_abort = True  # the work finishes anyway
    model = ScriptedModel([reply(tool_call("research", {"topic": "tides"}, id="c1")), reply("ok")])
    agent = with_tools(agent_cls(store, model=model), tools_for(gates))
    pushed: list[tuple[str, str]] = []
    JobRegistry.for_agent(agent).subscribe(lambda rec: pushed.append((rec.id, rec.status)))
    await agent.chat("research tides")

    job = agent.cancel_job("job-c1", "user changed their mind")
    assert (job["status"], job["error"]) == ("cancelled", "user changed their mind")
    assert agent.cancel_job("job-c1", "again")["error"] == "user changed their mind"
    with pytest.raises(UnknownJobError):
        agent.cancel_job("no-such-job")
    gates.report.set()  # a progress report after cancellation is dropped
    gates.release.set()
    await asyncio.wait_for(gates.ended.wait(), SAFETY)
    await asyncio.sleep(0)
    assert gates.saw_abort == ["user changed their mind"]

    job = agent.get_job("job-c1")
    assert (job["status"], job["result"], job["progress"]) == ("cancelled", None, None)
    stored = store.stores().jobs().get("job-c1")
    assert stored is not None and stored.status == "cancelled" and stored.result is None
    if agent_cls is StoringJobAgent:
        assert job["late"]["result"] == {"report": "late news on tides"}
        assert stored.late is not None and stored.late["result"] == job["late"]["result"]
    else:
        assert job["late"] is None and stored.late is None
    # listeners (the push path) heard the start and the cancellation, never the result
    assert pushed == [("job-c1", "running"), ("job-c1", "cancelled")]


async def test_aborting_the_turn_cancels_a_job_only_when_the_tool_follows_it(store):
    for follow in (False, True):
        gates = Gates()
        started = asyncio.Event()

        async def step(
            req: ModelRequest, i: int, started: asyncio.Event = started, follow: bool = follow
        ):
            if i == 0:
                return reply(tool_call("research", {"topic": "tides"}, id=f"c-{follow}"))
            started.set()
            await asyncio.sleep(SAFETY)  # aborted before this ends
            return reply("never")

        agent = with_tools(
            JobAgent(store, model=FunctionModel(step)), tools_for(gates, follow_parent=follow)
        )
        controller = AbortController()
        turn = asyncio.ensure_future(agent.chat("go", signal=controller.signal))
        await asyncio.wait_for(started.wait(), SAFETY)
        controller.abort("user pressed stop")
        assert (await turn).status == "aborted"
        job = agent.get_job(f"job-c-{follow}")
        if follow:
            assert job["status"] == "cancelled" and job["error"]  # the turn's abort
        else:
            assert job["status"] == "running"  # the job outlives the turn
            agent.cancel_job(job["job_id"])
        gates.report.set()
        await asyncio.wait_for(gates.ended.wait(), SAFETY)


# -- (d) wake -------------------------------------------------------------------------------


async def test_a_wake_interrupts_running_jobs_and_listeners_hear_it(store):
    store.stores().jobs().insert(
        JobRecord(id="job-old", status="running", kind="research", parent={"tool_call_id": "c0"})
    )
    agent = JobAgent(store, model=ScriptedModel([reply("hi")]))
    await agent.on_wake()  # the wake opens the registry: not left running until first use
    assert store.stores().jobs().get("job-old").status == "interrupted"  # type: ignore[union-attr]
    assert agent.get_job("job-old")["status"] == "interrupted"
    heard: list[tuple[str, str]] = []
    JobRegistry.for_agent(agent).subscribe(lambda rec: heard.append((rec.id, rec.status)))
    assert heard == [("job-old", "interrupted")]  # replayed: its outcome is reported


class Notified(PersistentAgent):
    """Pushes finished jobs (and jobs a crash interrupted) into its own inbox."""

    def on_start(self) -> None:
        super().on_start()
        JobRegistry.for_agent(self).subscribe(inbox_notifier(self))


async def test_an_interrupted_job_is_reported_into_the_conversation(tmp_path):
    from thinkray.storage.session_store import DuckDBSessionStore

    path = tmp_path / "a.duckdb"
    seed = DuckDBSessionStore(str(path))
    seed.stores().jobs().insert(JobRecord(id="job-old", status="running", kind="research"))
    seed.close()

    def step(req: ModelRequest, i: int):
        text = req.messages[-1].content[0].text  # type: ignore[union-attr]
        return reply(f"noted: {text}")

    agent = Notified(path, model=FunctionModel(step), name="a")
    await agent.on_wake()
    answer = await agent.wait_reply("job-done-job-old", SAFETY)
    assert answer.startswith("noted: [job job-old interrupted] interrupted:")
    await agent.dispose()
