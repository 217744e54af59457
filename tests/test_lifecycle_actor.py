"""The session model of issue 5 is reachable on a session actor: branch, rewind,
threads, compaction and permission approvals through an AgentHandle."""

from __future__ import annotations

import time

import pytest

from tests.helpers import text_of

pytestmark = pytest.mark.ray


@pytest.fixture
def agent(namespace_factory):
    from thinkray.actors.demo import SessionAgent

    ns = namespace_factory(SessionAgent, agent_kwargs={"context_window": 2_000})
    return ns, ns.get("lifecycle")


def test_branch_rewind_and_threads_over_the_actor(agent):
    ns, handle = agent
    for i in range(3):
        handle.chat(f"turn {i}")
    sid = handle.invoke("get_current_session_id")
    history = handle.history()
    branch = handle.invoke("branch", sid, history[1]["id"], {"ephemeral": True})
    assert branch.parent_session_id == sid
    assert [text_of(m) for m in handle.history(branch.id)] == ["turn 0", "echo: turn 0"]
    assert handle.invoke("get_sessions") and all(
        s.id != branch.id for s in handle.invoke("get_sessions")
    )  # ephemeral branches are hidden from listings
    rewound = handle.invoke("rewind", sid, history[2]["id"])
    assert len(rewound.hidden_ids) == 3
    handle.chat()  # answer the rewound history again
    assert [text_of(m) for m in handle.history()][-2:] == ["turn 1", "echo: turn 1"]
    assert ns.hibernate("lifecycle")  # all of it is in the file
    assert len(handle.history()) == 4
    thread = handle.invoke("thread", "side-topic")
    assert thread.thread_key == "side-topic"
    assert [t.thread_key for t in handle.invoke("list_threads")] == ["side-topic"]


def test_compaction_and_approvals_over_the_actor(agent):
    _, handle = agent
    for i in range(4):  # 400 input tokens a step against a 2,000-token window
        handle.chat(f"fill {i}")
    sid = handle.invoke("get_current_session_id")
    result = handle.invoke("compact", sid)
    assert result is not None
    parts = [p for m in handle.history() for p in m["parts"] if p["type"] == "data-compaction"]
    assert parts and parts[0]["data"]["summary"].startswith("Goal:")
    handle.invoke("add_session_rule", {"tool": "get_weather", "action": "ask"}, sid)
    run = handle.start_chat("weather in Lima")
    deadline = time.monotonic() + 10
    pending = []
    while not pending and time.monotonic() < deadline:
        pending = handle.invoke("pending_approvals", sid)
        time.sleep(0.05)
    assert pending and pending[0]["tool_name"] == "get_weather"
    handle.invoke("answer_approval", pending[0]["approval_id"], "once")
    done = handle.wait_run(run["run_id"])
    assert done is None or done["status"] == "completed"
    tool = [p for p in handle.history()[-1]["parts"] if p["type"] == "dynamic-tool"][0]
    assert tool["state"] == "output-available" and tool["output"]["city"] == "Lima"
