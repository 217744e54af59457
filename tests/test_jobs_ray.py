"""The job half of the remote API (issue 12, item 5; seed 003 §4.2) through an actor
handle: a job's progress and its cancellation, by ``get_job`` / ``list_jobs`` /
``cancel_job`` on an agent hosted in a session actor."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import BaseModel
from thinkray.runtime.agents.think import Think
from thinkray.runtime.agents.worker import JobContext, async_tool, check_job_tool
from thinkray.runtime.models.base import Model, ModelRequest
from thinkray.runtime.models.testing import FunctionModel, reply, tool_call
from thinkray.runtime.tools.base import Tool

pytestmark = pytest.mark.ray


class Topic(BaseModel):
    topic: str


async def _research(input: Topic, job: JobContext) -> str:
    job.report_progress(0.25, f"reading about {input.topic}")
    reason = await job.signal.wait()  # runs until cancelled
    return f"stopped: {reason}"


def _step(req: ModelRequest, i: int) -> Any:
    if i == 0:
        return reply(tool_call("research", {"topic": "tides"}, id="r1"))
    return reply("started")


class JobHostAgent(Think):
    """Starts a research job that runs until it is cancelled (actor tests)."""

    def get_model(self) -> Model:
        return FunctionModel(_step, model_id="job-host")

    def get_tools(self) -> dict[str, Tool]:
        research = async_tool("research", Topic, _research, "Research in the background.")
        return {"research": research, "check_job": check_job_tool()}


def test_job_progress_and_cancel_through_a_handle(namespace_factory):
    # by its package path, so the actor's worker process imports the same module
    from tests.test_jobs_ray import JobHostAgent as Host

    ns = namespace_factory(Host)
    agent = ns.get("host")
    assert agent.chat.remote("research tides").result().text == "started"
    assert agent.get_tool_call.remote("r1").result()["result"]["job_id"] == "job-r1"
    deadline = time.monotonic() + 30  # a bound, not a timing assertion
    job = agent.get_job.remote("job-r1").result()
    while job["progress"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
        job = agent.get_job.remote("job-r1").result()
    assert (job["status"], job["progress"], job["message"]) == (
        "running",
        0.25,
        "reading about tides",
    )
    assert job["parent"]["tool_call_id"] == "r1"
    job = agent.cancel_job.remote("job-r1", "enough").result()
    assert (job["status"], job["error"]) == ("cancelled", "enough")
    listed = agent.list_jobs.remote("cancelled").result()
    assert [j["job_id"] for j in listed] == ["job-r1"] and listed[0]["late"] is None
